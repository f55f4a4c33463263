"""The replica bounds the operator sends running agents (etj_contract.replicas): what parses, what not."""

from __future__ import annotations

from typing import Any

import pytest

from etj_contract.replicas import Replicas, replicas_url

BODIES: dict[str, tuple[Any, Replicas | None]] = {
    "a scale to 4": ({"min": 1, "max": 4}, Replicas(1, 4)),
    "min equal to max": ({"min": 2, "max": 2}, Replicas(2, 2)),
    "min above max": ({"min": 3, "max": 2}, None),
    "no workers at all": ({"min": 0, "max": 2}, None),
    "a bool is not a count": ({"min": True, "max": 2}, None),
    "a string is not a count": ({"min": "1", "max": 4}, None),
    "a missing bound": ({"max": 4}, None),
    "not an object": ([1, 4], None),
}


@pytest.mark.parametrize("case", list(BODIES), ids=list(BODIES))
def test_from_json(case: str) -> None:
    raw, expected = BODIES[case]
    assert Replicas.from_json(raw) == expected


def test_the_replicas_endpoint_is_next_to_the_progress_endpoint() -> None:
    assert replicas_url("http://10.0.0.7:29401/progress") == "http://10.0.0.7:29401/replicas"
    assert replicas_url("http://store.ns.svc:29401") == "http://store.ns.svc:29401/replicas"

"""The replica bounds the operator sends running agents (etj_contract.replicas): what parses, what not."""

from __future__ import annotations

from typing import Any

import pytest

from etj_contract.replicas import STORE_KEY, Replicas, read

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


STORED: dict[str, tuple[bytes, Replicas | None]] = {
    "as the store server writes it": (b"1:4", Replicas(1, 4)),
    "garbage": (b"four", None),
    "out of order": (b"4:1", None),
}


@pytest.mark.parametrize("case", list(STORED), ids=list(STORED))
def test_decode(case: str) -> None:
    raw, expected = STORED[case]
    assert Replicas.decode(raw) == expected
    if expected is not None:
        assert Replicas.decode(expected.encode()) == expected


class _Store:
    def __init__(self, values: dict[str, bytes]) -> None:
        self.values = values

    def check(self, keys: list[str]) -> bool:
        return all(k in self.values for k in keys)

    def get(self, key: str) -> bytes:
        return self.values[key]


def test_read_says_nothing_until_the_operator_has() -> None:
    assert read(_Store({})) is None
    assert read(_Store({STORE_KEY: b"2:6"})) == Replicas(2, 6)

"""Waiting for CRDs: a CRD whose status has no conditions yet is not Established (and no error)."""

from __future__ import annotations

from typing import Any

import pytest

from etj_testbed.localcluster.crds import established, wait_established


def _crd(*conditions: dict[str, str]) -> dict[str, Any]:
    return {"kind": "CustomResourceDefinition", "status": {"conditions": list(conditions)}}


EST = {"type": "Established", "status": "True"}
NAMES = {"type": "NamesAccepted", "status": "True"}


@pytest.mark.parametrize(
    ("name", "doc", "want"),
    [
        # regression: `kubectl wait --for=condition=Established` failed on this instead of waiting
        ("just created: no status at all", {"kind": "CustomResourceDefinition"}, False),
        ("just created: status without conditions", {"status": {"conditions": None}}, False),
        ("names accepted, not yet established", _crd(NAMES), False),
        ("established", _crd(NAMES, EST), True),
        ("a list, every item established", {"items": [_crd(EST), _crd(EST, NAMES)]}, True),
        ("a list with one item not yet", {"items": [_crd(EST), {"status": {}}]}, False),
        ("an empty list: nothing is served yet", {"items": []}, False),
    ],
)
def test_established(name: str, doc: dict[str, Any], want: bool) -> None:
    assert established(doc) is want, name


def test_wait_polls_through_missing_conditions() -> None:
    replies = iter(
        [
            '{"status": {}}',
            '{"status": {"conditions": null}}',
            '{"items": [{"status": {"conditions": [{"type": "Established", "status": "True"}]}}]}',
        ]
    )
    calls: list[tuple[str, ...]] = []

    def kubectl(*args: str) -> str:
        calls.append(args)
        return next(replies)

    wait_established(kubectl, "crd", timeout=30)
    assert calls == [("get", "crd", "-o", "json")] * 3

"""The pure part of refusing a foreign object (issue 37 item 5; the apiserver part is
tests/integration/test_foreign_objects.py): whose object it is, and the condition reason it becomes."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from etj_operator.decide.objects.names import owner_reference
from etj_operator.decide.status.conditions import ConditionReason, rejection_reason
from etj_operator.k8s.client import ForeignObject, foreign_owners
from etj_operator.k8s.rejections import rejections

OURS = {"ownerReferences": [owner_reference("j", "uid-1")]}
OWNERS: dict[str, tuple[dict[str, Any], list[str] | None]] = {
    # name: (the existing object's metadata, foreign_owners: None = ours, else who owns it)
    "owned by the job": (OURS, None),
    "owned by the job among others": (
        {"ownerReferences": [{"kind": "Thing", "name": "t", "uid": "x"}, owner_reference("j", "uid-1")]},
        None,
    ),
    "no owner": ({}, []),
    "a job of the same name before (another uid)": (
        {"ownerReferences": [owner_reference("j", "uid-0")]},
        ["ElasticTrainingJob/j"],
    ),
    "owned by something else": (
        {"ownerReferences": [{"kind": "Deployment", "name": "d", "uid": "x"}]},
        ["Deployment/d"],
    ),
}


@pytest.mark.parametrize("case", OWNERS)
def test_whose_object(case: str) -> None:
    found, expected = OWNERS[case]
    assert foreign_owners(OURS, found) == expected


def test_a_foreign_object_is_a_rejection_named_object_conflict() -> None:
    foreign = ForeignObject("NetworkPolicy", "ns", "j-etj", ["Deployment/d"])
    rejection, errors = rejections([None, foreign, RuntimeError("boom")])
    assert rejection == (
        "ObjectConflict: NetworkPolicy ns/j-etj exists, owned by Deployment/d, not by this job: the job's "
        "pods wait until it is deleted (the operator does not adopt or change it)"
    )
    assert [str(e) for e in errors] == ["boom"]
    assert rejection_reason(rejection) == ConditionReason.OBJECT_CONFLICT
    quota = ApiException(status=403, reason="Forbidden")
    refused, _ = rejections([quota])
    assert refused is not None and rejection_reason(refused) == ConditionReason.FAILED_CREATE

"""Failures the operator must make visible, on the real apiserver (issue 15): a pod create the apiserver
refuses (here a ResourceQuota) becomes a condition and a Warning Event, and status keeps being written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.integration.opbed import Bed, OperatorProcess
from tests.plugins.cluster import Cluster

pytestmark = pytest.mark.cluster


@pytest.fixture
def bed(cluster: Cluster, namespace: str) -> Iterator[Bed]:
    b = Bed(cluster, namespace)
    yield b
    b.cleanup()


@pytest.fixture
def operator(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log").start()
    yield op
    op.stop()
    print(op.logs())  # captured: pytest shows it only when the test failed


def _condition(bed: Bed, job: str, type_: str) -> dict[str, Any]:
    return next((c for c in bed.status(job).get("conditions", []) if c["type"] == type_), {})


def _quota(bed: Bed, gpus: int) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}},
    }
    try:
        bed.core.create_namespaced_resource_quota(bed.ns, body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        bed.core.patch_namespaced_resource_quota("gpus", bed.ns, {"spec": body["spec"]})

    def counted() -> bool:
        # The quota admission refuses every pod until the quota controller has filled in status.
        st: Any = bed.core.read_namespaced_resource_quota("gpus", bed.ns).status
        return bool(st and st.hard and st.hard.get("requests.nvidia.com/gpu") == str(gpus))

    bed.wait("the quota to be counted", counted)


def test_a_quota_refusal_is_a_condition_and_an_event_and_status_is_still_written(
    bed: Bed, operator: OperatorProcess
) -> None:
    for i in range(3):
        bed.node(f"spot-{i}", "spot")
    bed.node("od-0", "on-demand", gpus=0)
    _quota(bed, gpus=1)
    bed.create_job("quota", max_workers=3)
    try:
        bed.wait(
            "ReplicaFailure=True/FailedCreate",
            lambda: _condition(bed, "quota", "ReplicaFailure").get("status") == "True",
            90,
        )
    except AssertionError:
        print(operator.logs())
        raise
    cond = _condition(bed, "quota", "ReplicaFailure")
    assert cond["reason"] == "FailedCreate" and "exceeded quota" in cond["message"], cond
    # The refusal does not stop the rest of the status: one worker fits the quota and is counted.
    bed.wait("one worker running", lambda: bed.status("quota").get("workers") == "1/3", 60)
    assert _condition(bed, "quota", "Ready")["status"] == "True"
    bed.wait(
        "a FailedCreate Warning Event naming the quota",
        lambda: any(
            e.type == "Warning" and e.reason == "FailedCreate" and "exceeded quota" in (e.message or "")
            for e in bed.events("quota")
        ),
    )
    # Room in the quota: the missing workers are created and the condition clears.
    _quota(bed, gpus=3)
    bed.wait("3 workers", lambda: bed.status("quota").get("workers") == "3/3", 90)
    bed.wait(
        "ReplicaFailure=False",
        lambda: _condition(bed, "quota", "ReplicaFailure").get("status") == "False",
        60,
    )

"""Many jobs, one spot pool, on the real apiserver and kube-scheduler (kwok nodes): every job gets its
replicas.min before any job gets more than its min (decide/plan/sharing.py, docs/operator.md).

Workers beyond a job's min run at a PriorityClass below every job's that never preempts; the scheduler's
own preemption then takes a full pool's extras back for a later job's min workers.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.integration.opbed import Bed, OperatorProcess
from tests.plugins.cluster import Cluster

pytestmark = pytest.mark.cluster

SPOT_SLOTS = 4
EXTRA_VALUE = -10  # below the default priority (0) of pods without a class: the jobs' min workers


@pytest.fixture
def extra_class(cluster: Cluster, namespace: str) -> Iterator[str]:
    """The elastic-extra PriorityClass (the chart's sharing.extraPriorityClass), named for this test:
    PriorityClasses are cluster-scoped and the control plane is shared."""
    name = f"{namespace}-extra"[:63]
    api = client.SchedulingV1Api(cluster.api_client())
    body = client.V1PriorityClass(
        metadata=client.V1ObjectMeta(name=name), value=EXTRA_VALUE, preemption_policy="Never"
    )
    api.create_priority_class(body)
    yield name
    with contextlib.suppress(client.ApiException):
        api.delete_priority_class(name)


def _live(bed: Bed, job: str) -> list[Any]:
    return [p for p in bed.pods(job) if not p.metadata.deletion_timestamp]


def _running(bed: Bed, job: str) -> list[Any]:
    return [p for p in _live(bed, job) if p.status.phase == "Running" and p.spec.node_name]


def _at(bed: Bed, job: str, n: int) -> bool:
    return len(_running(bed, job)) == n and bed.status(job).get("currentReplicas") == n


def test_a_later_jobs_min_preempts_an_earlier_jobs_extras(
    bed: Bed, cluster: Cluster, extra_class: str, tmp_path: Path
) -> None:
    for i in range(SPOT_SLOTS):
        bed.node(f"spot-{i}", "spot")
    bed.node("od-0", "on-demand", gpus=0)  # the stores
    op = OperatorProcess(
        cluster.kubeconfig, bed.ns, tmp_path / "operator.log", "--extra-priority-class", extra_class
    ).start()
    try:
        # A takes the whole pool: 1 min worker, 3 extras. No failure may count (maxFailures 0), and it
        # counts interruptions: a preemption must be neither.
        policy = {"maxFailures": 0, "countInterruptions": True}
        bed.create_job("a", min_workers=1, max_workers=SPOT_SLOTS, failurePolicy=policy)
        bed.wait("a at its max", lambda: _at(bed, "a", SPOT_SLOTS), 120)
        a_pods = _running(bed, "a")
        assert sorted(p.spec.priority for p in a_pods) == [EXTRA_VALUE] * 3 + [0]
        a_min = next(p.metadata.uid for p in a_pods if p.spec.priority == 0)

        # B (min 2) comes later into a full pool: its min workers preempt two of A's extras.
        sent = time.monotonic()
        bed.create_job("b", min_workers=2, max_workers=2)
        bed.wait("b at its min", lambda: _at(bed, "b", 2), 120)
        b_seconds = time.monotonic() - sent
        bed.wait("a shrunk to the rest of the pool", lambda: _at(bed, "a", SPOT_SLOTS - 2), 60)
        # A's replacements are asked for again as extras: pending, they preempt nothing.
        bed.wait(
            "a's replacements pending as extras",
            lambda: sum(1 for p in _live(bed, "a") if p.status.phase == "Pending") == 2,
            60,
        )
    except AssertionError:
        print(op.logs())
        raise
    finally:
        op.stop()
    a_running = _running(bed, "a")
    assert a_min in {p.metadata.uid for p in a_running}, "A's min worker was never touched"
    assert all(p.spec.priority == EXTRA_VALUE for p in _live(bed, "a") if p.status.phase == "Pending")
    assert [p.spec.priority for p in _running(bed, "b")] == [0, 0]
    a_status = bed.status("a")
    assert (a_status.get("failures") or 0) == 0 and a_status["phase"] in ("Running", "Resizing"), a_status
    reasons = [r.get("reason") for r in a_status.get("resizeHistory", [])]
    print(f"b reached its min of 2 by preempting a's extras in {b_seconds:.1f} s; a's resizes: {reasons}")

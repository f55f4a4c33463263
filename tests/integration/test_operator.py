"""The operator against the real control plane (apiserver, scheduler, controller-manager) and kwok nodes.

Only convergence is asserted, with wait-with-timeout polling; no test asserts how fast anything was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.opbed import Bed, OperatorProcess
from tests.plugins.cluster import Cluster

pytestmark = pytest.mark.cluster


def _worker_nodes(bed: Bed, job: str) -> dict[str, str]:
    return {p.metadata.name: p.spec.node_name for p in bed.running_workers(job)}


def _reaches(bed: Bed, job: str, n: int, op: OperatorProcess, timeout: float = 90) -> None:
    try:
        bed.wait(
            f"{job} at {n} running workers",
            lambda: len(bed.running_workers(job)) == n and bed.status(job).get("currentReplicas") == n,
            timeout,
        )
    except AssertionError:
        print(op.logs())
        raise


def test_job_reaches_max_with_store_on_demand(bed: Bed, operator: OperatorProcess) -> None:
    spot = [bed.node(f"spot-{i}", "spot") for i in range(3)]
    od = bed.node("od-0", "on-demand", gpus=0)
    bed.create_job("scale", max_workers=3)
    _reaches(bed, "scale", 3, operator)
    assert set(_worker_nodes(bed, "scale").values()) == set(spot)
    bed.wait(
        "store running", lambda: any(p.status.phase == "Running" for p in bed.pods("scale", "rendezvous"))
    )
    store = bed.pods("scale", "rendezvous")
    assert len(store) == 1 and store[0].spec.node_name == od
    svc: Any = bed.core.read_namespaced_service("scale-rdzv", bed.ns)
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses is True
    bed.wait(
        "Ready condition",
        lambda: any(
            c["type"] == "Ready" and c["status"] == "True" for c in bed.status("scale").get("conditions", [])
        ),
    )
    st = bed.status("scale")
    assert st["phase"] == "Running" and st["desiredReplicas"] == 3 and st["workers"] == "3/3"


def test_spot_interruption_drains_records_reason_and_capacity_returns(
    bed: Bed, operator: OperatorProcess
) -> None:
    for i in range(3):
        bed.node(f"spot-{i}", "spot")
    bed.node("od-0", "on-demand", gpus=0)
    bed.create_job("spot", max_workers=3)
    _reaches(bed, "spot", 3, operator)

    victim_pod, victim_node = sorted(_worker_nodes(bed, "spot").items())[1]
    bed.taint(victim_node, "aws-node-termination-handler/spot-itn")

    def drained() -> bool:
        pods = {p.metadata.name: p for p in bed.pods("spot")}
        pod = pods.get(victim_pod)
        return pod is None or pod.metadata.deletion_timestamp is not None or pod.spec.node_name != victim_node

    bed.wait("interrupted worker drained", drained, 30)
    bed.wait(
        "resize recorded with its reason",
        lambda: any(
            r.get("reason") == "SpotInterruption" and r.get("from") == 3 and r.get("to") == 2
            for r in bed.status("spot").get("resizeHistory", [])
        ),
        30,
    )
    bed.wait("resize Event", lambda: any(e.reason == "SpotInterruption" for e in bed.events("spot")), 30)
    assert bed.status("spot")["phase"] != "Failed"

    # The replacement stays Pending (no room), which is what would ask an autoscaler for a node...
    bed.wait("replacement pending", lambda: any(p.status.phase == "Pending" for p in bed.pods("spot")), 30)
    # ...and new spot capacity brings the job back to max.
    fresh = bed.node("spot-new", "spot")
    _reaches(bed, "spot", 3, operator)
    assert fresh in _worker_nodes(bed, "spot").values()
    assert any(r.get("reason") == "CapacityAdded" for r in bed.status("spot")["resizeHistory"])


def test_deleting_the_job_removes_everything(bed: Bed, operator: OperatorProcess) -> None:
    for i in range(2):
        bed.node(f"spot-{i}", "spot")
    bed.node("od-0", "on-demand", gpus=0)
    bed.create_job("gone", max_workers=2)
    _reaches(bed, "gone", 2, operator)
    bed.wait("service", lambda: bool(bed.core.list_namespaced_service(bed.ns).items))
    bed.cluster.kubectl("delete", "elastictrainingjob", "gone", "-n", bed.ns, "--wait=true", timeout=60)
    bed.wait(
        "pods garbage-collected", lambda: not bed.pods("gone") and not bed.pods("gone", "rendezvous"), 90
    )
    bed.wait("service garbage-collected", lambda: not bed.core.list_namespaced_service(bed.ns).items, 90)


def test_restart_mid_resize_leaves_one_pod_per_worker(
    bed: Bed, cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    for i in range(4):
        bed.node(f"spot-{i}", "spot")
    bed.node("od-0", "on-demand", gpus=0)
    first = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "op1.log").start()
    try:
        bed.create_job("restart", max_workers=4)
        _reaches(bed, "restart", 4, first)
        victims = sorted(set(_worker_nodes(bed, "restart").values()))[:2]
        for node in victims:
            bed.taint(node, "karpenter.sh/disrupted")
        # Crash it while it reacts to the interruption (no graceful shutdown at all).
        bed.wait(
            "a drain started",
            lambda: (
                any(p.metadata.deletion_timestamp or p.status.phase == "Pending" for p in bed.pods("restart"))
                or len(bed.pods("restart")) < 4
            ),
            30,
        )
    finally:
        first.kill()
    second = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "op2.log").start()
    try:
        for i in range(2):
            bed.node(f"spot-extra-{i}", "spot")

        # Converged: four live workers, all running, none left on an interrupted node, status agrees.
        # (Polling only "4 running" could pass before the new operator has even started.)
        def converged() -> bool:
            live = [p for p in bed.pods("restart") if not p.metadata.deletion_timestamp]
            running = [p for p in live if p.status.phase == "Running"]
            return (
                len(live) == len(running) == 4
                and not set(victims) & {p.spec.node_name for p in running}
                and bed.status("restart").get("currentReplicas") == 4
            )

        try:
            bed.wait("converged after the restart", converged, 90)
        except AssertionError:
            print(second.logs())
            raise
        pods = [p for p in bed.pods("restart") if not p.metadata.deletion_timestamp]
        slots = [p.metadata.labels["etj.dev/slot"] for p in pods]
        assert len(pods) == 4 and len(set(slots)) == 4, slots
        assert len(bed.pods("restart", "rendezvous")) == 1
        assert bed.status("restart").get("phase") in ("Running", "Resizing")
    finally:
        second.stop()


@pytest.mark.parametrize("signal", ["cordon", "node-deleted", "karpenter-disrupted"])
def test_other_interruption_signals_drain_the_worker(
    bed: Bed, operator: OperatorProcess, signal: str
) -> None:
    for i in range(2):
        bed.node(f"spot-{i}", "spot")
    bed.node("od-0", "on-demand", gpus=0)
    bed.create_job("sig", max_workers=2)
    _reaches(bed, "sig", 2, operator)
    victim_pod, victim_node = sorted(_worker_nodes(bed, "sig").items())[0]
    if signal == "cordon":
        bed.core.patch_node(victim_node, {"spec": {"unschedulable": True}})
        reason = "NodeCordoned"
    elif signal == "node-deleted":
        bed.core.delete_node(victim_node)
        reason = "NodeDeleted"
    else:
        bed.taint(victim_node, "karpenter.sh/disrupted")
        reason = "NodeDisrupted"

    def gone() -> bool:
        pod = next((p for p in bed.pods("sig") if p.metadata.name == victim_pod), None)
        return pod is None or pod.metadata.deletion_timestamp is not None or pod.spec.node_name != victim_node

    bed.wait(f"worker drained after {signal}", gone, 30)
    bed.wait(
        f"{reason} recorded",
        lambda: any(r.get("reason") == reason for r in bed.status("sig").get("resizeHistory", [])),
        30,
    )


def test_suspend_stops_everything_and_resume_restarts(bed: Bed, operator: OperatorProcess) -> None:
    for i in range(2):
        bed.node(f"spot-{i}", "spot")
    bed.node("od-0", "on-demand", gpus=0)
    bed.create_job("pause", max_workers=2)
    _reaches(bed, "pause", 2, operator)
    patch = {"spec": {"suspend": True}}
    bed.custom.patch_namespaced_custom_object(
        "etj.dev", "v1alpha1", bed.ns, "elastictrainingjobs", "pause", patch
    )
    bed.wait(
        "all pods gone", lambda: not [p for p in bed.pods("pause") if not p.metadata.deletion_timestamp], 30
    )
    bed.wait("Suspended phase", lambda: bed.status("pause").get("phase") == "Suspended", 30)
    patch = {"spec": {"suspend": False}}
    bed.custom.patch_namespaced_custom_object(
        "etj.dev", "v1alpha1", bed.ns, "elastictrainingjobs", "pause", patch
    )
    _reaches(bed, "pause", 2, operator)


def test_store_lost_with_its_node_is_replaced_at_once_under_a_fresh_name(
    bed: Bed, operator: OperatorProcess
) -> None:
    """The store's node disappears: its pod would stay Terminating (no kubelet will confirm), and a store
    under the same name would wait for it; the operator removes it and starts a fresh one at once."""
    bed.node("spot-0", "spot")
    od = [bed.node(f"od-{i}", "on-demand", gpus=0) for i in range(2)]
    bed.create_job("lost", max_workers=1)
    _reaches(bed, "lost", 1, operator)
    bed.wait(
        "store running", lambda: any(p.status.phase == "Running" for p in bed.pods("lost", "rendezvous"))
    )
    (old,) = bed.pods("lost", "rendezvous")
    assert old.spec.node_name in od
    bed.core.delete_node(old.spec.node_name)

    def replaced() -> bool:
        pods = {p.metadata.name: p for p in bed.pods("lost", "rendezvous")}
        fresh = [p for n, p in pods.items() if n != old.metadata.name]
        return old.metadata.name not in pods and any(p.status.phase == "Running" for p in fresh)

    bed.wait("old store removed and a fresh one running", replaced, 60)
    (new,) = bed.pods("lost", "rendezvous")
    assert new.spec.node_name in od and new.spec.node_name != old.spec.node_name
    st = bed.status("lost")
    assert st["phase"] == "Running" and not st.get("failures"), st

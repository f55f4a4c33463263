"""The store moves instead of blocking node maintenance, against the real apiserver (issue 26).

`kubectl drain` cordons the node, then evicts its pods; the store's PodDisruptionBudget refuses the
store's eviction. Before, the operator left the store on a merely cordoned node, so the drain waited until
someone deleted the store by hand (an EKS managed node group upgrade fails after 15 minutes of that). Now
the cordon moves the store: the drain completes, a new store runs on another node, no failure is counted
and the workers stay.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.integration.opbed import Bed, OperatorProcess
from tests.plugins.cluster import Cluster

pytestmark = pytest.mark.cluster


def _running_store(bed: Bed, job: str) -> Any | None:
    live = [
        p
        for p in bed.pods(job, "rendezvous")
        if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    ]
    return live[0] if len(live) == 1 else None


def test_kubectl_drain_of_the_store_node_completes(
    bed: Bed, cluster: Cluster, operator: OperatorProcess
) -> None:
    for i in range(2):
        bed.node(f"gpu-{i}", "spot")
    first = bed.node("cpu-0", "on-demand", gpus=0)  # the store's node: workers need a GPU
    bed.create_job("moved", max_workers=2)
    bed.wait(
        "two workers and the store running",
        lambda: len(bed.running_workers("moved")) == 2 and _running_store(bed, "moved") is not None,
        90,
    )
    store = _running_store(bed, "moved")
    assert store is not None and store.spec.node_name == first
    workers = {p.metadata.name for p in bed.running_workers("moved")}
    # The PodDisruptionBudget must be in force (and counted by the disruption controller) before the drain,
    # or the eviction would simply succeed and prove nothing.
    policy = client.PolicyV1Api(cluster.api_client())

    def budget_in_force() -> bool:
        pdbs = policy.list_namespaced_pod_disruption_budget(bed.ns).items
        return any(
            b.status and (b.status.observed_generation or 0) >= 1 and not b.status.disruptions_allowed
            for b in pdbs
        )

    bed.wait("the store's PodDisruptionBudget in force", budget_in_force, 60)
    second = bed.node("cpu-1", "on-demand", gpus=0)  # somewhere to go

    drain = cluster.kubectl(
        "drain",
        first,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=45s",
        check=False,
        timeout=180,
    )
    print("drain:", drain.returncode, drain.stdout[-2000:], drain.stderr[-2000:])
    # 45 s: the move takes one reconcile (seconds); without it the drain would wait for the store's node to
    # be lost some other way (kwok's nodes go NotReady on a loaded machine after a minute or two).
    assert drain.returncode == 0, drain.stderr  # without the move: "Cannot evict pod ... disruption budget"

    def moved() -> bool:
        now = _running_store(bed, "moved")
        return now is not None and now.spec.node_name == second and now.metadata.name != store.metadata.name

    bed.wait("the store running on the other node", moved, 60)
    assert {p.metadata.name for p in bed.running_workers("moved")} == workers
    assert not (bed.status("moved").get("failures") or 0)
    reasons = {e.reason for e in bed.events("moved")}
    print("events:", reasons)

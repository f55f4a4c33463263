"""The store moves instead of blocking node maintenance, against the real apiserver (issue 26).

`kubectl drain` cordons the node, then evicts its pods; the store's PodDisruptionBudget refuses the
store's eviction. Before, the operator left the store on a merely cordoned node, so the drain waited until
someone deleted the store by hand (an EKS managed node group upgrade fails after 15 minutes of that). Now
the cordon moves the store, make before break (item 5): the replacement starts outside the Service, and
only once it is Ready the Service selects it and the old store is deleted, which lets the drain's eviction
through. The drain completes, no failure is counted and the workers stay.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch

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


class StoreEvents:
    """Every change of the job's store pods, in the apiserver's order (one watch: resourceVersion order),
    as (pod, Ready and Running, being deleted or gone)."""

    def __init__(self, bed: Bed, job: str) -> None:
        self.seen: list[tuple[str, bool, bool]] = []
        self.watch = watch.Watch()
        self.core = client.CoreV1Api(bed.cluster.api_client())
        self.args = (bed.ns, f"etj.dev/job={job},etj.dev/role=rendezvous")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        ns, sel = self.args
        with contextlib.suppress(urllib3.exceptions.ProtocolError):  # stop() ends the stream mid-chunk
            self._read(ns, sel)

    def _read(self, ns: str, sel: str) -> None:
        for ev in self.watch.stream(
            self.core.list_namespaced_pod, ns, label_selector=sel, timeout_seconds=300
        ):
            pod = ev["object"]
            ready = pod.status.phase == "Running" and any(
                c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
            )
            gone = ev["type"] == "DELETED" or pod.metadata.deletion_timestamp is not None
            self.seen.append((pod.metadata.name, ready, gone))

    def stop(self) -> None:
        self.watch.stop()

    def first(self, name: str, *, ready: bool = False, gone: bool = False) -> int | None:
        return next(
            (
                i
                for i, (n, r, g) in enumerate(self.seen)
                if n == name and (r or not ready) and (g or not gone)
            ),
            None,
        )


def _selected_ips(bed: Bed, job: str) -> set[str]:
    """The addresses the store Service's name resolves to (its Endpoints: what a headless name returns)."""
    try:
        ep = bed.core.read_namespaced_endpoints(f"{job}-rdzv", bed.ns)
    except client.ApiException:
        return set()
    subsets = ep.subsets or []
    return {a.ip for s in subsets for a in [*(s.addresses or []), *(s.not_ready_addresses or [])]}


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
    bed.wait(
        "the Service resolving to the store", lambda: _selected_ips(bed, "moved") == {store.status.pod_ip}, 30
    )
    second = bed.node("cpu-1", "on-demand", gpus=0)  # somewhere to go
    events = StoreEvents(bed, "moved")
    bed.wait("the store watch started", lambda: events.first(store.metadata.name) is not None, 30)

    started = time.monotonic()
    drain = cluster.kubectl(
        "drain",
        first,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=45s",
        check=False,
        timeout=180,
    )
    print(
        f"drain: {time.monotonic() - started:.1f} s",
        drain.returncode,
        drain.stdout[-2000:],
        drain.stderr[-2000:],
    )
    # 45 s: the move takes one reconcile (seconds); without it the drain would wait for the store's node to
    # be lost some other way (kwok's nodes go NotReady on a loaded machine after a minute or two).
    assert drain.returncode == 0, drain.stderr  # without the move: "Cannot evict pod ... disruption budget"

    def moved() -> bool:
        now = _running_store(bed, "moved")
        return now is not None and now.spec.node_name == second and now.metadata.name != store.metadata.name

    bed.wait("the store running on the other node", moved, 60)
    new = _running_store(bed, "moved")
    assert new is not None
    bed.wait(
        "the old store's deletion seen", lambda: events.first(store.metadata.name, gone=True) is not None, 30
    )
    events.stop()
    print("store pod changes:", events.seen)
    # Make before break: the replacement was Running and Ready before the old store was deleted or evicted.
    ready_at = events.first(new.metadata.name, ready=True)
    gone_at = events.first(store.metadata.name, gone=True)
    assert ready_at is not None and gone_at is not None and ready_at < gone_at, events.seen
    # The Service now resolves to the new store only (it selects its index).
    bed.wait(
        "the Service resolving to the new store",
        lambda: _selected_ips(bed, "moved") == {new.status.pod_ip},
        30,
    )
    svc = bed.core.read_namespaced_service("moved-rdzv", bed.ns)
    assert svc.spec.selector["etj.dev/store"] == new.metadata.labels["etj.dev/store"]
    assert {p.metadata.name for p in bed.running_workers("moved")} == workers
    assert not (bed.status("moved").get("failures") or 0)
    reasons = {e.reason for e in bed.events("moved")}
    print("events:", reasons)
    assert {"StoreMoving", "StoreMoved"} <= reasons

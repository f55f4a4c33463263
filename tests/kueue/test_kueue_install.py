"""Kueue v0.17.0, built from its module and run against the bed's control plane, admits plain batch/v1 Jobs.

The end-to-end proof of the installation (docs/kueue.md): CRDs served, webhooks reachable over the locally
issued certificate (the Job is suspended on creation by Kueue's mutating webhook), the scheduler admits a
Workload into a ClusterQueue whose two ResourceFlavors select the bed's spot and on-demand nodes by their
capacity-type label, unsuspends the Job with the flavor's node labels injected, and keeps a Job over quota
pending (QuotaReserved=False, reason Pending) until quota is freed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.integration.opbed import TEST_LABEL, Bed
from tests.kueue.conftest import Kueue

pytestmark = pytest.mark.cluster

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
CAPACITY_LABEL = "karpenter.sh/capacity-type"  # what the bed's karpenter-style nodes carry (opbed.make_node)
GPU = "nvidia.com/gpu"


@pytest.fixture
def bed(kueue: Kueue, kueue_namespace: str) -> Iterator[Bed]:
    b = Bed(kueue.cluster, kueue_namespace)
    yield b
    b.cleanup()


def flavor_body(name: str, capacity: str, ns: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {
            "nodeLabels": {CAPACITY_LABEL: capacity, TEST_LABEL: ns},
            "tolerations": [{"key": TEST_LABEL, "operator": "Equal", "value": ns, "effect": "NoSchedule"}],
        },
    }


def cluster_queue_body(name: str, ns: str, flavors: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceGroups": [
                {
                    "coveredResources": [GPU],
                    "flavors": [
                        {"name": flavor, "resources": [{"name": GPU, "nominalQuota": quota}]}
                        for flavor, quota in flavors.items()
                    ],
                }
            ],
        },
    }


def gpu_job(name: str, queue: str, gpus: int, node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """A plain Job of `gpus` pods of one GPU each, in `queue`; kwok runs its pods and completes them (a
    selector no node matches keeps them Pending, holding the quota once admitted)."""
    container = {
        "name": "main",
        "image": "registry.invalid/none:0",
        "resources": {"requests": {GPU: "1"}, "limits": {GPU: "1"}},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "parallelism": gpus,
            "completions": gpus,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "nodeSelector": dict(node_selector or {}),
                }
            },
        },
    }


def test_kueue_admits_a_job_and_keeps_one_over_quota_pending(kueue: Kueue, bed: Bed) -> None:
    ns, cluster = bed.ns, kueue.cluster
    api = cluster.api_client()
    batch, custom = client.BatchV1Api(api), client.CustomObjectsApi(api)
    spot_nodes = {bed.node("spot-0", "spot"), bed.node("spot-1", "spot")}
    bed.node("od-0", "on-demand")  # capacity exists: the over-quota Job is short of quota, not of nodes
    spot, on_demand, cq = f"spot-{ns}", f"on-demand-{ns}", f"cq-{ns}"
    created: list[tuple[str, str]] = []

    def create_cluster_scoped(plural: str, body: dict[str, Any]) -> None:
        custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
        created.append((plural, body["metadata"]["name"]))

    def workload(job: str) -> dict[str, Any] | None:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, "workloads")["items"]
        for wl in items:
            if any(ref.get("name") == job for ref in wl["metadata"].get("ownerReferences") or []):
                return dict(wl)
        return None

    def condition(job: str, type_: str) -> dict[str, Any]:
        wl = workload(job) or {}
        return next((c for c in (wl.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})

    def admitted(job: str) -> bool:
        return condition(job, "Admitted").get("status") == "True"

    def suspended(job: str) -> bool:
        return bool(batch.read_namespaced_job(job, ns).spec.suspend)

    try:
        create_cluster_scoped("resourceflavors", flavor_body(spot, "spot", ns))
        create_cluster_scoped("resourceflavors", flavor_body(on_demand, "on-demand", ns))
        create_cluster_scoped("clusterqueues", cluster_queue_body(cq, ns, {spot: 2, on_demand: 1}))
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            ns,
            "localqueues",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "LocalQueue",
                "metadata": {"name": "lq"},
                "spec": {"clusterQueue": cq},
            },
        )

        def active() -> bool:
            status = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", cq).get("status") or {}
            return any(c["type"] == "Active" and c["status"] == "True" for c in status.get("conditions", []))

        cluster.wait_for("the ClusterQueue to be Active", active, timeout=30)

        # 1. Suspended at creation by Kueue's webhook (the manifest does not ask for it), then admitted on
        #    the spot flavor (first in the ClusterQueue) and unsuspended with its node labels injected.
        started = time.monotonic()
        first = batch.create_namespaced_job(ns, gpu_job("first", "lq", gpus=2))
        assert first.spec.suspend is True, "Kueue's mutating webhook did not suspend the Job"
        cluster.wait_for("the first Job's Workload to be Admitted", lambda: admitted("first"), timeout=60)
        cluster.wait_for("the first Job to be unsuspended", lambda: not suspended("first"), timeout=30)
        admitted_s = time.monotonic() - started
        assignment = (workload("first") or {})["status"]["admission"]["podSetAssignments"][0]
        assert assignment["flavors"] == {GPU: spot}
        template = batch.read_namespaced_job("first", ns).spec.template.spec
        assert template.node_selector[CAPACITY_LABEL] == "spot"
        cluster.wait_for(
            "the first Job to complete on kwok's spot nodes",
            lambda: (batch.read_namespaced_job("first", ns).status.succeeded or 0) == 2,
            timeout=60,
        )
        pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector="job-name=first").items
        assert {p.spec.node_name for p in pods} <= spot_nodes
        cluster.wait_for("the first Workload to be Finished", lambda: bool(condition("first", "Finished")))

        # 2. A Job that holds all spot quota (its pods select no node, so it never finishes), and a second
        #    one that fits neither flavor while it does: that one stays suspended, its Workload Pending.
        batch.create_namespaced_job(
            ns, gpu_job("holder", "lq", gpus=2, node_selector={"etj.dev/nowhere": "x"})
        )
        cluster.wait_for("the holder to be admitted", lambda: admitted("holder"), timeout=60)
        batch.create_namespaced_job(ns, gpu_job("over", "lq", gpus=2))
        cluster.wait_for(
            "the over-quota Workload's QuotaReserved=False",
            lambda: condition("over", "QuotaReserved").get("status") == "False",
            timeout=60,
        )
        pending = condition("over", "QuotaReserved")
        assert pending["reason"] == "Pending", pending
        # "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor X, ..."
        assert "insufficient quota" in pending["message"] and on_demand in pending["message"], pending
        time.sleep(2)  # still pending a moment later: not a race with the scheduler's first pass
        assert suspended("over") and not admitted("over")

        # 3. Freeing the quota admits it.
        batch.delete_namespaced_job("holder", ns, propagation_policy="Background")
        cluster.wait_for("the over-quota Job to be admitted once quota frees", lambda: admitted("over"), 60)
        cluster.wait_for("the over-quota Job to be unsuspended", lambda: not suspended("over"), timeout=30)
        print(f"kueue: ready in {kueue.start_s:.1f}s; first Job admitted, unsuspended in {admitted_s:.1f}s")
        print(f"kueue: the over-quota Job was pending with: {pending['message']}")
    finally:
        for job in ("first", "holder", "over"):
            with contextlib.suppress(client.ApiException):
                batch.delete_namespaced_job(job, ns, propagation_policy="Background")
        cluster.kubectl("delete", "localqueue", "lq", "-n", ns, "--wait=false", check=False)
        for plural, name in reversed(created):
            cluster.kubectl("delete", f"{plural}.{GROUP}", name, "--wait=false", check=False)

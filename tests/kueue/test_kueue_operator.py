"""The operator (``--kueue``) against a real Kueue v0.17.0 on the bed (docs/kueue.md, "How etj goes through
Kueue"): an etj job labelled ``kueue.x-k8s.io/queue-name`` is admitted through its own Workloads, and Kueue's
preemption shrinks it in place.

Workers are kwok pods on the test's spot nodes (they run without a container), the store a kwok pod on an
on-demand node; the ClusterQueue holds 3 GPUs of a spot flavor while the test has 4 spot nodes, so the
quota, not the nodes, says how many workers run. Each test fails without the feature it names: without
admission the job runs 4 workers at once (and before its queue exists), without the seat drain a preempting
Job never gets its quota (the extra's Workload is never released), without the base's stop the job keeps
its workers while evicted.
"""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from tests.integration.opbed import TEST_LABEL, Bed, OperatorProcess, job_manifest
from tests.kueue.conftest import Kueue
from tests.kueue.test_kueue_install import gpu_job

pytestmark = pytest.mark.cluster

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL, PRIORITY_LABEL = "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"
SEAT_LABEL = "etj.dev/kueue-seat"
GPU = "nvidia.com/gpu"
QUOTA = 3  # spot GPUs in the ClusterQueue; the test has one more spot node than that


class KueueBed:
    """One test's Kueue objects (cluster-scoped ones named after its namespace) and its polling helpers."""

    def __init__(self, bed: Bed) -> None:
        self.bed, self.ns = bed, bed.ns
        api = bed.cluster.api_client()
        self.custom, self.batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
        self.flavor, self.cq, self.high = f"spot-{self.ns}", f"cq-{self.ns}", f"high-{self.ns}"
        self.created: list[tuple[str, str]] = []

    def cluster_object(self, plural: str, body: dict[str, Any]) -> None:
        self.custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
        self.created.append((plural, body["metadata"]["name"]))

    def setup(self) -> None:
        """A spot flavor (the bed's karpenter label and the test's own node label and toleration), a
        ClusterQueue of QUOTA GPUs on it that preempts lower priorities, and a high WorkloadPriorityClass."""
        toleration = {"key": TEST_LABEL, "operator": "Equal", "value": self.ns, "effect": "NoSchedule"}
        self.cluster_object(
            "resourceflavors",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ResourceFlavor",
                "metadata": {"name": self.flavor},
                "spec": {
                    "nodeLabels": {"karpenter.sh/capacity-type": "spot", TEST_LABEL: self.ns},
                    "tolerations": [toleration],
                },
            },
        )
        flavor = {"name": self.flavor, "resources": [{"name": GPU, "nominalQuota": QUOTA}]}
        self.cluster_object(
            "clusterqueues",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ClusterQueue",
                "metadata": {"name": self.cq},
                "spec": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.ns}},
                    "preemption": {"withinClusterQueue": "LowerPriority"},
                    "resourceGroups": [{"coveredResources": [GPU], "flavors": [flavor]}],
                },
            },
        )
        self.cluster_object(
            "workloadpriorityclasses",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": self.high},
                "value": 1000,
            },
        )

    def job_at_quota(self, name: str) -> None:
        """The flavor, queues and priority class, then job ``name`` admitted and running at the quota."""
        self.setup()
        self.local_queue()
        self.etj(name)
        self.bed.wait(f"job {name} at the quota's {QUOTA} workers", lambda: self.at(name, QUOTA), 90)

    def local_queue(self) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "LocalQueue",
            "metadata": {"name": "lq"},
            "spec": {"clusterQueue": self.cq},
        }
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, "localqueues", body)

    def cleanup(self) -> None:
        for job in ("preemptor", "big"):
            with contextlib.suppress(client.ApiException):
                self.batch.delete_namespaced_job(job, self.ns, propagation_policy="Background")
        kubectl = self.bed.cluster.kubectl
        kubectl("delete", "elastictrainingjobs", "--all", "-n", self.ns, "--wait=false", check=False)
        kubectl("delete", "localqueue", "lq", "-n", self.ns, "--wait=false", check=False)
        for plural, name in reversed(self.created):
            kubectl("delete", f"{plural}.{GROUP}", name, "--wait=false", check=False)

    def etj(self, name: str, *, min_workers: int = 2, max_workers: int = 4, **spec: Any) -> None:
        body = job_manifest(
            name,
            self.ns,
            min_workers=min_workers,
            max_workers=max_workers,
            failurePolicy={"maxFailures": 0, "countInterruptions": True},  # a preemption must count as none
            **spec,
        )
        body["metadata"]["labels"] = {QUEUE_LABEL: "lq"}
        self.bed.custom.create_namespaced_custom_object(
            "etj.dev", "v1alpha1", self.ns, "elastictrainingjobs", body
        )

    def preemptor(self, name: str, gpus: int) -> None:
        """A high-priority batch/v1 Job of ``gpus`` one-GPU pods that select no node: admitted, it holds its
        quota for as long as it exists (its pods stay Pending), so the test decides when it frees."""
        body = gpu_job(name, "lq", gpus, {"etj.dev/nowhere": "x"})
        body["metadata"]["labels"][PRIORITY_LABEL] = self.high
        self.batch.create_namespaced_job(self.ns, cast(Any, body))

    def workloads(self) -> list[dict[str, Any]]:
        listed = cast(Any, self.custom.list_namespaced_custom_object(GROUP, VERSION, self.ns, "workloads"))
        return list(listed["items"])

    def admitted(self, owner: str) -> bool:
        for wl in self.workloads():
            if any(ref.get("name") == owner for ref in wl["metadata"].get("ownerReferences") or []):
                conds = (wl.get("status") or {}).get("conditions") or []
                return any(c["type"] == "Admitted" and c["status"] == "True" for c in conds)
        return False

    def workers(self, job: str) -> list[Any]:
        return [p for p in self.bed.pods(job) if not p.metadata.deletion_timestamp]

    def running(self, job: str) -> list[Any]:
        return [p for p in self.workers(job) if p.status.phase == "Running" and p.spec.node_name]

    def at(self, job: str, n: int) -> bool:
        return len(self.running(job)) == n and len(self.workers(job)) == n


@pytest.fixture
def kbed(kueue: Kueue, kueue_namespace: str, tmp_path: Path) -> Iterator[tuple[KueueBed, OperatorProcess]]:
    bed = Bed(kueue.cluster, kueue_namespace)
    for i in range(QUOTA + 1):
        bed.node(f"spot-{i}", "spot")
    bed.node("od-0", "on-demand", gpus=0)  # the store's
    kb = KueueBed(bed)
    with socket.socket() as free:  # the operator's metrics: _planned counts its reconciles there
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    log = tmp_path / "operator.log"
    op = OperatorProcess(
        kueue.cluster.kubeconfig, bed.ns, log, "--kueue", "--metrics-port", str(port)
    ).start()
    try:
        yield kb, op
    finally:
        op.stop()
        print(op.logs())
        kb.cleanup()
        bed.cleanup()


RECONCILES = "etj_operator_reconcile_duration_seconds_count"


def _reconciles(op: OperatorProcess) -> float:
    """How many job reconciles ``op``'s process has run (0 while its metrics server is not up yet)."""
    args = op.args
    port = next(args[i + 1] for i in range(len(args) - 2, -1, -1) if args[i] == "--metrics-port")  # last wins
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return 0.0
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(RECONCILES))


def _planned(op: OperatorProcess, bed: Bed, times: int = 2) -> None:
    """Wait until the operator has planned ``times`` more times: what it did not do by then it decided
    not to do (a check of absence that waits for the operator, not for a fixed time)."""
    start = _reconciles(op)
    bed.wait(f"the operator planning {times} more times", lambda: _reconciles(op) >= start + times, 60)


def test_a_queued_job_runs_no_pod_until_admitted_and_the_quota_decides_its_size(
    kbed: tuple[KueueBed, OperatorProcess],
) -> None:
    kb, op = kbed
    bed = kb.bed
    kb.setup()
    kb.etj("a")  # its LocalQueue does not exist yet: Kueue cannot admit it
    bed.wait(
        "the job's base Workload",
        lambda: any(w["metadata"]["name"] == "a-kueue-base" for w in kb.workloads()),
    )
    bed.wait("KueueAdmitted=False", lambda: bed.condition("a", "KueueAdmitted").get("status") == "False", 30)
    _planned(op, bed)
    assert bed.pods("a") == [] and bed.pods("a", "rendezvous") == [], "a pod before Kueue admitted the job"
    assert bed.condition("a", "KueueAdmitted")["reason"] == "Pending"
    started = time.monotonic()
    kb.local_queue()
    bed.wait("3 workers: min 2 and one extra, as the quota allows", lambda: kb.at("a", QUOTA), 90)
    admitted_s = time.monotonic() - started
    _planned(op, bed)  # and not 4, though a fourth spot node is free
    assert kb.at("a", QUOTA), [p.metadata.name for p in kb.workers("a")]
    seats = sorted(p.metadata.labels[SEAT_LABEL] for p in kb.running("a"))
    assert seats == ["a-kueue-base", "a-kueue-base", "a-kueue-x0"] or seats[:2] == ["a-kueue-base"] * 2, seats
    assert all(p.spec.node_selector.get("karpenter.sh/capacity-type") == "spot" for p in kb.running("a"))
    assert bed.condition("a", "KueueAdmitted")["status"] == "True"
    pending = [w for w in kb.workloads() if w["metadata"]["name"].startswith("a-kueue-x")]
    assert len(pending) == 2 and sum(kb_admitted(w) for w in pending) == 1, pending
    print(f"kueue: queue created -> job at {QUOTA} workers in {admitted_s:.1f} s")


def kb_admitted(wl: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Admitted" and c["status"] == "True"
        for c in (wl.get("status") or {}).get("conditions") or []
    )


def test_a_higher_priority_job_preempts_exactly_one_extra_which_leaves_in_place(
    kbed: tuple[KueueBed, OperatorProcess],
) -> None:
    kb, _ = kbed
    bed = kb.bed
    kb.job_at_quota("a")
    before = {p.metadata.name: p.metadata.uid for p in kb.running("a")}
    extra = next(p.metadata.name for p in kb.running("a") if p.metadata.labels[SEAT_LABEL] != "a-kueue-base")
    sent = time.monotonic()
    kb.preemptor("preemptor", gpus=1)
    bed.wait("the preemptor admitted", lambda: kb.admitted("preemptor"), 90)
    admitted_s = time.monotonic() - sent
    bed.wait("the job shrunk to 2", lambda: kb.at("a", 2), 60)
    after = {p.metadata.name: p.metadata.uid for p in kb.running("a")}
    assert extra not in after and all(before[n] == uid for n, uid in after.items()), (before, after)
    status = bed.status("a")
    assert (status.get("failures") or 0) == 0, status
    assert "KueuePreempted" in [r.get("reason") for r in status.get("resizeHistory") or []], status
    assert bed.condition("a", "KueueAdmitted")["status"] == "True"  # the base stays admitted
    kb.batch.delete_namespaced_job("preemptor", kb.ns, propagation_policy="Background")
    regrow = time.monotonic()
    bed.wait("the job grown back to 3 once the quota frees", lambda: kb.at("a", QUOTA), 90)
    print(
        f"kueue: preemptor admitted {admitted_s:.1f} s after it was created (the extra drained first); "
        f"grown back {time.monotonic() - regrow:.1f} s after it was deleted"
    )
    assert (bed.status("a").get("failures") or 0) == 0


def test_evicting_the_base_stops_the_job_and_it_comes_back_when_admitted_again(
    kbed: tuple[KueueBed, OperatorProcess],
) -> None:
    kb, op = kbed
    bed = kb.bed
    kb.job_at_quota("a")
    kb.preemptor("big", gpus=QUOTA)  # all of the quota: the base must go too
    # The stop is quick on kwok (its pods go at once), so KueueAdmitted may pass Evicted before a poll sees
    # it: the Warning Event (Kueue's reason) stays.
    bed.wait("the KueueEvicted Warning", lambda: bool(_evicted_warnings(bed, "a")), 60)
    bed.wait("every worker and the store released", lambda: not kb.workers("a") and not _live(bed, "a"), 60)
    bed.wait("the big Job admitted", lambda: kb.admitted("big"), 90)
    bed.wait(
        "the base queued again",
        lambda: (
            bed.condition("a", "KueueAdmitted").get("reason") == "Pending"
            and any(w["metadata"]["name"] == "a-kueue-base" for w in kb.workloads())
        ),
        60,
    )
    _planned(op, bed)
    assert not kb.workers("a"), "a worker while the job's base waits for quota"
    (warning,) = _evicted_warnings(bed, "a")
    assert "Preempted" in warning.message, warning.message
    history = [r.get("reason") for r in bed.status("a").get("resizeHistory") or []]
    assert "KueueEvicted" in history, history
    assert (bed.status("a").get("failures") or 0) == 0
    kb.batch.delete_namespaced_job("big", kb.ns, propagation_policy="Background")
    bed.wait("the job back at 3 workers", lambda: kb.at("a", QUOTA), 90)
    assert bed.condition("a", "KueueAdmitted")["status"] == "True"


def _evicted_warnings(bed: Bed, job: str) -> list[Any]:
    return [e for e in bed.events(job) if e.reason == "KueueEvicted" and e.type == "Warning"]


def _live(bed: Bed, job: str) -> list[Any]:
    return [p for p in bed.pods(job, "rendezvous") if not p.metadata.deletion_timestamp]


def test_a_restarted_operator_keeps_the_admitted_workers(kbed: tuple[KueueBed, OperatorProcess]) -> None:
    """kopf holds the job handlers until the Workload index has listed once (k8s/kueue_watch.py): a new
    operator that planned before seeing the job's Workloads would drain every worker as seatless."""
    kb, op = kbed
    bed = kb.bed
    kb.job_at_quota("a")
    before = {p.metadata.name: p.metadata.uid for p in kb.running("a")}
    op.stop()
    op.start()
    _planned(op, bed)  # the new operator's own plans, with the Workloads it listed first
    after = {p.metadata.name: p.metadata.uid for p in kb.running("a")}
    assert after == before and kb.at("a", QUOTA), (before, after)
    history = [r.get("reason") for r in bed.status("a").get("resizeHistory") or []]
    assert "KueuePreempted" not in history and "KueueQueued" not in history, history

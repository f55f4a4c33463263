"""Issue 39 on kind (the whole kind suite: `make e2e-kind`): a Kueue-managed etj job under a real Kueue, a
real kubelet and the real trainer, shrunk in place by Kueue's preemption and grown back when quota frees.

The `kueue` fixture runs `scripts/kind.sh kueue`: Kueue v0.17.0 in kueue-system (the image built offline
from the module, its own chart, its own webhook certificates) and the chart's operator again with
kueue.enabled. Kueue manages Jobs and Pods only in namespaces labelled etj.dev/kueue=enabled
(scripts/kind/kueue/values.yaml), so the test labels its own. Its ClusterQueue holds exactly two of the
job's workers (one GPU, 500m and 1Gi each, on a spot flavor: kind's spot workers, which advertise GPUs);
the job runs at 1..2 workers, its base Workload is `replicas.min` (1) and its one extra seat a Workload of
its own (docs/kueue.md). A batch/v1 Job at a higher WorkloadPriorityClass that needs one worker's worth
arrives: Kueue preempts the extra seat's Workload, the operator drains that worker (a graceful leave: the
survivor's pod is not restarted, no failure counted, `KueuePreempted` in the resize history), and the
Job's pod runs. The Job finishes when the test tells it to (a file in its container): its quota frees,
Kueue admits the extra seat again, and the job grows back to two by an in-place join. It must then
succeed with every sample trained exactly once per epoch.

Without the operator's Kueue support the job would run before and beyond its quota and the preemptor would
wait; without the seat drain the preemptor would never be admitted (the extra's quota never released).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from etj_testbed.localcluster.proclet.kube import MERGE
from tests.kind.conftest import kind_script
from tests.kind.kindbed import JSON, KindBed, RunningJob, exactly_once, kubectl, running_job, two_worker_job


def _why_no_kueue() -> str | None:
    """As tests/kueue: `make setup` (so `make e2e-kind`) builds Kueue unless ETJ_KUEUE=0; a cold build in the
    test would take most of its time limit."""
    from etj_testbed.localcluster import kueue_build

    if os.environ.get("ETJ_KUEUE") == "0":
        return "ETJ_KUEUE=0"
    if not kueue_build.is_built():
        return "Kueue is not built: `make setup` or `etj kueue build` builds it (docs/kueue.md)"
    return None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.kind,
    pytest.mark.kind_full,
    pytest.mark.skipif(_why_no_kueue() is not None, reason=f"kueue: {_why_no_kueue()}"),
]

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
QUEUE_LABEL, PRIORITY_LABEL = "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"
SEAT_LABEL = "etj.dev/kueue-seat"
MANAGED_LABEL = ("etj.dev/kueue", "enabled")  # scripts/kind/kueue/values.yaml's managedJobsNamespaceSelector
GPU = "nvidia.com/gpu"
WORKER = {GPU: "1", "cpu": "500m", "memory": "1Gi"}  # examples/demo-cpu.yaml's worker
QUOTA = {GPU: "2", "cpu": "1", "memory": "2Gi"}  # two workers
# Long enough for every phase on a loaded 2-core machine, where a worker's start and join took up to 100 s:
# a run of 10 epochs at 0.4 s a step ended before the job grew back.
EPOCHS = 16
MIN_STEP_S = 1.0
KINDS = {
    "resourceflavors": "ResourceFlavor",
    "clusterqueues": "ClusterQueue",
    "workloadpriorityclasses": "WorkloadPriorityClass",
    "localqueues": "LocalQueue",
}
DONE = "/tmp/done"  # the preemptor's container exits once this file exists


@pytest.fixture(scope="module")
def kueue(kind: KindBed) -> KindBed:
    started = time.monotonic()
    kind_script("kueue")
    print(f"kueue: scripts/kind.sh kueue took {time.monotonic() - started:.0f} s")
    return kind


class Queues:
    """The test's Kueue objects: a spot ResourceFlavor, a ClusterQueue of two workers' worth that preempts
    lower priorities, a WorkloadPriorityClass above the job's, and the LocalQueue `lq` in the namespace."""

    def __init__(self, bed: KindBed, ns: str) -> None:
        self.bed, self.ns = bed, ns
        self.flavor, self.cq, self.high = f"spot-{ns}", f"cq-{ns}", f"high-{ns}"

    def create(self) -> None:
        self.bed.kube.patch(
            f"/api/v1/namespaces/{self.ns}", {"metadata": {"labels": dict([MANAGED_LABEL])}}, MERGE
        )
        self._post(
            "resourceflavors",
            {"metadata": {"name": self.flavor}, "spec": {"nodeLabels": {"etj.dev/capacity-type": "spot"}}},
        )
        quota = [{"name": r, "nominalQuota": v} for r, v in QUOTA.items()]
        flavor = {"name": self.flavor, "resources": quota}
        self._post(
            "clusterqueues",
            {
                "metadata": {"name": self.cq},
                "spec": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.ns}},
                    "preemption": {"withinClusterQueue": "LowerPriority"},
                    "resourceGroups": [{"coveredResources": list(WORKER), "flavors": [flavor]}],
                },
            },
        )
        self._post("workloadpriorityclasses", {"metadata": {"name": self.high}, "value": 1000})
        self._post("localqueues", {"metadata": {"name": "lq"}, "spec": {"clusterQueue": self.cq}}, self.ns)

    def _post(self, plural: str, body: JSON, ns: str | None = None) -> None:
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": KINDS[plural], **body}
        where = f"/namespaces/{ns}" if ns else ""
        self.bed.kube.request("POST", f"{KUEUE}{where}/{plural}", body=body)

    def preemptor(self, name: str, image: str) -> None:
        """A batch/v1 Job at the high priority needing one worker's worth; it runs until DONE exists."""
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: "lq", PRIORITY_LABEL: self.high}},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 0,
                        "containers": [
                            {
                                "name": "main",
                                "image": image,
                                "imagePullPolicy": "Never",
                                "command": ["sh", "-c", f"until [ -e {DONE} ]; do sleep 0.2; done"],
                                "resources": {"requests": dict(WORKER), "limits": dict(WORKER)},
                            }
                        ],
                    }
                },
            },
        }
        self.bed.kube.request("POST", f"/apis/batch/v1/namespaces/{self.ns}/jobs", body=body)

    def job_workload_admitted(self, job: str) -> bool:
        items = self.bed.kube.get(f"{KUEUE}/namespaces/{self.ns}/workloads").get("items") or []
        for wl in items:
            owners = [o.get("name") for o in wl["metadata"].get("ownerReferences") or []]
            if job in owners:
                conds = (wl.get("status") or {}).get("conditions") or []
                return any(c["type"] == "Admitted" and c["status"] == "True" for c in conds)
        return False

    def delete(self) -> None:
        for path in (
            f"/apis/batch/v1/namespaces/{self.ns}/jobs/preemptor",
            f"{KUEUE}/namespaces/{self.ns}/localqueues/lq",
            f"{KUEUE}/clusterqueues/{self.cq}",
            f"{KUEUE}/resourceflavors/{self.flavor}",
            f"{KUEUE}/workloadpriorityclasses/{self.high}",
        ):
            with contextlib.suppress(ApiException):
                self.bed.kube.request("DELETE", path, body={"propagationPolicy": "Background"})


@contextlib.contextmanager
def queues(bed: KindBed, ns: str) -> Iterator[Queues]:
    q = Queues(bed, ns)
    try:
        q.create()
        yield q
    finally:
        q.delete()


def _workers(run: RunningJob) -> dict[str, JSON]:
    """Running, not terminating, workers by pod name."""
    return {
        p["metadata"]["name"]: p
        for p in run.pods("worker")
        if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def _restarts(pod: JSON) -> int:
    return sum(int(c.get("restartCount") or 0) for c in pod.get("status", {}).get("containerStatuses") or [])


def _condition(run: RunningJob, type_: str) -> JSON:
    return next((c for c in run.status().get("conditions") or [] if c["type"] == type_), {})


def _training(run: RunningJob, what: str, predicate: Callable[[], object], timeout: float = 600) -> Any:
    """``run.wait``, failing at once if the job ends first (what the test waits for can no longer come)."""

    def check() -> object:
        phase = (run.status() or {}).get("phase")
        assert phase not in ("Succeeded", "Failed"), f"the job {phase} while waiting for {what}"
        return predicate()

    return run.wait(what, check, timeout)


def _preemptor_pod(run: RunningJob) -> str | None:
    pods: list[Any] = run.bed.pods(run.ns, "job-name=preemptor")
    running = [p["metadata"]["name"] for p in pods if p.get("status", {}).get("phase") == "Running"]
    return running[0] if running else None


@pytest.mark.timeout(1800)
def test_kueue_preemption_shrinks_the_job_in_place_and_freed_quota_grows_it_back(kueue: KindBed) -> None:
    job = two_worker_job(EPOCHS, MIN_STEP_S, spot_only=True)
    job["metadata"]["labels"] = {QUEUE_LABEL: "lq"}
    # A preemption must count as no failure even where interruptions do.
    job["spec"]["failurePolicy"] = {"maxFailures": 3, "countInterruptions": True}
    with running_job(kueue, "kueue", job, EPOCHS) as run, queues(kueue, run.ns) as q:
        t0 = time.monotonic()
        _training(run, "the job admitted and training at 2 workers", lambda: run.training_workers(2, 3))
        admitted_s = time.monotonic() - t0
        assert _condition(run, "KueueAdmitted").get("status") == "True", run.status().get("conditions")
        before = _workers(run)
        seats = {n: p["metadata"]["labels"].get(SEAT_LABEL) for n, p in before.items()}
        base = [n for n, seat in seats.items() if seat == f"{run.name}-kueue-base"]
        assert len(base) == 1, seats
        survivor = before[base[0]]

        sent = time.monotonic()
        q.preemptor("preemptor", kueue.trainer_image)
        _training(run, "the job shrunk to 1 worker in place", lambda: run.training_workers(1, 0), 300)
        shrink_s = time.monotonic() - sent
        pod = _training(run, "the preemptor's pod running", lambda: _preemptor_pod(run), 300)
        assert q.job_workload_admitted("preemptor")
        now = _workers(run)
        assert list(now) == base, (list(before), list(now))
        assert now[base[0]]["metadata"]["uid"] == survivor["metadata"]["uid"]
        assert _restarts(now[base[0]]) == _restarts(survivor), now[base[0]]["status"]
        status = run.status()
        assert not status.get("failures"), status
        reasons = [r.get("reason") for r in status.get("resizeHistory") or []]
        assert "KueuePreempted" in reasons, status.get("resizeHistory")
        step = run.step()
        _training(run, "training going on at 1 worker", lambda: run.step() > step + 2, 300)

        out = kubectl(kueue, "exec", "-n", run.ns, pod, "--", "touch", DONE, timeout=120)
        assert out.returncode == 0, out.stderr
        freed = time.monotonic()
        _training(run, "the job grown back to 2 workers", lambda: run.training_workers(2, 0), 600)
        regrow_s = time.monotonic() - freed
        after = _workers(run)
        assert after[base[0]]["metadata"]["uid"] == survivor["metadata"]["uid"]
        assert _restarts(after[base[0]]) == _restarts(survivor)
        result = run.result()

    status = result.status.get("status") or {}
    print(
        f"kueue on kind: admitted at 2 workers {admitted_s:.0f} s after the queues; preemptor in, job at 1 "
        f"{shrink_s:.1f} s after it was created; back at 2 {regrow_s:.1f} s after it finished"
    )
    assert result.phase == "Succeeded", (run.run_dir, status.get("conditions"))
    assert not status.get("failures"), status
    history = status.get("resizeHistory") or []
    preempted = [r for r in history if r.get("reason") == "KueuePreempted"]
    assert preempted and preempted[0]["from"] == 2 and preempted[0]["to"] == 1, history
    assert not preempted[0].get("stepsLost"), preempted  # a graceful leave redoes no step
    assert any(r["from"] == 1 and r["to"] == 2 for r in history[history.index(preempted[0]) :]), history
    exactly_once(run.run_dir, EPOCHS)

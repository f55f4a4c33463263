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
Kueue admits the extra seat again, and the job grows back to two by an in-place join. Then below min: a
second Job needing both workers' worth arrives; freeing the extra is not enough, so Kueue evicts the base
too and the job stops like a suspend (a `KueueEvicted` Warning, every worker and the store released after
the trainer's just-in-time checkpoint, no failure counted, queued again); when that Job finishes Kueue
admits the base again and the job resumes from the stop's checkpoint (its first step after it is the one
after the checkpoint, which holds every step trained before the stop). It must then succeed with every
sample trained exactly once per epoch, and end at the accuracy of the same job trained unpreempted at 2
workers (the demo's tolerance).

One test, phases in a row: each phase needs a job admitted and training (the second worker's first start
takes up to two minutes here), so a second test would pay the setup again for nothing it could share.

Without the operator's Kueue support the job would run before and beyond its quota and the preemptor would
wait; without the seat drain the preemptor would never be admitted (the extra's quota never released);
without the base's stop the big Job would never run (the base's worker keeps its quota).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from etj_testbed.localcluster.proclet.kube import MERGE
from tests.e2e.e2econfig import ACCURACY_POINTS
from tests.kind.conftest import kind_script
from tests.kind.kindbed import (
    JSON,
    KindBed,
    RunningJob,
    exactly_once,
    fixed_reference_accuracy,
    kubectl,
    running_job,
    two_worker_job,
)


def _why_no_kueue() -> str | None:
    """As tests/kueue: `make setup-test` (so `make e2e-kind`) builds Kueue unless ETJ_KUEUE=0; a cold build
    in the test would take most of its time limit."""
    from etj_testbed.localcluster import kueue_build

    if os.environ.get("ETJ_KUEUE") == "0":
        return "ETJ_KUEUE=0"
    if not kueue_build.is_built():
        return "Kueue is not built: `make setup-test` or `etj kueue build` builds it (docs/kueue.md)"
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
EPOCHS = 24
MIN_STEP_S = 1.0
KINDS = {
    "resourceflavors": "ResourceFlavor",
    "clusterqueues": "ClusterQueue",
    "workloadpriorityclasses": "WorkloadPriorityClass",
    "localqueues": "LocalQueue",
}
DONE = "/tmp/done"  # the preemptor's container exits once this file exists
BIG = "big"  # the second preemptor: both workers' worth, so Kueue must evict the base too
CKPT = re.compile(r"^ckpt-(\d{9})\.pt$")  # etj_trainer.checkpoint.store's names (ckpt-<steps done>.pt)


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

    def preemptor(self, name: str, image: str, workers: int = 1) -> None:
        """A batch/v1 Job at the high priority needing ``workers`` workers' worth (one pod); it runs until
        DONE exists."""
        need = {r: _times(v, workers) for r, v in WORKER.items()}
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
                                "resources": {"requests": dict(need), "limits": dict(need)},
                            }
                        ],
                    }
                },
            },
        }
        self.bed.kube.request("POST", f"/apis/batch/v1/namespaces/{self.ns}/jobs", body=body)

    def evicted_warnings(self, job: str) -> list[JSON]:
        """The job's KueueEvicted Warnings (the stop's resize Event, Normal, has the same reason)."""
        events = self.bed.events(self.ns, job)
        return [e for e in events if e.get("reason") == "KueueEvicted" and e.get("type") == "Warning"]

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
            f"/apis/batch/v1/namespaces/{self.ns}/jobs/{BIG}",
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


def _times(quantity: str, n: int) -> str:
    """``n`` times a WORKER quantity ("1", "500m", "1Gi")."""
    number = re.fullmatch(r"(\d+)(\D*)", quantity)
    assert number is not None, quantity
    return f"{int(number[1]) * n}{number[2]}"


def _checkpoints(run: RunningJob) -> list[int]:
    """The steps of the shared checkpoints (checkpoint.path in the shared directory), oldest first."""
    folder = run.run_dir / "checkpoints"
    names = [CKPT.match(f.name) for f in folder.iterdir()] if folder.is_dir() else []
    return sorted(int(m[1]) for m in names if m is not None)


def _logged_steps(run: RunningJob) -> dict[Path, list[int]]:
    """The (1-based) steps each per-rank sample log file recorded; a file is one rank of one membership."""
    out: dict[Path, list[int]] = {}
    for f in sorted((run.run_dir / "samples").glob("samples-*.jsonl")):
        complete = f.read_text().split("\n")[:-1]  # a line still being written is not one yet
        out[f] = [json.loads(line)["step"] for line in complete if line.strip()]
    return out


def _preemptor_pod(run: RunningJob, name: str = "preemptor") -> str | None:
    pods: list[Any] = run.bed.pods(run.ns, f"job-name={name}")
    running = [p["metadata"]["name"] for p in pods if p.get("status", {}).get("phase") == "Running"]
    return running[0] if running else None


@pytest.mark.timeout(1800)
def test_kueue_preemption_shrinks_in_place_grows_back_and_evicting_the_base_suspends_and_resumes(
    kueue: KindBed, tmp_path: Path
) -> None:
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

        # Below min: a Job needing both workers' quota. Freeing the extra is not enough, so Kueue evicts
        # the base too and the job stops like a suspend (every pod released after the just-in-time
        # checkpoint), queued again; it resumes from that checkpoint when the Job finishes.
        step_before = run.step()
        sent = time.monotonic()
        q.preemptor(BIG, kueue.trainer_image, workers=2)
        _training(run, "the KueueEvicted Warning", lambda: q.evicted_warnings(run.name), 300)
        evicted_s = time.monotonic() - sent
        admitted = _condition(run, "KueueAdmitted")
        assert admitted.get("status") == "False", admitted
        assert admitted.get("reason") in ("Evicted", "Pending"), admitted  # Pending: queued again already
        _training(
            run,
            "every pod of the job released",
            lambda: not run.pods("worker") and not run.pods("rendezvous"),
            300,
        )
        stopped_s = time.monotonic() - sent
        big = _training(run, "the big Job's pod running", lambda: _preemptor_pod(run, BIG), 300)
        big_s = time.monotonic() - sent
        assert q.job_workload_admitted(BIG)
        assert not run.pods("worker"), "a worker while the job's base waits for quota"
        status = run.status()
        assert not status.get("failures"), status
        assert _condition(run, "KueueAdmitted").get("reason") == "Pending", status.get("conditions")
        reasons = [r.get("reason") for r in status.get("resizeHistory") or []]
        assert "KueueEvicted" in reasons, status.get("resizeHistory")
        (warning,) = q.evicted_warnings(run.name)
        assert "Preempted" in warning.get("message", ""), warning
        # The stop's checkpoint: the newest shared one holds every step trained before it (the one in
        # flight, logged before its commit, may have been rolled back).
        logged = _logged_steps(run)
        last_logged = max(s for steps in logged.values() for s in steps)
        at_stop = _checkpoints(run)
        assert at_stop, run.run_dir
        stop_ckpt = at_stop[-1]
        assert stop_ckpt >= max(step_before, last_logged - 1), (stop_ckpt, step_before, last_logged)
        recorded = (status.get("lastCheckpoint") or {}).get("step")

        out = kubectl(kueue, "exec", "-n", run.ns, big, "--", "touch", DONE, timeout=120)
        assert out.returncode == 0, out.stderr
        freed = time.monotonic()
        # The base's one worker restarts from the checkpoint; the extra seat's worker joins it in place.
        _training(
            run,
            "the job resumed, training past its checkpoint",
            lambda: bool(run.running_on("worker")) and run.step() > stop_ckpt,
            600,
        )
        resume_s = time.monotonic() - freed
        _training(run, "the resumed job back at 2 workers", lambda: run.training_workers(2, 0), 600)
        back_s = time.monotonic() - freed
        assert _condition(run, "KueueAdmitted").get("status") == "True", run.status().get("conditions")
        after_stop = {f: steps for f, steps in _logged_steps(run).items() if f not in logged and steps}
        assert after_stop, "no sample log of a membership after the stop"
        resumed = min(steps[0] for steps in after_stop.values())
        assert resumed == stop_ckpt + 1, (resumed, stop_ckpt)  # from the stop's checkpoint, nothing redone
        result = run.result()

    status = result.status.get("status") or {}
    print(
        f"kueue on kind: admitted at 2 workers {admitted_s:.0f} s after the queues; preemptor in, job at 1 "
        f"{shrink_s:.1f} s after it was created; back at 2 {regrow_s:.1f} s after it finished; the big Job: "
        f"KueueEvicted {evicted_s:.1f} s, every pod gone {stopped_s:.1f} s, its pod running {big_s:.1f} s "
        f"after it was created; status step {step_before} before it, last logged step {last_logged}, "
        f"checkpoint at the stop {stop_ckpt} (status.lastCheckpoint {recorded}); after it finished: training "
        f"again from step {resumed} {resume_s:.1f} s, back at 2 workers {back_s:.1f} s"
    )
    assert result.phase == "Succeeded", (run.run_dir, status.get("conditions"))
    assert not status.get("failures"), status
    history = status.get("resizeHistory") or []
    preempted = [r for r in history if r.get("reason") == "KueuePreempted"]
    assert preempted and preempted[0]["from"] == 2 and preempted[0]["to"] == 1, history
    assert not preempted[0].get("stepsLost"), preempted  # a graceful leave redoes no step
    assert any(r["from"] == 1 and r["to"] == 2 for r in history[history.index(preempted[0]) :]), history
    assert any(r.get("reason") == "KueueEvicted" and r["to"] == 0 for r in history), history
    exactly_once(run.run_dir, EPOCHS)
    # Through a preemption, a grow-back, a suspension and a resume, the job ends where an unpreempted run of
    # it at 2 workers ends (the recipe's fixed global batch; the demo's tolerance).
    accuracy = float((status.get("progress") or {}).get("accuracy") or 0)
    reference = fixed_reference_accuracy(job, 2, tmp_path / "fixed")
    print(f"kueue on kind: accuracy {accuracy:.4f}, the same job unpreempted at 2 workers {reference:.4f}")
    assert abs(accuracy - reference) * 100 <= ACCURACY_POINTS, (accuracy, reference)

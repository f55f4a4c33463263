"""Kueue preemption on the bed: an etj job shrinks in place, a plain batch/v1 Job is evicted whole. One run.

Issue 39 item 6 (docs/kueue.md, "Measured: preemption shrinks in place"). The local control plane with the
bed's real Kueue v0.17.0 (`etj kueue up`), the real operator (``--kueue``) and the real trainer: worker
pods run as local processes on process-backed nodes (`etj_testbed.demo.local.Demo`, the demo's job,
examples/demo-cpu.yaml). Three spot nodes of one GPU, one ClusterQueue of exactly 3 GPUs that preempts lower
priorities. Two arms, one after the other, in the same run, each through the same sequence:

1. the arm's job fills the queue: 3 one-GPU workers (etj: ``replicas`` 2..3, so a base Workload of 2 and
   one extra seat; the baseline: a batch/v1 Job of parallelism 3, one Workload of 3 pods);
2. a higher-priority batch/v1 Job of one GPU arrives (WorkloadPriorityClass of value 1000);
3. ``--hold`` seconds later it is deleted: the quota frees;
4. the arm's job is back at 3 workers.

Measured (wall seconds from the bench's own polls every 0.2 s, plus what the trainer reports):

- ``preemptor_running_s``: the preemptor created -> its pod Running;
- etj: the world 3 -> 2 and back; ``pause_s``/``steps_lost`` of each resize as the trainer reports them
  (status.resizeHistory: seconds without a training step, steps redone after the last checkpoint);
  ``failures`` (status.failures); ``rejoin_s``: quota freed -> the trainer reports world 3 again;
- baseline: Kueue evicts its one Workload (every pod deleted, the Job suspended) and re-admits it once the
  quota frees. Its pods are not a trainer: each runs a loop (``BASELINE_LOOP``) that reports a step every
  ``step_s`` seconds, the etj job's own measured step time, and pod 0 checkpoints every ``checkpoint``
  steps, the etj job's own interval (examples/demo-cpu.yaml: 20), resuming from it when it starts. That
  models a checkpoint-restart torchrun job of the same step time and checkpoint interval, without its
  start-up cost (imports, rendezvous, data loading): its restart time here is a lower bound. Reported:
  steps lost (last step reported before the eviction - the checkpoint it resumes from), pause (last step
  before -> first step after), restart (quota freed -> first step after), and the Job's failed pods. Its
  preemption lands half a checkpoint interval after a checkpoint (the mean loss of one arriving at a
  random time);
- both: ``net_steps_during_hold``, where the job's training stands once the quota frees less where it stood
  when the preemptor was created (the baseline's: the checkpoint it resumes from). Steps are the same work in
  both arms: the etj job keeps its global batch fixed at any world size (FixedGlobalBatch).

Prints one JSON object and writes it to ``--out``.

    ETJ_CLUSTER_NAME=... ETJ_CLUSTER_PORT_BASE=... .venv/bin/python bench/kueue_preemption.py \
        [--hold 30] [--out bench/results/kueue_preemption.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/ is sys.path[0], the repository is not
    sys.path.insert(0, str(REPO))

from bench.kueue_preemption_report import (  # noqa: E402
    BASELINE_LOOP,
    WORKERS,
    StepLine,
    baseline_report,
    etj_report,
    parse_steps,
    rejoin_parts,
    table,
)

JSON = dict[str, Any]
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL, PRIORITY_LABEL = "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"
KUEUE_NAMESPACES = "etj.dev/kueue=enabled"  # the label tests/kueue's Kueue manages namespaces by
GPU = "nvidia.com/gpu"
INSTANCE = "kq"
NAMESPACE = "etj-kueue-bench"
POLL_S = 0.2


# ---- the report (pure) -------------------------------------------------------------------------------


def kueue_objects(instance: str, namespace: str, cpu: str, memory: str) -> list[JSON]:
    """A flavor of this bench's spot process nodes, a ClusterQueue of exactly WORKERS GPUs (cpu and memory
    covered generously: Kueue admits a podSet only if its queue covers every resource it requests), a
    LocalQueue and the preemptor's priority class."""
    from etj_testbed.localcluster.fake_nodes import PROVIDER_NODE_LABELS
    from etj_testbed.localcluster.proclet.nodes import INSTANCE_LABEL

    api = f"{GROUP}/{VERSION}"
    flavor = f"{instance}-spot"
    quota = [
        {"name": GPU, "nominalQuota": WORKERS},
        {"name": "cpu", "nominalQuota": cpu},
        {"name": "memory", "nominalQuota": memory},
    ]
    return [
        {
            "apiVersion": api,
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            # process_node's spot nodes (EKS's label) of this bench only.
            "spec": {"nodeLabels": {**PROVIDER_NODE_LABELS["eks"]["spot"], INSTANCE_LABEL: instance}},
        },
        {
            "apiVersion": api,
            "kind": "ClusterQueue",
            "metadata": {"name": f"{instance}-cq"},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": [GPU, "cpu", "memory"],
                        "flavors": [{"name": flavor, "resources": quota}],
                    }
                ],
            },
        },
        {
            "apiVersion": api,
            "kind": "LocalQueue",
            "metadata": {"name": "lq", "namespace": namespace},
            "spec": {"clusterQueue": f"{instance}-cq"},
        },
        {
            "apiVersion": api,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": f"{instance}-high"},
            "value": 1000,
        },
    ]


def batch_job(name: str, parallelism: int, command: list[str], labels: dict[str, str]) -> JSON:
    """A batch/v1 Job of ``parallelism`` one-GPU pods in the bench's LocalQueue (Indexed: each pod knows its
    JOB_COMPLETION_INDEX); pods run ``command`` from the venv on a process node."""
    container = {
        "name": "main",
        "image": "registry.invalid/none:0",
        "command": command,
        "resources": {
            "requests": {GPU: "1", "cpu": "100m", "memory": "64Mi"},
            "limits": {GPU: "1", "cpu": "100m", "memory": "64Mi"},
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: "lq", **labels}},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }


@dataclass
class Bed:
    demo: Any  # etj_testbed.demo.local.Demo
    marks: dict[str, float] = field(default_factory=dict)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return str(self.demo.kubectl(*args, stdin=stdin, check=check))

    def apply(self, body: JSON) -> None:
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(body))

    def pods(self, selector: str) -> list[JSON]:
        got = json.loads(self.kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json"))
        return [p for p in got["items"] if not p["metadata"].get("deletionTimestamp")]

    def running(self, selector: str) -> int:
        return sum(1 for p in self.pods(selector) if (p.get("status") or {}).get("phase") == "Running")

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                t = time.time()
                print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)
                return t
            time.sleep(POLL_S)
        raise TimeoutError(f"{what}: not within {timeout:.0f} s")

    def preempt_and_free(
        self, hold: float, shrunk: Callable[[], bool], back: Callable[[], bool], step: Callable[[], int]
    ) -> JSON:
        """The sequence both arms go through: the preemptor, which holds its GPU for ``hold`` s from its
        creation (the same for both arms: the scenario's length, not a wait for something), its deletion,
        the arm back at 3. ``step``: the arm's training step now, sampled when the preemptor is created and
        when the quota frees."""
        t0 = time.time()
        self.marks["preempted"] = t0
        at_preempted = step()
        sleep = ["python", "-c", "import time; time.sleep(100000)"]
        self.apply(batch_job("preemptor", 1, sleep, {PRIORITY_LABEL: f"{INSTANCE}-high"}))
        running = self.wait(
            "the preemptor's pod Running", lambda: self.running("job-name=preemptor") == 1, 300
        )
        self.marks["shrunk"] = self.wait("the arm's job shrunk or evicted", shrunk, 300)
        time.sleep(max(0.0, t0 + hold - time.time()))
        at_freed = step()
        self.kubectl("delete", "job", "preemptor", "-n", NAMESPACE, "--cascade=background", "--wait=false")
        self.marks["freed"] = time.time()
        self.marks["back"] = self.wait("the arm's job back at 3", back, 600)
        return {
            "preemptor_running_s": round(running - t0, 2),
            "step_at_preempted": at_preempted,
            "step_at_freed": at_freed,
        }


def etj_arm(bed: Bed, hold: float) -> JSON:
    def status() -> JSON:
        return bed.demo.job().get("status") or {}

    def world(n: int) -> Callable[[], bool]:
        return lambda: status().get("worldSize") == n and status().get("currentReplicas") == n

    bed.demo.submit()
    bed.wait("etj at 3 workers, training", world(WORKERS), 900)
    step0 = (status().get("progress") or {}).get("step") or 0
    bed.wait(
        "etj 20 steps at 3", lambda: ((status().get("progress") or {}).get("step") or 0) >= step0 + 20, 300
    )

    def step() -> int:
        return int((status().get("progress") or {}).get("step") or 0)

    out = bed.preempt_and_free(hold, world(WORKERS - 1), world(WORKERS), step)
    out["net_steps_during_hold"] = out["step_at_freed"] - out["step_at_preempted"]

    def measured() -> bool:
        last = (_history(status()) or [{}])[-1]
        return (
            last.get("to") == WORKERS and last.get("_t", 0) >= bed.marks["freed"] and "pauseSeconds" in last
        )

    try:  # the trainer's pause of the join comes with its next report
        bed.wait("the rejoin's pause reported", measured, 120)
    except TimeoutError as e:
        print(f"kueue_preemption: {e}", file=sys.stderr)
    st = status()
    out.update(
        etj_report(
            _history(st),
            preempted_at=bed.marks["preempted"],
            freed_at=bed.marks["freed"],
            failures=st.get("failures") or 0,
        )
    )
    pods = bed.demo.run_dir / "proclet" / "pods" / NAMESPACE
    out["rejoin"] = rejoin_parts(list(pods.glob(f"{bed.demo.name}-worker-*")), bed.marks["freed"])
    out["step_seconds"] = (st.get("progress") or {}).get("stepSeconds")
    out["checkpoint_interval_steps"] = ((bed.demo.job().get("spec") or {}).get("checkpoint") or {}).get(
        "intervalSteps"
    )
    out["resize_history"] = st.get("resizeHistory")
    return out


def _history(status: JSON) -> list[JSON]:
    from datetime import datetime

    return [
        {**r, "_t": datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp()}
        for r in status.get("resizeHistory") or []
    ]


def baseline_arm(bed: Bed, hold: float, step_s: float, checkpoint: int, out_dir: Path) -> JSON:
    out_dir.mkdir(parents=True, exist_ok=True)
    command = ["python", "-c", BASELINE_LOOP, str(out_dir), str(step_s), str(checkpoint)]
    bed.apply(batch_job("baseline", WORKERS, command, {}))
    sel = "job-name=baseline"
    log = out_dir / "steps-0.log"

    def steps() -> list[StepLine]:
        return parse_steps(log.read_text()) if log.exists() else []

    bed.wait("the baseline's 3 pods running", lambda: bed.running(sel) == WORKERS, 600)
    # The eviction lands half a checkpoint interval after a checkpoint: the mean loss of a preemption that
    # arrives at a random time (the etj arm loses none wherever it lands).
    due = checkpoint + checkpoint // 2
    bed.wait(f"the baseline at step {due}", lambda: any(x.step >= due for x in steps()), 300)

    def step() -> int:
        done = [x.step for x in steps() if x.kind == "step"]
        return done[-1] if done else 0

    out = bed.preempt_and_free(
        hold,
        lambda: not bed.pods(sel),
        lambda: bed.running(sel) == WORKERS and bool([x for x in steps() if x.kind == "start"][1:]),
        step,
    )
    started = bed.marks["back"]
    bed.wait(
        "a step after the restart", lambda: any(x.kind == "step" and x.t > started for x in steps()), 120
    )
    job = json.loads(bed.kubectl("get", "job", "baseline", "-n", NAMESPACE, "-o", "json"))
    # The eviction: the last poll that still saw its pods before they were gone.
    out["evicted"] = baseline_report(steps(), evicted_at=bed.marks["shrunk"], freed_at=bed.marks["freed"])
    out["failed_pods"] = (job.get("status") or {}).get("failed") or 0
    resumed = out["evicted"].get("resumed_from")
    out["net_steps_during_hold"] = resumed - out["step_at_preempted"] if resumed is not None else None
    out["step_s"], out["checkpoint_interval_steps"] = step_s, checkpoint
    return out


def run(kubeconfig: Path, args: argparse.Namespace, run_dir: Path) -> JSON:
    from etj_testbed.demo.local import Demo
    from etj_testbed.demo.scenario import Scenario
    from etj_testbed.demo.script import Script

    class Nodes(Scenario):
        def operator_args(self, demo: Demo) -> tuple[str, ...]:
            return ("--kueue",)

        def start(self, demo: Demo) -> None:
            demo.add_node(f"{demo.instance}-store", "on-demand", gpus=0)
            for i in range(WORKERS):
                demo.add_node(f"{demo.instance}-spot-{i}", "spot")

    manifest = yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    manifest["metadata"]["labels"] = {QUEUE_LABEL: "lq"}
    manifest["spec"]["replicas"] = {"min": WORKERS - 1, "max": WORKERS}
    manifest["spec"]["training"]["epochs"] = 1000  # it never finishes here: the bench stops it
    manifest["spec"]["trainer"]["env"].append({"name": "ETJ_MIN_STEP_SECONDS", "value": str(args.min_step_s)})
    demo = Demo(kubeconfig, NAMESPACE, run_dir, manifest, Script(timeout_s=3600), INSTANCE, scenario=Nodes())
    bed = Bed(demo)
    report: JSON = {"benchmark": "kueue_preemption", "cpu_count": os.cpu_count(), "hold_s": args.hold}
    try:
        demo.start()
        bed.kubectl("label", "namespace", NAMESPACE, KUEUE_NAMESPACES, "--overwrite")
        for body in kueue_objects(INSTANCE, NAMESPACE, str(WORKERS * 8), "1000Gi"):
            bed.apply(body)
        report["etj"] = etj_arm(bed, args.hold)
        bed.kubectl("delete", "etj", demo.name, "-n", NAMESPACE, "--wait=true", "--timeout=300s")
        bed.wait("the etj job's pods gone", lambda: not bed.pods(f"etj.dev/job={demo.name}"), 300)
        step_s = float(report["etj"].get("step_seconds") or args.min_step_s)
        checkpoint = int(report["etj"].get("checkpoint_interval_steps") or 20)
        bed.marks.clear()
        report["baseline"] = baseline_arm(bed, args.hold, step_s, checkpoint, run_dir / "baseline")
        report["table"] = table(report)
    finally:
        for job in ("preemptor", "baseline"):
            bed.kubectl(
                "delete", "job", job, "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False
            )
        demo.cleanup(delete_job=True)
        bed.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        for kind, name in (
            ("clusterqueue", f"{INSTANCE}-cq"),
            ("resourceflavor", f"{INSTANCE}-spot"),
            ("workloadpriorityclass", f"{INSTANCE}-high"),
        ):
            bed.kubectl("delete", f"{kind}.{GROUP}", name, "--wait=false", check=False)
    return report


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--hold", type=float, default=30.0, help="seconds from the preemptor's creation to its deletion"
    )
    ap.add_argument("--min-step-s", type=float, default=0.2, help="the trainer's ETJ_MIN_STEP_SECONDS")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "kueue_preemption.json")
    ap.add_argument("--run-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    from etj_testbed.localcluster import toolchain
    from etj_testbed.localcluster.cluster import LocalCluster
    from etj_testbed.localcluster.kueue import LocalKueue

    cluster = LocalCluster.named()
    kubeconfig = cluster.up()
    LocalKueue(cluster.layout, namespace_label=KUEUE_NAMESPACES).up()
    run_dir = args.run_dir or toolchain.cache_root() / "kueue-preemption" / time.strftime("%Y%m%d-%H%M%S")
    report = run(kubeconfig, args, run_dir)
    report["command"] = "python bench/kueue_preemption.py " + " ".join(argv)
    text = json.dumps(report, indent=2)
    args.out.write_text(text + "\n")
    print(text)
    print(report.get("table", ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""bench/kueue_preemption.py's baseline and report: the loop the baseline's pods run, its step lines and
what its eviction cost, the etj job's resizes, the rejoin's parts and the table (docs/kueue.md, "Measured:
preemption shrinks in place"). Pure, so tests/bench_kueue checks it without a bed."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/ is sys.path[0], the repository is not
    sys.path.insert(0, str(REPO))

from bench.resize_pause import _joined_at  # noqa: E402

JSON = dict[str, Any]
WORKERS = 3  # the job's max, and the ClusterQueue's GPUs

# The baseline's pods: a step every STEP_S seconds, reported as "<unix time> <step>" lines; pod 0 writes
# the checkpoint (its step) every CKPT steps; every pod starts from the checkpoint.
BASELINE_LOOP = """
import os, sys, time
out, step_s, ckpt = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
idx = os.environ.get("JOB_COMPLETION_INDEX", "0")
path = os.path.join(out, "checkpoint")
step = int(open(path).read()) if os.path.exists(path) else 0
log = open(os.path.join(out, f"steps-{idx}.log"), "a", buffering=1)
log.write(f"{time.time()} start {step}\\n")
while True:
    time.sleep(step_s)
    step += 1
    log.write(f"{time.time()} step {step}\\n")
    if idx == "0" and step % ckpt == 0:
        with open(path + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(path + ".tmp", path)
"""


@dataclass(frozen=True)
class StepLine:
    t: float
    kind: str  # "start" (resumed from ``step``) or "step" (completed ``step``)
    step: int


def parse_steps(text: str) -> list[StepLine]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in ("start", "step"):
            out.append(StepLine(float(parts[0]), parts[1], int(parts[2])))
    return out


def baseline_report(lines: Sequence[StepLine], *, evicted_at: float, freed_at: float) -> JSON:
    """What the eviction cost the baseline, from pod 0's step lines: the last step before ``evicted_at``,
    the checkpoint the next start resumed from, and the first step after it."""
    before = [x for x in lines if x.kind == "step" and x.t <= evicted_at]
    restart = next((x for x in lines if x.kind == "start" and x.t > evicted_at), None)
    if not before or restart is None:
        return {"measured": False, "why": "no step before the eviction or no restart after it"}
    after = next((x for x in lines if x.kind == "step" and x.t > restart.t), None)
    last = before[-1]
    out: JSON = {
        "measured": after is not None,
        "last_step_before": last.step,
        "resumed_from": restart.step,
        "steps_lost": last.step - restart.step,
        "pods_started_after_freed_s": round(restart.t - freed_at, 2),
    }
    if after is not None:
        out["pause_s"] = round(after.t - last.t, 2)
        out["restart_s"] = round(after.t - freed_at, 2)
    return out


def etj_report(history: Sequence[JSON], *, preempted_at: float, freed_at: float, failures: int) -> JSON:
    """The etj job's two resizes (status.resizeHistory, as the trainer measured them): the first to 2 after
    the preemption and the next back to 3."""
    shrink = next((r for r in history if r.get("to") == WORKERS - 1 and r["_t"] >= preempted_at), None)
    grow = next((r for r in history if r.get("to") == WORKERS and r["_t"] >= freed_at), None)

    def part(r: JSON | None, since: float) -> JSON:
        if r is None:
            return {"measured": False}
        return {
            "reason": r.get("reason"),
            "world_at_s": round(r["_t"] - since, 2),
            "pause_s": r.get("pauseSeconds"),
            "steps_lost": r.get("stepsLost"),
        }

    return {"shrink": part(shrink, preempted_at), "grow": part(grow, freed_at), "failures": failures}


def proclet_started_at(log: Path) -> float | None:
    """When the process harness started a pod's process: its log's first line, ``--- proclet: start [...]
    at 2026-01-01T12:00:00Z``."""
    from datetime import datetime

    first = log.read_text(errors="replace").split("\n", 1)[0] if log.exists() else ""
    if not first.startswith("--- proclet: start ") or " at " not in first:
        return None
    return datetime.fromisoformat(first.rsplit(" at ", 1)[1].replace("Z", "+00:00")).timestamp()


def rejoin_parts(pod_dirs: Sequence[Path], freed_at: float) -> JSON:
    """Where the rejoin's time goes, from the newest worker pod started after the quota freed: Kueue's
    admission and the operator's pod (-> the process started), the new worker's own start-up (imports:
    -> it starts to join, etj-train prints it), then the in-place join (status.resizeHistory)."""
    for log in sorted((d / "trainer.log" for d in pod_dirs), key=lambda f: proclet_started_at(f) or 0.0):
        started = proclet_started_at(log)
        if started is not None and started >= freed_at - 1:  # its ISO time has whole seconds
            joined = _joined_at(log)
            return {
                "process_started_s": round(started - freed_at, 2),
                "joining_s": round(joined - freed_at, 2) if joined else None,
            }
    return {}


def table(report: JSON) -> str:
    """The markdown table of docs/kueue.md."""
    e, b = report["etj"], report["baseline"]
    shrink, grow, lost = e["shrink"], e["grow"], b.get("evicted", {})
    # The baseline's pods are a loop without imports: its restart is a lower bound of a real trainer's.
    rows = [
        ("preemptor created -> its pod Running (s)", e["preemptor_running_s"], b["preemptor_running_s"]),
        ("the job's workers while the preemptor runs", WORKERS - 1, 0),
        (
            "training pause at the preemption (s)",
            shrink.get("pause_s"),
            f"{lost.get('pause_s')} (until re-admitted)",
        ),
        ("steps lost", shrink.get("steps_lost"), lost.get("steps_lost")),
        (
            f"net training steps while the preemptor held the GPU ({report.get('hold_s')} s)",
            e.get("net_steps_during_hold"),
            b.get("net_steps_during_hold"),
        ),
        ("failures counted", e["failures"], b.get("failed_pods")),
        ("quota freed -> training at 3 workers again (s)", grow.get("world_at_s"), lost.get("restart_s")),
        (
            "of which: Kueue's admission and the operator's pod -> the new worker's process started (s)",
            e.get("rejoin", {}).get("process_started_s"),
            lost.get("pods_started_after_freed_s"),
        ),
        (
            "of which: -> the new worker starts to join, its imports done (s)",
            e.get("rejoin", {}).get("joining_s"),
            "-",
        ),
        ("training pause at the rejoin (s)", grow.get("pause_s"), "-"),
    ]
    head = "| | etj (2..3 workers) | batch/v1 Job, parallelism 3 |\n|---|---|---|\n"
    return head + "\n".join(f"| {what} | {a} | {c} |" for what, a, c in rows)


# ---- the bed -------------------------------------------------------------------------------------------

"""Resize pause: event -> first completed step at the new world size, etj vs torchrun, in one run.

Every arm runs the same trainer (tiny model on in-memory digits, ~20 steps/s) against the same external
``etj-train store``; the only difference is the launcher: ``etj-train worker`` (in-place leave, join and
crash recovery; forkserver fast restart as the fallback) vs ``torchrun`` with its defaults, and torchrun
with the store fix (``-noshare``: its 1->2 join deadlocks otherwise). Events, in order, on 3 nodes:
SIGTERM to one agent (3->2, a graceful spot notice), SIGKILL of one node's whole process group (2->1, a lost
node: agent, forkserver and worker at once), and starting a new agent process (1->2). Numbers:

* ``*_s`` -- event -> first progress report at the new world size (polled every 50 ms). For the gain
  the event is the new agent's *process start*, so its own Python/torch imports are counted (on Kubernetes
  the pod's image pull and start come on top, but training goes on meanwhile);
* ``gain_1to2_from_join_s`` -- from the moment the new agent, its imports done, starts to join (etj agents
  print it; stock torchrun does not, hence n/a there);
* ``*_stall_s`` -- what training lost: last completed step at the old size -> first completed step at
  the new size, as the trainer reports it in ``resizes[].pauseSeconds`` (the job status shows the same).

Prints JSON.

    .venv/bin/python bench/resize_pause.py [--repeats N] [--arms etj,torchrun-defaults]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from etj_trainer.agent.local_launcher import LocalAgents
from etj_trainer.core.progress import get_json

TRAIN_ENV = {
    "ETJ_DATA": "digits-tensor",
    "ETJ_MODEL": "etj_trainer.classifier.models:tiny_mlp",
    "ETJ_EPOCHS": "1000",
    "ETJ_GLOBAL_BATCH_SIZE": "32",
    "ETJ_MICRO_BATCH_SIZE": "32",
    "ETJ_MIN_STEP_SECONDS": "0.05",
    "ETJ_MIN_WORKERS": "1",
    "ETJ_MAX_WORKERS": "3",
    "ETJ_NPROC_PER_WORKER": "1",
    "ETJ_CHECKPOINT_INTERVAL_STEPS": "1000",
}


class TorchrunCluster(LocalAgents):
    """Stock ``torchrun`` with default settings (c10d against the same external store)."""

    def start_agent(self) -> None:
        i = len(self.agents)
        out = open(self.log_dir / f"worker-{i}.log", "wb")  # noqa: SIM115
        cmd = [
            "torchrun",
            "--nnodes=1:3",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.env['ETJ_RDZV_ENDPOINT']}",
            f"--rdzv-id={self.env['ETJ_RDZV_ID']}",
            "--max-restarts=100",
            "-m",
            "etj_trainer.torchrun_entry",
        ]
        exe = str(Path(sys.executable).parent / "torchrun")
        self.agents.append(
            subprocess.Popen(
                [exe, *cmd[1:]], env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        )


def wait_progress(url: str, pred, timeout: float) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = get_json(url, timeout=1.0) or {}
        if doc and pred(doc):
            return doc
        time.sleep(0.05)
    raise TimeoutError(f"progress condition not met within {timeout}s")


def arm_env(arm: str) -> dict[str, str]:
    """Launcher settings of an arm beyond TRAIN_ENV. ``-noshare``: torchrun defaults, except that the agent
    does not share its rendezvous TCPStore with the workers (the setting etj uses; without it stock
    torchrun's 1->2 join deadlocks)."""
    return {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if arm.endswith("-noshare") else {}


JOIN_LINES = (
    "etj-train worker: joining the rendezvous at ",
    "etj-train worker: joining the running world in place at ",
)


def _joined_at(log: Path) -> float | None:
    """Wall-clock time at which an etj agent started to join the rendezvous (it prints it)."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(JOIN_LINES):
            return float(line.rsplit(" ", 1)[1])
    return None


def resize_events(cluster: LocalAgents) -> list[tuple[str, int, Callable[[], object]]]:
    """The three resizes, in order: (name, the world size after, what causes it)."""
    gone: list[subprocess.Popen[bytes]] = []  # signalled already (a leaver may take a while to exit)

    def victim() -> subprocess.Popen[bytes]:
        gone.append([a for a in cluster.alive() if a not in gone][-1])
        return gone[-1]

    return [
        # 3 -> 2: a graceful spot notice (SIGTERM to one agent)
        ("loss_3to2", 2, lambda: victim().send_signal(signal.SIGTERM)),
        # 2 -> 1: a lost node (the local launcher's !1: the node's whole process group at once)
        ("kill_2to1", 1, lambda: os.killpg(victim().pid, signal.SIGKILL)),
        # 1 -> 2: a new agent process starts
        ("gain_1to2", 2, cluster.start_agent),
    ]


def measure(
    arm: str, log_root: Path, event_timeout: float, extra_env: dict[str, str] | None = None
) -> dict[str, float | str]:
    """One arm's three resizes; ``extra_env`` over TRAIN_ENV (bench/sharded_memory.py: model, parallelism)."""
    run_id = f"bench-{arm}-{os.getpid()}-{time.time_ns()}"
    log_dir = log_root / arm / run_id
    log_dir.mkdir(parents=True)
    env = {
        **os.environ,
        **TRAIN_ENV,
        **arm_env(arm),
        **(extra_env or {}),
        "ETJ_RDZV_ID": run_id,
        "ETJ_JOB_NAME": "bench",
        "ETJ_CHECKPOINT_DIR": str(log_dir / "ckpt"),
        "ETJ_LOCAL_CHECKPOINT_DIR": f"/dev/shm/etj-{run_id}",
    }
    cluster = (LocalAgents if arm == "etj" else TorchrunCluster)(env=env, log_dir=log_dir)
    out: dict[str, float | str] = {}
    try:
        cluster.start_store()
        url = cluster.progress_url
        for _ in range(3):
            cluster.start_agent()
        wait_progress(url, lambda d: d.get("worldSize") == 3 and d.get("step", 0) >= 20, 300)
        events = resize_events(cluster)
        for name, size, act in events:
            doc = wait_progress(url, lambda d: bool(d.get("step")), 60)
            step = doc["step"]
            wait_progress(url, lambda d, s=step: d.get("step", 0) >= s + 20, 120)  # steady at this size
            t0 = time.monotonic()
            act()
            try:
                doc = wait_progress(url, lambda d, n=size: d.get("worldSize") == n, event_timeout)
            except TimeoutError:
                # Stock torchrun (shared agent store) deadlocks in any new round: the agent that stays group
                # rank 0 does not republish MASTER_ADDR for it (see docs/trainer.md).
                out[f"{name}_s"] = f"no step at world size {size} within {event_timeout:.0f} s (deadlocked)"
                break
            out[f"{name}_s"] = round(time.monotonic() - t0, 2)
            out[f"{name}_stall_s"] = doc["resizes"][-1]["pauseSeconds"]
            out[f"{name}_path"] = doc["resizes"][-1].get("statePath", "n/a")  # how the state crossed it
            if name.startswith("gain"):
                joined = _joined_at(log_dir / f"worker-{len(cluster.agents) - 1}.log")
                out[f"{name}_from_join_s"] = (
                    round(time.time() - joined, 2) if joined else "n/a (no join line)"
                )
        for name, *_ in events:  # what a stuck world kept us from measuring
            out.setdefault(f"{name}_s", "not measured (the world was stuck before)")
        return out
    finally:
        cluster.stop()
        import shutil

        shutil.rmtree(f"/dev/shm/etj-{run_id}", ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--arms", default="etj,torchrun-defaults,torchrun-defaults-noshare")
    ap.add_argument("--event-timeout", type=float, default=150)
    ap.add_argument("--log-dir", default="", help="keep the agents' logs here (default: a temporary folder)")
    ns = ap.parse_args()
    results: dict[str, list[dict[str, float | str]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(ns.repeats):
            for arm in ns.arms.split(","):
                results.setdefault(arm, []).append(measure(arm, Path(ns.log_dir or tmp), ns.event_timeout))
                print(arm, results[arm][-1], file=sys.stderr, flush=True)

    def mean(rs: list[dict[str, float | str]], k: str) -> float | str:
        vals = [r.get(k, "missing") for r in rs]
        nums = [float(v) for v in vals if not isinstance(v, str)]
        return round(sum(nums) / len(nums), 2) if len(nums) == len(vals) else "failed in some runs"

    summary = {arm: {k: mean(rs, k) for k in rs[0]} for arm, rs in results.items()}
    out: dict[str, object] = {
        "benchmark": "resize_pause",
        "cpu_count": os.cpu_count(),
        "runs": results,
        "mean": summary,
    }
    speedup = {}
    for base in ("torchrun-defaults", "torchrun-defaults-noshare"):
        for k, v in summary.get("etj", {}).items():
            b = summary.get(base, {}).get(k)
            if isinstance(v, float) and isinstance(b, float):
                speedup[f"{base}/{k}"] = round(b / v, 1)
    out["speedup_vs_baseline"] = speedup
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

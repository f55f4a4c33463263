"""Chaos bench: the spot demo's job survives >= 20 random events and still Succeeds with nothing lost.

Runs `etj_testbed.demo.local.Demo` (local control plane, operator subprocess, process-backed nodes, the CPU
demo job `examples/demo-cpu.yaml`) with, in place of its scripted interruption, a seeded random schedule of
events (its `Scenario`, bench/chaos_scenario.py), one every 8-15 s and only once the job has made progress
since the last one:

- ``pod-delete``: ``kubectl delete pod`` of a running worker (graceful: SIGTERM, grace period);
- ``pod-kill``: the same with ``--grace-period=0 --force`` (the SIGKILL equivalent);
- ``node-delete``: a spot node (one hosting a worker if any) is deleted; a fresh spot node comes later;
- ``spot-interruption``: the AWS NTH taint ``aws-node-termination-handler/spot-itn:NoSchedule`` and a cordon
  on a spot node hosting a worker; the node is deleted once drained (or after the notice), a fresh one later;
- ``operator-restart``: every operator replica is SIGKILLed and new ones started with the same command;
- ``leader-kill``: the operator replica holding the leader Lease is SIGKILLed (the operator runs as the chart
  runs it: two replicas electing a leader); a new replica replaces it; the failover time is measured;
- ``store-kill``: the job's rendezvous store pod is force-deleted (SIGKILL, no grace);
- ``store-node-loss``: the on-demand node hosting the store is deleted (machine gone); a fresh on-demand
  node comes later;
- ``od-drain``: ``kubectl drain`` of an on-demand node (maintenance: evictions, the store included, then
  uncordon once done);
- ``store-node-drain``: ``kubectl drain`` of the node hosting the store (a node group upgrade): it must
  complete (the store moves), with no failure counted; its duration is measured;
- ``slow-store``: every on-demand node takes 45-90 s to "pull" the store's image (the process nodes'
  simulated pull, ``etj.dev/proclet-image-pull-seconds``) and the store pod is force-deleted: the workers
  wait for a store that starts slowly; the time until the new store runs is measured.

Besides, a second job (``chaos-bad``) with a bad data path runs beside it from the start: it must end
Failed (bounded crash loops, then the failure budget) with the trainer's error line in its progress
document (``lastError``); the times both took are reported.

At least one on-demand node always stays (the store's and the minimum worker's capacity). At the end: the
job must be Succeeded, every training sample seen exactly once in every epoch (the trainer's sample log,
read with `etj_trainer.core.sample_log.consumed_per_epoch` as the e2e does), no failure counted
(``status.failures``: store events must not count), every drain completed, the bad job Failed with its
error reported, and at least ``--min-events`` events done.
Prints one JSON object; exits 1 otherwise. Runs on a private cluster (``ETJ_CLUSTER_NAME=chaos``,
``ETJ_CLUSTER_PORT_BASE=18400`` unless set) that is stopped at the end.

    .venv/bin/python bench/chaos.py --seed 1 [--events 24] [--epochs 60] [--keep-cluster]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import secrets
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/ is sys.path[0], the repository is not
    sys.path.insert(0, str(REPO))

from bench.chaos_scenario import Chaos, ChaosRun  # noqa: E402

from etj_testbed.demo.local import Demo  # noqa: E402
from etj_testbed.demo.script import DemoResult, Script  # noqa: E402
from etj_testbed.demo.view import logged_accuracy  # noqa: E402
from etj_testbed.localcluster import toolchain  # noqa: E402

JSON = dict[str, Any]


def check_samples(run_dir: Path, epochs: int) -> JSON:
    """Every training sample exactly once in every epoch (the e2e's check, against the dataset itself)."""
    from etj_trainer.core.sample_log import consumed_per_epoch
    from etj_trainer.data.digits import digits_split

    n = len(digits_split()["train"][1])
    got = consumed_per_epoch(run_dir / "samples")
    problems: list[str] = []
    if sorted(got) != list(range(epochs)):
        problems.append(f"epochs in the sample log: {sorted(got)}, want 0..{epochs - 1}")
    for epoch in sorted(got):
        counts = Counter(got[epoch])
        dup = sorted(i for i, c in counts.items() if c > 1)
        missing = sorted(set(range(n)) - set(counts))
        extra = sorted(set(counts) - set(range(n)))
        if dup:
            problems.append(f"epoch {epoch}: {len(dup)} samples trained twice, e.g. {dup[:10]}")
        if missing:
            problems.append(f"epoch {epoch}: {len(missing)} samples skipped, e.g. {missing[:10]}")
        if extra:
            problems.append(f"epoch {epoch}: unknown sample ids {extra[:10]}")
    return {"ok": not problems, "dataset_size": n, "epochs_logged": len(got), "problems": problems}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--events", type=int, default=24, help="chaos events to inject (at least 20 must land)")
    p.add_argument("--min-events", type=int, default=20)
    p.add_argument("--epochs", type=int, default=60, help="long enough for the events to land mid-training")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds")
    p.add_argument("--manifest", type=Path, default=REPO / "examples" / "demo-cpu.yaml")
    p.add_argument("--run-dir", type=Path)
    p.add_argument("--keep-cluster", action="store_true", help="leave the private cluster running")
    return p.parse_args(argv)


def summarize(
    args: argparse.Namespace, run_dir: Path, result: DemoResult, run: ChaosRun, wall_s: float
) -> tuple[JSON, bool]:
    """The run as the bench reports it, and whether it passed: Succeeded, every sample exactly once, enough
    events, no failure counted, the bad job Failed with its error, every drain completed."""
    status = result.status.get("status") or {}
    accuracy = (status.get("progress") or {}).get("accuracy")
    if accuracy is None:
        accuracy = logged_accuracy(run_dir)
    samples = check_samples(run_dir, args.epochs)
    succeeded = result.phase == "Succeeded"
    enough = len(run.done) >= args.min_events
    no_failures = not status.get("failures")
    drains_ok = all(d["exit"] == 0 for d in run.drains)
    bad_ok = run.bad_job.record["failed_after_s"] is not None and bool(run.bad_job.record["error"])
    summary = {
        "seed": args.seed,
        "run_dir": str(run_dir),
        "succeeded": succeeded,
        "phase": result.phase,
        "exactly_once": samples["ok"],
        "sample_check": samples,
        "accuracy": accuracy,
        "failures_counted": status.get("failures") or 0,
        "bad_data_job": {k: v for k, v in run.bad_job.record.items() if k != "submitted_at"},
        "events_injected": len(run.done),
        "enough_events": enough,
        "counts": dict(Counter(e["kind"] for e in run.done)),
        "events": run.done,
        "log": [{"t": round(t, 1), "what": what} for t, what in result.events],
        "resizes": [
            {k: r.get(k) for k in ("from", "to", "reason", "pauseSeconds", "stepsLost")}
            for r in status.get("resizeHistory") or []
        ],
        "failures": status.get("failures"),
        "max_steps_lost": max(
            (r.get("stepsLost") or 0 for r in status.get("resizeHistory") or []), default=0
        ),
        "drains": run.drains,
        "drains_completed": drains_ok,
        "leader_failovers": [
            {"killed": f.killed, "new_leader": f.new_leader, "seconds": f.seconds}
            for f in (run.replicas.failovers if run.replicas else [])
        ],
        "slow_stores": run.slow_stores,
        "replica_exits": [
            {"replica": who, "code": code} for who, code in (run.replicas.exits if run.replicas else [])
        ],
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason", "message")}
            for c in status.get("conditions") or []
        ],
        "wall_s": round(wall_s, 1),
    }
    return summary, succeeded and samples["ok"] and enough and no_failures and bad_ok and drains_ok


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    os.environ.setdefault("ETJ_CLUSTER_NAME", "chaos")
    os.environ.setdefault("ETJ_CLUSTER_PORT_BASE", "18400")
    # One token key for every operator replica, as the chart's Secret gives them: with a random key each, a
    # new leader's tokens do not match the stores' and it cannot read any job's progress (seen here: 401s
    # and a frozen status after the first restart).
    os.environ.setdefault("ETJ_OPERATOR_TOKEN_KEY", secrets.token_hex(32))
    from etj_testbed.localcluster.cluster import LocalCluster

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    run_dir = args.run_dir or toolchain.cache_root() / "chaos" / time.strftime("%Y%m%d-%H%M%S")
    manifest = yaml.safe_load(args.manifest.read_text())
    manifest = copy.deepcopy(manifest)
    manifest["spec"]["training"]["epochs"] = args.epochs
    chaos = Chaos(args.seed, args.events)
    cluster = LocalCluster.named()
    print(f"chaos: seed {args.seed}, {args.events} events, run directory {run_dir}", file=sys.stderr)
    t_start = time.monotonic()
    demo: Demo | None = None
    run = ChaosRun(chaos, "etj-chaos")
    try:
        kubeconfig = cluster.up()
        # The chaos schedule is the demo's scenario, in place of its own interruption.
        script = Script(timeout_s=args.timeout)
        demo = Demo(kubeconfig, "etj-chaos", run_dir, manifest, script, instance="chaos", scenario=run)
        demo.start()
        result = demo.run()
    except KeyboardInterrupt:
        print("\ninterrupted: cleaning up", file=sys.stderr)
        return 130
    finally:
        if demo is not None:
            demo.cleanup(delete_job=True)
        if not args.keep_cluster:
            cluster.down()
    summary, passed = summarize(args, run_dir, result, run, time.monotonic() - t_start)
    print(json.dumps(summary, indent=2))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

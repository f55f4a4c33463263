"""Spot trace replay on the local bed: etj vs a fixed on-demand cluster vs checkpoint-restart on spot.

A real spot capacity trace (``../shared/spot-traces``, docs/economics.md) becomes spot nodes on the local
control plane, on a clock ``--time-scale`` times faster than the trace's: when the trace's count drops, the
newest spot nodes get what the AWS Node Termination Handler does on an interruption notice (the taint
``aws-node-termination-handler/spot-itn:NoSchedule`` and a cordon) and are deleted once drained (or when
the notice runs out); when it rises, new spot nodes appear. A fixed on-demand pool stands beside them. The
demo's job (examples/demo-cpu.yaml: digits CNN, global batch 64) runs through it with the real operator and
trainer (`etj_testbed.demo.local.Demo`, process-backed nodes), three times, one after the other:

- ``etj``: the elastic job, 1 to P workers (P = on-demand pool + the most spot nodes), on both pools;
- ``ckpt_restart``: the same job with min = max = P on the same nodes: it trains only while P workers
  fit, stops when one is interrupted (the world cannot shrink), waits, and restarts from its checkpoint
  when capacity is back — the plain ``torchrun --nnodes=P`` job, run by the same trainer;
- ``on_demand``: the same job with min = max = P on P on-demand nodes, never interrupted;
- ``etj_deadline`` (not run unless named in ``--arms``; issue 28): the elastic job with ``spec.deadline``
  (``--deadline-factor`` times the on-demand arm's training time, run first, or ``--deadline-seconds``) on
  the trace's spot nodes and no on-demand node at all: the operator's deadline policy asks for on-demand
  workers (pods only on-demand capacity can take) when the job falls behind, a stand-in autoscaler
  (bench/economics/provisioner.py: Karpenter's contract, an on-demand node ``--od-delay`` seconds after such
  a pod is pending, gone ``--od-idle`` seconds after it empties) brings their nodes, and the policy lets
  them go first when spot returns.

Same job, seed and data; each arm starts at the same point of the trace. For each: time to finish, node
seconds by capacity type, cost at ``--price-spot`` / ``--price-on-demand`` (USD per node-hour of trace
time: one bed second stands for ``--time-scale`` seconds), goodput and badput (ml-goodput-measurement's
vocabulary, bench/economics/accounting.py), final accuracy, exactly-once over the sample logs; then cost
and time ratios. Prints one JSON object, writes it to ``--out`` and a timeline PNG to ``--plot``.

    .venv/bin/python bench/spot_replay.py availability-16-node-us-east-2b_v100_1 [--time-scale 60]
        [--on-demand 1 --spot-nodes 3] [--price-spot 0.918 --price-on-demand 3.06]
        [--epochs 8] [--start busiest|TICK] [--arms etj,ckpt_restart,on_demand] [--traces DIR]
        [--out F.json] [--plot F.png]
        [--arms on_demand,etj_deadline --deadline-factor 1.5 --rank-rate 32 --trace-from first-step]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/ is sys.path[0], the repository is not
    sys.path.insert(0, str(REPO))

from bench.economics.accounting import (  # noqa: E402
    SPOT,
)
from bench.economics.provisioner import OnDemandProvisioner  # noqa: E402
from bench.economics.traces import Trace, busiest_window, resolve_trace, scaled  # noqa: E402
from bench.spot_replay_report import DEADLINE_ARM, deadline_outcome, ratios, summarize, table, write_plot  # noqa: E402
from bench.spot_replay_scenario import ArmSpec, Replay, StoreTaken  # noqa: E402

from etj_testbed.demo.local import Demo  # noqa: E402
from etj_testbed.demo.script import Script  # noqa: E402

JSON = dict[str, Any]
# p3.2xlarge (1 V100, the traces' instance type), us-east-1, Linux: on-demand list price; spot: 30 % of it,
# about where its spot price sat in 2023 (docs/economics.md, "Prices").
PRICE_ON_DEMAND = 3.06
PRICE_SPOT = 0.918
NOTICE_S = 120.0  # AWS's interruption notice; the node goes earlier once its workers are drained
ARMS = ("etj", "ckpt_restart", "on_demand")


def arm_specs(trace: Trace, on_demand: int, spot_nodes: int, arms: list[str]) -> list[ArmSpec]:
    peak = on_demand + spot_nodes
    local = scaled(trace, spot_nodes)
    table = {
        "etj": ArmSpec("etj", 1, peak, on_demand, local),
        # A fixed-size job on spot: as many workers as spot nodes at the peak, spot only.
        "ckpt_restart": ArmSpec(
            "ckpt_restart", spot_nodes, spot_nodes, 0, local, worker_types=(SPOT,), store_node=True
        ),
        "on_demand": ArmSpec("on_demand", peak, peak, peak, None),
        # Spot only to start with; on-demand only as the deadline policy asks (the stand-in autoscaler).
        DEADLINE_ARM: ArmSpec(DEADLINE_ARM, 1, peak, 0, local, store_node=True, deadline=True),
    }
    return [table[a] for a in arms]


def job_manifest(
    base: JSON, arm: ArmSpec, epochs: int, deadline_s: float | None = None, rank_rate: float = 0.0
) -> JSON:
    job = copy.deepcopy(base)
    spec = job["spec"]
    spec["training"]["epochs"] = epochs
    spec["replicas"].update({"min": arm.replicas_min, "max": arm.replicas_max})
    spec.setdefault("placement", {})["capacityTypes"] = list(arm.worker_types)
    if arm.deadline:
        if deadline_s is None:
            raise ValueError(f"arm {arm.name}: no deadline (--deadline-seconds, or the on_demand arm first)")
        spec["deadline"] = {
            "withinSeconds": max(60, round(deadline_s)),
            "maxOnDemandWorkers": arm.replicas_max,
        }
    if rank_rate > 0:  # every arm: the same job
        env = spec["trainer"].setdefault("env", [])
        env.append({"name": "ETJ_RANK_SAMPLES_PER_SECOND", "value": str(rank_rate)})
    return job


def operator_args(arm: ArmSpec, args: argparse.Namespace) -> tuple[str, ...]:
    """The deadline policy's costs, sized for the bed (its start-ups and resizes, its poll)."""
    if not arm.deadline:
        return ()
    return (
        "--resync-seconds",
        str(args.od_resync),
        "--on-demand-startup-seconds",
        str(args.od_startup),
        "--resize-seconds",
        str(args.resize_cost),
    )


def run_arm(
    kubeconfig: Path,
    arm: ArmSpec,
    args: argparse.Namespace,
    run_dir: Path,
    base: JSON,
    deadline_s: float | None = None,
) -> JSON:
    script = Script(timeout_s=args.arm_timeout)
    instance = f"rp{arm.name.replace('_', '')[:6]}"
    for attempt in range(1, args.attempts + 1):
        replay = Replay(
            arm,
            time_scale=args.time_scale,
            notice_s=args.notice,
            horizon_s=script.timeout_s + 60,
            trace_from=args.trace_from,
            provisioner=OnDemandProvisioner(args.od_delay, args.od_idle) if arm.deadline else None,
            operator_args=operator_args(arm, args),
        )
        demo = Demo(
            kubeconfig,
            f"etj-replay-{arm.name.replace('_', '-')}",
            run_dir / (arm.name if attempt == 1 else f"{arm.name}-{attempt}"),
            job_manifest(base, arm, args.epochs, deadline_s, args.rank_rate),
            script,
            instance,
            scenario=replay,
        )
        print(
            f"replay: arm {arm.name} ({arm.replicas_min}-{arm.replicas_max} workers), attempt {attempt}",
            file=sys.stderr,
        )
        try:
            demo.start()
            result = demo.run()
        except StoreTaken as e:
            print(f"replay: arm {arm.name} abandoned: {e}", file=sys.stderr)
            continue
        except RuntimeError as e:  # set-up hiccups (a CRD not Established yet): start over
            print(f"replay: arm {arm.name} failed: {e}", file=sys.stderr)
            if attempt == args.attempts:
                raise
            continue
        finally:
            demo.cleanup(delete_job=True)
        out = summarize(arm, result, replay.log, args, replay.phases)
        out["workers_by_capacity"] = [list(b) for b in replay.by_capacity]
        if arm.deadline:
            out["deadline"] = deadline_outcome(
                result.status, out["training_s"], deadline_s, replay.by_capacity
            )
        out["attempt"] = attempt
        return out
    raise RuntimeError(f"arm {arm.name}: another job kept taking port 29400 ({args.attempts} attempts)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Long because: one flag a line, each with its default and help; the list reads best whole."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("trace", help="a trace file, or its name in the traces directory")
    p.add_argument("--traces", type=Path, help="the traces directory (default: ../shared/spot-traces)")
    p.add_argument(
        "--time-scale",
        type=float,
        default=60.0,
        help="trace seconds per bed second (60: a 5-min tick is 5 s)",
    )
    p.add_argument("--on-demand", type=int, default=1, help="on-demand nodes beside the spot ones")
    p.add_argument(
        "--spot-nodes", type=int, default=3, help="spot nodes at the trace's peak (counts are scaled)"
    )
    p.add_argument("--price-spot", type=float, default=PRICE_SPOT, help="USD per node-hour")
    p.add_argument("--price-on-demand", type=float, default=PRICE_ON_DEMAND, help="USD per node-hour")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument(
        "--start", default="busiest", help="first tick, or 'busiest': the window with most changes"
    )
    p.add_argument("--window", type=int, default=60, help="ticks in the window --start=busiest looks at")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument(
        "--notice", type=float, default=NOTICE_S, help="seconds (bed clock) before an interrupted node goes"
    )
    p.add_argument("--arm-timeout", type=float, default=480.0, help="give an arm up after this many seconds")
    p.add_argument(
        "--deadline-factor",
        type=float,
        default=1.5,
        help="etj_deadline: the deadline, times the on_demand arm's training time (run before it)",
    )
    p.add_argument("--deadline-seconds", type=float, help="etj_deadline: the deadline itself (bed seconds)")
    p.add_argument("--od-delay", type=float, default=3.0, help="stand-in autoscaler: a node's start-up (s)")
    p.add_argument("--od-idle", type=float, default=5.0, help="stand-in autoscaler: an empty node goes (s)")
    p.add_argument(
        "--od-startup", type=float, default=30.0, help="deadline policy: on-demand start-up it expects (s)"
    )
    p.add_argument("--resize-cost", type=float, default=5.0, help="deadline policy: a resize's stall (s)")
    p.add_argument("--od-resync", type=float, default=5.0, help="deadline policy: the operator's resync (s)")
    p.add_argument(
        "--rank-rate",
        type=float,
        default=0.0,
        help="ETJ_RANK_SAMPLES_PER_SECOND for every arm: throughput grows with the world (0: off)",
    )
    p.add_argument(
        "--trace-from",
        choices=("submit", "first-step"),
        default="submit",
        help="the trace's clock starts at submission, or at the job's first step",
    )
    p.add_argument(
        "--attempts", type=int, default=3, help="tries per arm when another job takes the store port"
    )
    p.add_argument("--manifest", type=Path, default=REPO / "examples" / "demo-cpu.yaml")
    p.add_argument("--run-dir", type=Path)
    p.add_argument("--out", type=Path, help="write the JSON here too")
    p.add_argument("--plot", type=Path, help="timeline PNG (default: <run dir>/timeline.png)")
    p.add_argument("--keep-cluster", action="store_true")
    return p.parse_args(argv)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def replay(kubeconfig: Path, args: argparse.Namespace, run_dir: Path) -> JSON:
    """Every arm on the cluster at ``kubeconfig``, one after the other; the report (also to ``--out``)."""
    trace = resolve_trace(args.trace, args.traces)
    start = busiest_window(trace.counts, args.window) if args.start == "busiest" else int(args.start)
    windowed = trace.window(start)
    names = [a for a in args.arms.split(",") if a]
    if DEADLINE_ARM in names and args.deadline_seconds is None:
        if "on_demand" not in names:
            raise SystemExit(f"{DEADLINE_ARM}: give --deadline-seconds, or run the on_demand arm too")
        # The deadline is a multiple of the on-demand arm's time: run that one first.
        names.sort(key=lambda n: n != "on_demand")
    arms = arm_specs(windowed, args.on_demand, args.spot_nodes, names)
    base = yaml.safe_load(args.manifest.read_text())
    print(
        f"replay: {trace.name} from tick {start}, x{args.time_scale:g}, run directory {run_dir}",
        file=sys.stderr,
    )
    t0 = time.monotonic()
    results: dict[str, JSON] = {}
    for arm in arms:
        deadline_s = args.deadline_seconds
        if arm.deadline and deadline_s is None:
            deadline_s = args.deadline_factor * (
                results["on_demand"]["training_s"] or results["on_demand"]["wall_s"]
            )
        results[arm.name] = run_arm(kubeconfig, arm, args, run_dir, base, deadline_s)
    report: JSON = {
        "trace": trace.name,
        "start_tick": start,
        "time_scale": args.time_scale,
        "on_demand_nodes": args.on_demand,
        "spot_nodes_at_peak": args.spot_nodes,
        "spot_counts_replayed": list(scaled(windowed, args.spot_nodes).counts[:40]),
        "prices_usd_per_node_hour": {"spot": args.price_spot, "on_demand": args.price_on_demand},
        "epochs": args.epochs,
        "table": table(results),
        "ratios": ratios(results),
        "arms": results,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    report["plot"] = str(write_plot(report, args.plot or run_dir / "timeline.png"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    os.environ.setdefault("ETJ_CLUSTER_NAME", "replay")
    os.environ.setdefault("ETJ_CLUSTER_PORT_BASE", "18600")
    from etj_testbed.localcluster import toolchain
    from etj_testbed.localcluster.cluster import LocalCluster

    run_dir = args.run_dir or toolchain.cache_root() / "replay" / time.strftime("%Y%m%d-%H%M%S")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    cluster = LocalCluster.named()
    try:
        report = replay(cluster.up(), args, run_dir)
    except KeyboardInterrupt:
        print("\ninterrupted: cleaning up", file=sys.stderr)
        return 130
    finally:
        if not args.keep_cluster:
            cluster.down()
    print(json.dumps(report, indent=2))
    arms = report["arms"].values()
    ok = all(a["finished"] and a["exactly_once"] for a in arms if a["arm"] != "ckpt_restart")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

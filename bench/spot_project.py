"""Projection at real scale: ResNet-50 on ImageNet, 90 epochs, 8-GPU nodes, on every spot trace.

Drives bench/economics/simulate.py with the same trace code as the real-bed replay and a job model whose
every input is listed in `ASSUMPTIONS` (value and source; the ones measured on this project's 2-core
machine say so). For each trace, the job is started every ``--every`` ticks across the whole trace and the
results averaged: etj (floor + 0-16 spot nodes), a fixed on-demand cluster of the same peak size, and a
fixed-size checkpoint-restart job on spot nodes only (16 of them, and the size that cost least).
Prints JSON, writes it to ``--out``, a markdown table to ``--markdown`` and a chart to ``--plot``.

    .venv/bin/python bench/spot_project.py [--traces DIR] [--floor 2] [--spot 16] [--every 24]
        [--price-spot 7.344 --price-on-demand 24.48] [--out F.json] [--markdown F.md] [--plot F.png]

With ``--deadlines 1.1,1.25,1.5`` it runs the deadline comparison instead (issue 28,
bench/economics/deadline_report.py): every arm against deadlines at those multiples of the on-demand
cluster's time, the job started every ``--every`` ticks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.economics import deadline_report  # noqa: E402
from bench.economics.accounting import Prices  # noqa: E402
from bench.economics.simulate import (  # noqa: E402
    Cluster,
    JobModel,
    Outcome,
    simulate_ckpt_restart,
    simulate_etj,
    simulate_on_demand,
)
from bench.economics.traces import Trace, all_traces, scaled  # noqa: E402

JSON = dict[str, Any]
IMAGENET_TRAIN = 1_281_167
EPOCHS = 90
P3_16XL_ON_DEMAND = 24.48  # USD/h, p3.16xlarge, us-east-1 Linux on-demand
SPOT_FRACTION = 0.30  # spot price as a share of on-demand (assumption, docs/economics.md)

# name → (value, source). "measured here" = this project's 2-core machine (docs/trainer.md).
ASSUMPTIONS: dict[str, tuple[float, str]] = {
    "samples": (IMAGENET_TRAIN * EPOCHS, "ImageNet-1k train set (1,281,167 images) x 90 epochs"),
    "node_throughput": (
        8322.0,
        "NVIDIA DeepLearningExamples ResNet50 v1.5 PyTorch, DGX-1 8x V100 16GB, mixed precision, 8 GPUs "
        "(p3.16xlarge: the same 8x V100 16GB with NVLink)",
    ),
    "scaling_efficiency": (
        0.90,
        "per-node efficiency beyond one node; Goyal et al. 2017 (arXiv:1706.02677) report ~90% from 8 to "
        "256 GPUs on 50 Gbit Ethernet; p3.16xlarge has 25 Gbit (assumption)",
    ),
    "startup_s": (
        60.0,
        "assumption: submission to first step with the image cached (pods, NCCL, DALI warm-up)",
    ),
    "leave_stall_s": (
        5.16,
        "0.16 s measured here (2->1 graceful leave, in place) + 5 s assumed for NCCL communicator "
        "re-creation at 100+ GPUs",
    ),
    "join_stall_s": (
        6.53,
        "1.43 s measured here (1->2 gain stall) + 5 s NCCL init (assumption) + 0.1 s peer transfer of "
        "~200 MB of ResNet-50 state over 25 Gbit",
    ),
    "node_ready_s": (120.0, "assumption: a new spot node to a ready, warm worker (node join, cached image)"),
    "restart_s": (
        108.2,
        "48.2 s measured here (torchrun defaults: SIGTERM to first step after a graceful leave) + 60 s "
        "start-up as above",
    ),
    "checkpoint_every_epochs": (
        1.0,
        "the fixed-size job checkpoints once per epoch (torchvision's classification reference does)",
    ),
}


def job_model() -> JobModel:
    a = {k: v for k, (v, _) in ASSUMPTIONS.items()}
    return JobModel(
        samples=a["samples"],
        node_throughput=a["node_throughput"],
        scaling_efficiency=a["scaling_efficiency"],
        startup_s=a["startup_s"],
        leave_stall_s=a["leave_stall_s"],
        join_stall_s=a["join_stall_s"],
        node_ready_s=a["node_ready_s"],
        restart_s=a["restart_s"],
        checkpoint_every_s=0.0,  # set per size: one epoch at that size
    )


def epoch_s(job: JobModel, nodes: int) -> float:
    return IMAGENET_TRAIN / job.throughput(nodes)


def summarize(outcomes: list[Outcome]) -> JSON:
    done = [o for o in outcomes if o.finished]
    pool = done or outcomes
    return {
        "runs": len(outcomes),
        "finished": len(done),
        "time_h_mean": round(statistics.mean(o.time_s for o in pool) / 3600, 3),
        "time_h_max": round(max(o.time_s for o in pool) / 3600, 3),
        "cost_usd_mean": round(statistics.mean(o.cost_usd for o in pool), 2),
        "cost_usd_mean_if_released": round(statistics.mean(o.cost_usd - o.idle_cost_usd for o in pool), 2),
        "goodput_mean": round(statistics.mean(o.goodput for o in pool), 4),
        "interruptions_mean": round(statistics.mean(o.interruptions for o in pool), 2),
        "node_hours_mean": {
            k: round(statistics.mean(o.node_s[k] for o in pool) / 3600, 2) for k in ("spot", "on-demand")
        },
        "badput_h_mean": {
            k: round(statistics.mean(o.badput_s.get(k, 0.0) for o in pool) / 3600, 4)
            for k in outcomes[0].badput_s
        },
    }


def project(trace: Trace, job: JobModel, cluster: Cluster, every: int, sizes: list[int]) -> JSON:
    spot = scaled(trace, cluster.max_spot)
    starts = list(range(0, len(spot.counts), every))
    horizon = len(spot.counts)
    etj = [simulate_etj(spot, s, job, cluster, horizon) for s in starts]
    od = simulate_on_demand(job, cluster, cluster.peak)
    ckpt: dict[int, JSON] = {}
    for n in sizes:
        sized = replace(job, checkpoint_every_s=epoch_s(job, n))
        ckpt[n] = summarize([simulate_ckpt_restart(spot, s, sized, cluster, n, horizon) for s in starts])
    finishing = {n: c for n, c in ckpt.items() if c["finished"] == c["runs"]}
    # The size a team would pick: the cheapest, counting only what it pays while it trains (kindest to it).
    best = min(finishing, key=lambda n: finishing[n]["cost_usd_mean_if_released"]) if finishing else None
    out: JSON = {
        "trace": trace.name,
        "mean_spot_nodes_offered": round(statistics.mean(spot.counts), 2),
        "starts": len(starts),
        "etj": summarize(etj),
        "on_demand": summarize([od]),
        "ckpt_restart": {str(n): c for n, c in ckpt.items()},
        "ckpt_restart_best_size": best,
    }
    e, o = out["etj"], out["on_demand"]
    out["ratios"] = {
        "etj_vs_on_demand": {
            "cost": round(e["cost_usd_mean"] / o["cost_usd_mean"], 3),
            "time": round(e["time_h_mean"] / o["time_h_mean"], 3),
        },
    }
    candidates: list[tuple[str, int | None]] = [("peak", cluster.max_spot), ("best", best)]
    for label, size in candidates:
        if size is None or str(size) not in out["ckpt_restart"]:
            continue
        c = out["ckpt_restart"][str(size)]
        out["ratios"][f"etj_vs_ckpt_restart_{label}"] = {
            "nodes": size,
            "cost": round(e["cost_usd_mean"] / c["cost_usd_mean"], 3),
            "cost_vs_released": round(e["cost_usd_mean"] / c["cost_usd_mean_if_released"], 3),
            "time": round(e["time_h_mean"] / c["time_h_mean"], 3),
            "baseline_finished": f"{c['finished']}/{c['runs']}",
        }
    return out


def markdown(report: JSON) -> str:
    lines = [
        "| trace | mean spot offered | policy | nodes | finished | time h (mean / max) | cost USD (mean) "
        "| cost if idle spot released | goodput | interruptions |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    peak = report["cluster"]["floor"] + report["cluster"]["max_spot"]
    for t in report["traces"]:
        rows = [
            ("etj", f"{report['cluster']['floor']}+0..{report['cluster']['max_spot']}", t["etj"]),
            ("on-demand", str(peak), t["on_demand"]),
        ]
        for n, c in t["ckpt_restart"].items():
            tag = " (best)" if int(n) == t["ckpt_restart_best_size"] else ""
            rows.append((f"ckpt-restart{tag}", n, c))
        for i, (policy, nodes, s) in enumerate(rows):
            lines.append(
                f"| {t['trace'] if i == 0 else ''} | {t['mean_spot_nodes_offered'] if i == 0 else ''} "
                f"| {policy} | "
                f"{nodes} | {s['finished']}/{s['runs']} | {s['time_h_mean']:.2f} / {s['time_h_max']:.2f} | "
                f"{s['cost_usd_mean']:.0f} | {s['cost_usd_mean_if_released']:.0f} | {s['goodput_mean']:.3f} "
                f"| {s['interruptions_mean']:.1f} |"
            )
    lines += [
        "",
        "| trace | etj/on-demand cost | etj/on-demand time | etj/ckpt-restart (peak) cost (held / released) "
        "| time | etj/ckpt-restart (best size) cost (held / released) | time |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in report["traces"]:
        r = t["ratios"]
        pk, bs = r.get("etj_vs_ckpt_restart_peak", {}), r.get("etj_vs_ckpt_restart_best", {})
        lines.append(
            f"| {t['trace']} | {r['etj_vs_on_demand']['cost']:.2f} | {r['etj_vs_on_demand']['time']:.2f} | "
            f"{pk.get('cost', '-')} / {pk.get('cost_vs_released', '-')} | {pk.get('time', '-')} | "
            f"{bs.get('cost', '-')} / {bs.get('cost_vs_released', '-')} ({bs.get('nodes', '-')} nodes) "
            f"| {bs.get('time', '-')} |"
        )
    return "\n".join(lines) + "\n"


def write_plot(report: JSON, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = report["traces"]
    names = [t["trace"].replace("_v100_1", "") for t in traces]
    peak = str(report["cluster"]["max_spot"])
    series = {
        "etj": [t["etj"] for t in traces],
        "on-demand": [t["on_demand"] for t in traces],
        f"ckpt-restart ({peak} spot nodes)": [t["ckpt_restart"][peak] for t in traces],
        "ckpt-restart (best size)": [
            t["ckpt_restart"][str(t["ckpt_restart_best_size"])]
            if t["ckpt_restart_best_size"]
            else t["ckpt_restart"][peak]
            for t in traces
        ],
    }
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.2
    for k, (label, rows) in enumerate(series.items()):
        xs = [i + (k - 1.5) * width for i in range(len(traces))]
        axes[0].bar(xs, [r["cost_usd_mean"] for r in rows], width, label=label)
        axes[1].bar(xs, [r["time_h_mean"] for r in rows], width, label=label)
    for ax, title in zip(
        axes, ("cost per run (USD, mean over start times)", "time to train (h, mean)"), strict=True
    ):
        ax.set_xticks(range(len(traces)), names, rotation=15, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle("ResNet-50 / ImageNet, 90 epochs, p3.16xlarge: projection on the spot traces")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sensitivity(job: JobModel, args: argparse.Namespace) -> str:
    """etj's cost and time ratios against on-demand and the 16-node fixed job on spot, per trace, for
    on-demand floors of 0-4 nodes and spot at 30 % and 50 % of the on-demand price."""
    traces = all_traces(args.traces)
    lines = [
        "| floor | spot price | " + " | ".join(t.name.replace("_v100_1", "") for t in traces) + " |",
        "|---|---|" + "---|" * len(traces),
    ]
    for floor in (0, 1, 2, 4):
        for share in (0.3, 0.5):
            prices = Prices(round(args.price_on_demand * share, 3), args.price_on_demand)
            cluster = Cluster(floor, args.spot, prices)
            cells = []
            for t in traces:
                r = project(t, job, cluster, args.every, [args.spot])["ratios"]
                od, ck = r["etj_vs_on_demand"], r["etj_vs_ckpt_restart_peak"]
                cells.append(f"{od['cost']:.2f} / {od['time']:.1f} · {ck['cost']:.2f} / {ck['time']:.2f}")
            lines.append(f"| {floor} | {share:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def deadlines(job: JobModel, cluster: Cluster, args: argparse.Namespace) -> int:
    factors = [float(x) for x in args.deadlines.split(",")]
    # The deadline arms mix on-demand into the same peak: the on-demand cluster is floor + spot nodes.
    traces = []
    for t in all_traces(args.traces):
        starts = list(range(0, len(t.counts), args.every))
        traces.append(deadline_report.trace_report(t, job, cluster, args.floor, starts, factors))
    report: JSON = {
        "model": "ResNet-50 / ImageNet-1k, 90 epochs, p3.16xlarge (8x V100)",
        "cluster": {"peak": cluster.peak, "max_spot": cluster.max_spot, "etj_floor": args.floor},
        "prices_usd_per_node_hour": {"spot": args.price_spot, "on_demand": args.price_on_demand},
        "every_ticks": args.every,
        "factors": factors,
        "assumptions": {k: {"value": v, "source": s} for k, (v, s) in ASSUMPTIONS.items()},
        "traces": traces,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    if args.markdown:
        args.markdown.write_text(deadline_report.markdown(report))
    print(text)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--traces", type=Path, help="the traces directory (default: ../shared/spot-traces)")
    p.add_argument("--floor", type=int, default=2, help="on-demand nodes")
    p.add_argument("--spot", type=int, default=16, help="spot nodes at the trace's peak")
    p.add_argument("--every", type=int, default=24, help="start a run every this many ticks (24: 2 h)")
    p.add_argument("--price-on-demand", type=float, default=P3_16XL_ON_DEMAND, help="USD per node-hour")
    p.add_argument("--price-spot", type=float, default=round(P3_16XL_ON_DEMAND * SPOT_FRACTION, 3))
    p.add_argument(
        "--sensitivity",
        action="store_true",
        help="print a markdown table of etj's ratios for other floors and spot prices, and stop",
    )
    p.add_argument(
        "--deadlines",
        help="comma-separated multiples of the on-demand time (e.g. 1.1,1.25,1.5): run the deadline "
        "comparison of every arm instead of the projection",
    )
    p.add_argument("--out", type=Path)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--plot", type=Path)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    job = job_model()
    if args.sensitivity:
        print(sensitivity(job, args), end="")
        return 0
    cluster = Cluster(args.floor, args.spot, Prices(args.price_spot, args.price_on_demand))
    if args.deadlines:
        return deadlines(job, cluster, args)
    sizes = sorted({min(args.spot, k) for k in (4, 8, 12, 16)} | {args.spot})
    report: JSON = {
        "model": "ResNet-50 / ImageNet-1k, 90 epochs, p3.16xlarge (8x V100)",
        "cluster": {"floor": args.floor, "max_spot": args.spot},
        "prices_usd_per_node_hour": {"spot": args.price_spot, "on_demand": args.price_on_demand},
        "assumptions": {k: {"value": v, "source": s} for k, (v, s) in ASSUMPTIONS.items()},
        "traces": [project(t, job, cluster, args.every, sizes) for t in all_traces(args.traces)],
    }
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(report))
    if args.plot:
        write_plot(report, args.plot)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

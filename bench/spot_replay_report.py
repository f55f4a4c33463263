"""bench/spot_replay.py's report: an arm's run summarized (goodput, cost, the capacity it was offered),
the deadline arm's outcome, the ratios between arms, the table and the plot."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.economics.accounting import (
    Poll,
    Prices,
    cost,
    cost_curve,
    goodput,
    node_seconds,
)
from bench.spot_replay_scenario import ArmSpec, CapacityLog

from etj_operator.timeutil import parse_time
from etj_testbed.demo.script import DemoResult

JSON = dict[str, Any]
DEADLINE_ARM = "etj_deadline"


def summarize(
    arm: ArmSpec, result: DemoResult, log: CapacityLog, args: argparse.Namespace, phases: list[str | None]
) -> JSON:
    from bench.chaos import check_samples

    from etj_testbed.demo.view import logged_accuracy

    status = result.status.get("status") or {}
    finished = result.phase == "Succeeded"
    end = result.samples[-1]["t"] if result.samples else 0.0
    prices = Prices(args.price_spot, args.price_on_demand)
    seconds = node_seconds(log.spans, end)
    phases = phases + [None] * (len(result.samples) - len(phases))
    polls = [
        Poll(s["t"], int(s["world"] or 0), s["step"], waiting=phase == "Pending")
        for s, phase in zip(result.samples, phases, strict=False)
    ]
    gp = goodput(polls, arm.replicas_min, end)
    accuracy = (status.get("progress") or {}).get("accuracy")
    if accuracy is None:
        accuracy = logged_accuracy(result.run_dir)
    samples = check_samples(result.run_dir, args.epochs) if finished else None
    return {
        "arm": arm.name,
        "replicas": [arm.replicas_min, arm.replicas_max],
        "finished": finished,
        "phase": result.phase,
        "wall_s": round(end, 1),
        "trace_hours": round(end * args.time_scale / 3600, 3),
        "node_seconds": {k: round(v, 1) for k, v in seconds.items()},
        "node_hours_trace": {k: round(v * args.time_scale / 3600, 3) for k, v in seconds.items()},
        "cost_usd": round(cost(seconds, prices, args.time_scale), 3),
        **gp.as_json(),
        "accuracy": accuracy,
        "training_s": training_s(result.status),
        "exactly_once": None if samples is None else samples["ok"],
        "sample_problems": None if samples is None else samples["problems"],
        "resizes": [
            {k: r.get(k) for k in ("from", "to", "reason", "pauseSeconds", "stepsLost")}
            for r in status.get("resizeHistory") or []
        ],
        "failures": status.get("failures"),
        "run_dir": str(result.run_dir),
        "events": [{"t": round(t, 1), "what": w} for t, w in result.events],
        # For the plot: the poll series, the capacity offered and the accumulated cost.
        "series": {
            "t": [round(s["t"], 1) for s in result.samples],
            "world": [s["world"] for s in result.samples],
            "step": [s["step"] for s in result.samples],
            "phase": phases[: len(result.samples)],
            "sps": [s["sps"] for s in result.samples],
            "cost": [
                round(c, 4)
                for c in cost_curve(log.spans, [s["t"] for s in result.samples], prices, args.time_scale)
            ],
            "offered": [list(o) for o in log.offered],
        },
    }


def training_s(job: JSON) -> float | None:
    """status.startTime (the first worker trains) to completionTime: what spec.deadline.withinSeconds
    counts."""
    st = job.get("status") or {}
    start, end = parse_time(st.get("startTime")), parse_time(st.get("completionTime"))
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 1)


def deadline_outcome(
    job: JSON, took: float | None, deadline_s: float | None, by_capacity: list[tuple[float, int, int]]
) -> JSON:
    """Was the deadline met (``took``: the arm's training_s); what the policy last said; how many
    on-demand workers there were at most."""
    st = job.get("status") or {}
    return {
        "within_s": deadline_s,
        "training_s": took,
        "met": took is not None and deadline_s is not None and took <= deadline_s,
        "schedule": st.get("schedule"),
        "cost": st.get("cost"),
        "most_on_demand_workers": max((od for _, _, od in by_capacity), default=0),
        # The resizes the policy's drains named: a release that coincides with spot workers joining
        # changes no world size and is not among them (issue 36). What the policy released is recorded
        # with the decision, in status.schedule.onDemandReleased.
        "on_demand_reasons": [
            r.get("reason") for r in st.get("resizeHistory") or [] if "OnDemand" in str(r.get("reason"))
        ],
        "on_demand_released": list((st.get("schedule") or {}).get("onDemandReleased") or []),
    }


def ratios(arms: dict[str, JSON]) -> JSON:
    out: JSON = {}
    pairs = [("etj", b) for b in ("on_demand", "ckpt_restart")] + [(DEADLINE_ARM, "on_demand")]
    for name, base in pairs:
        etj, other = arms.get(name), arms.get(base)
        if etj is None or other is None:
            continue
        out[f"{name}_vs_{base}"] = {
            "cost": round(etj["cost_usd"] / other["cost_usd"], 3) if other["cost_usd"] else None,
            "time": round(etj["wall_s"] / other["wall_s"], 3) if other["wall_s"] else None,
            # An unfinished baseline's time and cost are lower bounds: the ratios are then upper bounds.
            "baseline_finished": other["finished"],
        }
    return out


def table(arms: dict[str, JSON]) -> list[JSON]:
    keys = ("arm", "finished", "wall_s", "trace_hours", "cost_usd", "goodput", "accuracy", "exactly_once")
    return [{k: a[k] for k in keys} for a in arms.values()]


def write_plot(report: JSON, path: Path) -> Path:
    """Capacity offered and world size, throughput, accumulated cost, per arm, against time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = report["arms"]
    fig, axes = plt.subplots(3, 1, sharex=True, figsize=(10, 7.5))
    colors = {
        "etj": "tab:blue",
        "ckpt_restart": "tab:orange",
        "on_demand": "tab:green",
        DEADLINE_ARM: "tab:red",
    }
    etj = arms.get("etj") or next(iter(arms.values()))
    offered = etj["series"]["offered"]
    if offered:
        t_end = max(a["wall_s"] for a in arms.values())
        xs = [o[0] for o in offered] + [t_end]
        total = [o[1] + o[2] for o in offered]
        axes[0].fill_between(
            xs,
            [*total, total[-1]],
            step="post",
            alpha=0.15,
            color="grey",
            label="nodes offered (spot + on-demand)",
        )
        od = [o[2] for o in offered]
        axes[0].fill_between(
            xs, [*od, od[-1]], step="post", alpha=0.25, color="tab:green", label="on-demand floor"
        )
    for name, arm in arms.items():
        s = arm["series"]
        axes[0].plot(
            s["t"], s["world"], drawstyle="steps-post", color=colors.get(name), label=f"world size: {name}"
        )
        pts = [(t, v) for t, v in zip(s["t"], s["sps"], strict=True) if v is not None]
        if pts:
            axes[1].plot(*zip(*pts, strict=True), color=colors.get(name), label=name)
        axes[2].plot(s["t"], s["cost"], color=colors.get(name), label=f"{name}: ${arm['cost_usd']:.2f}")
    axes[0].set_ylabel("nodes / workers")
    axes[1].set_ylabel("samples/s")
    axes[2].set_ylabel("cost so far (USD)")
    axes[2].set_xlabel(f"seconds since submission (1 s = {report['time_scale']:g} s of trace time)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"spot replay: {report['trace']} from tick {report['start_tick']}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

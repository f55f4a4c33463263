"""Deadline bookkeeping around the pure policy (decide/deadline/policy.py): what the planner feeds it and what
status shows (projected finish, slack, workers by capacity type, cost so far). Pure: no clocks, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from etj_operator.api.models import (
    CostStatus,
    ElasticTrainingJobSpec,
    ElasticTrainingJobStatus,
    ScheduleStatus,
    WorkersByCapacity,
)
from etj_operator.api.schedule import DEFAULT_PRICE_ON_DEMAND, DEFAULT_PRICE_SOURCE, DEFAULT_PRICE_SPOT
from etj_operator.decide.deadline.policy import DeadlineDecision, DeadlineInputs, Throughput, decide


@dataclass(frozen=True)
class PriceDefaults:
    """The operator's prices (the chart's ``prices``) for jobs whose spec gives none, and their source."""

    spot: float = DEFAULT_PRICE_SPOT
    on_demand: float = DEFAULT_PRICE_ON_DEMAND
    source: str = DEFAULT_PRICE_SOURCE


@dataclass(frozen=True)
class DeadlineCosts:
    """Operator settings the policy needs: what a change costs the job (the chart's ``deadline`` values)."""

    on_demand_startup_s: float = 180.0  # ask for an on-demand node -> its worker trains (node boot, image)
    resize_s: float = 30.0  # a resize's stall, rendezvous included
    decision_interval_s: float = 30.0  # the resync: the policy looks at least this often


def prices(spec: ElasticTrainingJobSpec, defaults: PriceDefaults) -> tuple[float, float, str]:
    """(spot, on-demand) USD per worker-hour and where they come from."""
    p = spec.prices
    spot = p.spot_per_hour if p.spot_per_hour is not None else defaults.spot
    on_demand = p.on_demand_per_hour if p.on_demand_per_hour is not None else defaults.on_demand
    if p.spot_per_hour is not None and p.on_demand_per_hour is not None:
        source = "spec.prices"
    elif p.spot_per_hour is not None or p.on_demand_per_hour is not None:
        source = f"spec.prices and {defaults.source}"
    else:
        source = defaults.source
    return spot, on_demand, source


def add_cost(
    prev: CostStatus | None,
    workers: WorkersByCapacity,
    spec: ElasticTrainingJobSpec,
    defaults: PriceDefaults,
    now: datetime,
) -> CostStatus:
    """The cost so far: the previous total plus the workers running now over the time since it was added
    up (the reconcile loop runs at least every resync, so a change is billed at most one resync wrong)."""
    spot_price, od_price, source = prices(spec, defaults)
    if prev is None or prev.update_time is None:
        return CostStatus(price_source=source, update_time=now)
    seconds = max(0.0, (now - prev.update_time).total_seconds())
    spot_s = prev.spot_worker_seconds + workers.spot * seconds
    od_s = prev.on_demand_worker_seconds + workers.on_demand * seconds
    usd = prev.usd + (workers.spot * spot_price + workers.on_demand * od_price) * seconds / 3600.0
    return CostStatus(
        usd=round(usd, 4),
        spot_worker_seconds=round(spot_s, 1),
        on_demand_worker_seconds=round(od_s, 1),
        price_source=source,
        update_time=now,
    )


def deadline_at(spec: ElasticTrainingJobSpec, status: ElasticTrainingJobStatus) -> datetime | None:
    """The absolute deadline; a duration counts from status.startTime (None until the job has started)."""
    d = spec.deadline
    if d is None:
        return None
    if d.finish_by is not None:
        return d.finish_by
    if status.start_time is None or d.within_seconds is None:
        return None
    return status.start_time + timedelta(seconds=d.within_seconds)


def throughput(status: ElasticTrainingJobStatus, procs_per_worker: int, running: int) -> Throughput:
    """Samples/s by world size from the trainer's last report: measured at the world of that report, and
    per worker (linear) elsewhere. Zero when nothing has been measured: the policy then keeps what the job
    has.

    The report's own world (status.worldSize, in ranks) is the size the rate belongs to, not the workers
    running now: when every spot worker has just gone, none runs, and the rate they measured is exactly
    what the policy needs to size the on-demand workers that replace them."""
    rate = status.progress.samples_per_second if status.progress else None
    measured_at = (status.world_size or 0) // max(1, procs_per_worker) or running
    if not rate or measured_at <= 0:
        return Throughput(per_worker=0.0)
    return Throughput(per_worker=rate / measured_at, measured={measured_at: rate})


@dataclass(frozen=True)
class Standing:
    """Where the job is, for the policy: by capacity type, what runs and what could run now."""

    spot_running: int
    spot_free: int  # more spot workers that fit on Ready spot nodes now
    on_demand: int  # on-demand workers running or starting (pending pods pinned to on-demand count:
    # the autoscaler provisions their nodes, so that capacity is real)
    on_demand_running: int = 0  # of which running: with the spot ones, the world the rate was measured at


def schedule(
    spec: ElasticTrainingJobSpec,
    status: ElasticTrainingJobStatus,
    standing: Standing,
    costs: DeadlineCosts,
    now: datetime,
) -> tuple[ScheduleStatus | None, DeadlineDecision | None]:
    """status.schedule and the policy's decision (None without a deadline, or before the job starts)."""
    deadline = deadline_at(spec, status)
    if deadline is None or status.start_time is None:
        return (ScheduleStatus(deadline=deadline, reason="NotStarted") if deadline else None), None
    progress = status.progress
    done = float(progress.samples_seen or 0) if progress else 0.0
    total = float(progress.samples_total or 0) if progress else 0.0
    running = standing.spot_running + standing.on_demand_running
    wanted_cap = spec.deadline.max_on_demand_workers if spec.deadline is not None else None
    cap = spec.replicas.max if wanted_cap is None else wanted_cap
    if total <= 0:
        return ScheduleStatus(deadline=deadline, reason="NoProgressReported"), None
    choice = decide(
        DeadlineInputs(
            samples_done=done,
            samples_total=total,
            elapsed_s=(now - status.start_time).total_seconds(),
            time_left_s=(deadline - now).total_seconds(),
            spot=standing.spot_running + standing.spot_free,
            on_demand=standing.on_demand,
            max_workers=spec.replicas.max,
            max_on_demand=cap,
            rate=throughput(status, spec.procs_per_worker, running),
            resize_s=costs.resize_s,
            on_demand_startup_s=costs.on_demand_startup_s,
            decision_interval_s=costs.decision_interval_s,
        )
    )
    finish = None
    if choice.projected_finish_s != float("inf"):
        finish = now + timedelta(seconds=round(choice.projected_finish_s))
    return (
        ScheduleStatus(
            deadline=deadline,
            projected_finish=finish,
            slack_seconds=round(choice.slack_s),
            on_demand_wanted=choice.on_demand,
            reason=str(choice.why),
        ),
        choice,
    )

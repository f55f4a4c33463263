"""The planner's steps for a job that goes through Kueue (docs/kueue.md; decide/kueue/admission.py decides).

Kueue admits Workloads, not pods: no worker runs before the job's base Workload is admitted, each worker
runs on an admitted seat and on its flavor's nodes, and a worker whose extra seat Kueue evicts leaves the
way a spot interruption's worker does (graceful, the others go on: a shrink in place). Each step is a no-op
for a job outside Kueue (``job.kueue`` None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from etj_operator.api.models import CapacityType, ElasticTrainingJobStatus, Phase
from etj_operator.decide.deadline.on_demand import CapacityPlan, capacity_of, manages_on_demand
from etj_operator.decide.kueue.admission import (
    OnDemand,
    Seats,
    WorkloadWant,
    capacity_pin,
    gate,
    on_demand_seats_of,
    open_seats,
    surplus_on_demand,
    unseated,
)
from etj_operator.decide.kueue.admission import workload_changes as changes_of
from etj_operator.decide.kueue.condition import (
    admitted_verdict,
    on_demand_quota_verdict,
    with_kueue_condition,
    with_quota_condition,
)
from etj_operator.decide.objects.placement import SeatPlacement
from etj_operator.decide.objects.workloads import BASE_SEAT, workload_name
from etj_operator.decide.plan.model import JobView, Observed, StepResult, Verdict
from etj_operator.decide.plan.slots import free_slots
from etj_operator.decide.types import Drain
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason

# Stops that release the job's quota: every Workload goes once no worker is left. A base Kueue evicted is
# one of them: it is queued again, as a new Workload, after the workers left.
RELEASING = frozenset({Reason.FINISHED, Reason.FAILED, Reason.SUSPENDED, Reason.KUEUE_EVICTED})


def seats_of(job: JobView, obs: Observed) -> Seats:
    """The job's Workloads; a job no longer in a queue (its label removed) may still have some."""
    return Seats.of(job.name, obs.workloads)


@dataclass(frozen=True, kw_only=True)
class Gated(StepResult):
    verdict: Verdict


def gate_on_admission(job: JobView, seats: Seats, verdict: Verdict, survivors: Sequence[PodInfo]) -> Gated:
    """A job whose base Workload is not admitted (queued, or evicted) keeps no worker and no store: the
    verdict stops it like a suspend (a checkpoint on SIGTERM, every pod released), with Kueue's words."""
    why = gate(seats) if job.kueue is not None and verdict.stop_reason is None else None
    if why is None:
        return Gated(verdict=verdict)
    reason, message = why
    drains = tuple(Drain(p.name, reason, f"worker {p.name} stopped: {message}", p.node) for p in survivors)
    return Gated(verdict=Verdict(stop_reason=reason), drains=drains)


def drain_unseated(
    job: JobView, seats: Seats, stop_reason: Reason | None, survivors: Sequence[PodInfo]
) -> StepResult:
    """Workers whose extra seat Kueue evicted (preempted for another workload, or lent quota reclaimed)
    leave gracefully: the job shrinks in place, and it is no failure (KueuePreempted counts as none)."""
    if job.kueue is None or stop_reason is not None:
        return StepResult()
    return StepResult(
        drains=tuple(
            Drain(pod.name, Reason.KUEUE_PREEMPTED, why, pod.node) for pod, why in unseated(seats, survivors)
        )
    )


@dataclass(frozen=True, kw_only=True)
class OnDemandSeats(StepResult):
    on_demand: OnDemand | None = None  # None: the job's deadline policy buys no on-demand workers
    leaving: frozenset[str] = frozenset()  # on-demand seats given up this round: no new worker on them


def on_demand_seats(
    job: JobView, obs: Observed, seats: Seats, survivors: Sequence[PodInfo], capacity: CapacityPlan
) -> OnDemandSeats:
    """The deadline policy under Kueue (docs/kueue.md, "The deadline policy asks Kueue"): its on-demand
    workers are extra seats pinned to on-demand flavors, so they go through the queue's quota like any
    worker. The policy's number, less the on-demand workers the job has on other seats (a base Kueue put
    on an on-demand flavor), is how many such seats the job holds; without a decision this round (not
    acting, no rate yet) it keeps those it has. Workers on surplus seats leave first, in place."""
    if job.kueue is None or not manages_on_demand(job.spec):
        return OnDemandSeats()
    pins = {c: capacity_pin(obs.flavors, c) for c in CapacityType}
    mine = {w.name for w in on_demand_seats_of(seats)}
    decision = capacity.decision
    wanted = len(mine)
    if decision is not None:
        elsewhere = sum(
            1
            for p in survivors
            if p.seat not in mine and p.running and capacity_of(p, obs.nodes) == CapacityType.ON_DEMAND
        )
        room = job.spec.replicas.max - job.spec.replicas.min
        wanted = max(0, min(decision.on_demand - elsewhere, room))
    leaving = frozenset(w.name for w in surplus_on_demand(seats, wanted, survivors))
    why = decision.why if decision is not None else ""
    drains = tuple(
        Drain(p.name, Reason.ON_DEMAND_RELEASED, f"on-demand worker {p.name} released first ({why})", p.node)
        for p in survivors
        if p.seat in leaving
    )
    return OnDemandSeats(on_demand=OnDemand(wanted, pins), leaving=leaving, drains=drains)


@dataclass(frozen=True, kw_only=True)
class SeatRefill(StepResult):
    create_workers: list[int] = field(default_factory=list)
    extra_workers: list[int] = field(default_factory=list)
    seats: dict[int, SeatPlacement] = field(default_factory=dict)  # slot → its seat and flavor
    startup_workers: int = 0


def seat_workers(
    job: JobView,
    obs: Observed,
    seats: Seats,
    workers: Sequence[PodInfo],
    survivors: Sequence[PodInfo],
    leaving: frozenset[str] = frozenset(),
) -> SeatRefill:
    """One new worker per admitted seat short of one (the refill under Kueue: quota, not free nodes, says
    how many), up to replicas.max; base seats first. Workers of extra seats run at the elastic-extra
    PriorityClass, as extras do without Kueue (decide/plan/sharing.py). ``leaving``: seats given up."""
    room = max(0, job.spec.replicas.max - len(survivors))
    wanted = open_seats(seats, survivors, obs.flavors, leaving)[:room]
    slots = free_slots(workers, len(wanted))
    placed = dict(zip(slots, wanted, strict=True))
    base = workload_name(job.name, BASE_SEAT)
    extra = [s for s, seat in placed.items() if seat.seat != base] if job.extra_priority_class else []
    startup = len(survivors) + len(slots) if slots else 0
    return SeatRefill(create_workers=slots, extra_workers=extra, seats=placed, startup_workers=startup)


@dataclass(frozen=True, kw_only=True)
class WorkloadPlan(StepResult):
    create: tuple[WorkloadWant, ...] = ()
    delete: tuple[str, ...] = ()


def manage_workloads(
    job: JobView,
    seats: Seats,
    workers: Sequence[PodInfo],
    stop_reason: Reason | None,
    on_demand: OnDemand | None = None,
) -> WorkloadPlan:
    """The Workloads to create and delete (decide/kueue/admission.py, workload_changes). A job taken out of
    its queue (the label removed) runs as any job and gives back what its Workloads still hold."""
    if job.kueue is None:
        return WorkloadPlan(delete=tuple(sorted(seats.names)))
    spec = job.spec
    done = changes_of(
        job.name,
        job.kueue,
        seats,
        workers,
        replicas=(spec.replicas.min, spec.replicas.max),
        released=stop_reason in RELEASING,
        on_demand=on_demand,
    )
    return WorkloadPlan(create=done.create, delete=done.delete)


@dataclass(frozen=True, kw_only=True)
class KueueStatus(StepResult):
    status: ElasticTrainingJobStatus


def kueue_status(
    job: JobView,
    seats: Seats,
    status: ElasticTrainingJobStatus,
    now: datetime,
    on_demand: OnDemand | None = None,
) -> KueueStatus:
    """KueueAdmitted on this round's status, and an Event when Kueue admits or evicts the job; for a job
    whose deadline policy buys on-demand seats, OnDemandQuota (QuotaExhausted while one waits for quota)."""
    if job.kueue is None:
        return KueueStatus(status=status)
    stopped = status.phase if status.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED) else None
    verdict = admitted_verdict(job.kueue, seats, str(stopped) if stopped is not None else None)
    conds, events = with_kueue_condition(status.conditions, verdict, generation=job.generation, now=now)
    if on_demand is not None and stopped is None:
        quota = on_demand_quota_verdict(job.kueue, seats)
        conds, more = with_quota_condition(conds, quota, generation=job.generation, now=now)
        events += more
    out = status.model_copy()
    out.conditions = conds
    return KueueStatus(status=out, events=tuple(events))

"""The planner's deadline policy steps: on-demand workers to add or release, cost and schedule status.

The numbers come from decide/deadline/on_demand.py; this turns them into drains, events and status fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from etj_operator.api.models import CapacityType, ElasticTrainingJobStatus, Phase, ScheduleStatus
from etj_operator.api.schedule import MAX_RELEASED_NAMES
from etj_operator.decide.deadline.on_demand import CapacityPlan, plan_capacity
from etj_operator.decide.deadline.policy import Why
from etj_operator.decide.deadline.schedule import add_cost
from etj_operator.decide.plan.capacity import free_capacity
from etj_operator.decide.plan.model import JobView, Observed, StepResult
from etj_operator.decide.types import Drain, KubeEvent
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason

# Cost and projection are refreshed at most this often unless the workers change: every write is a status
# patch, and one per reconcile would be a write per event for nothing.
STATUS_REFRESH = timedelta(seconds=60)


@dataclass(frozen=True, kw_only=True)
class DeadlineChanges(StepResult):
    capacity: CapacityPlan = field(default_factory=CapacityPlan)  # what the policy decided this round


def apply_deadline_policy(
    job: JobView, obs: Observed, survivors: Sequence[PodInfo], acting: bool
) -> DeadlineChanges:
    """The deadline policy's on-demand workers to add and release (decide/deadline/on_demand.py), and the
    pending spot workers that give way to them. Not ``acting`` (a stopped job, or one finishing: workers
    exited 0, the final report not read yet): nothing new starts, nothing is stopped. A Kueue job's
    decision is only passed on: its on-demand workers are Kueue seats (kueue_steps.on_demand_seats)."""
    spec = job.spec
    spot_free = (
        free_capacity(spec, obs, frozenset({CapacityType.SPOT})).total if spec.deadline is not None else 0
    )
    cap = plan_capacity(spec, job.status, survivors, obs.nodes, spot_free, job.deadline_costs, obs.now)
    if not acting or job.kueue is not None:
        # Under Kueue the policy's number goes to Kueue as on-demand seats (kueue_steps.on_demand_seats):
        # no pod is added or drained here.
        return DeadlineChanges(
            capacity=CapacityPlan(
                pin_spot=cap.pin_spot,
                schedule=cap.schedule,
                workers=cap.workers,
                decision=cap.decision if acting else None,
            )
        )
    why = cap.decision.why if cap.decision is not None else ""
    released = (
        Drain(
            pod.name,
            Reason.ON_DEMAND_RELEASED,
            f"on-demand worker {pod.name} released first ({why})",
            pod.node,
        )
        for pod in cap.release
    )
    gave_way = (
        Drain(pod.name, Reason.REPLACED_BY_ON_DEMAND, f"pending spot worker {pod.name} gives way ({why})")
        for pod in cap.give_way
    )
    return DeadlineChanges(capacity=cap, drains=(*released, *gave_way))


@dataclass(frozen=True, kw_only=True)
class ScheduleWritten(StepResult):
    status: ElasticTrainingJobStatus  # the status with workersByCapacity, cost and schedule filled in


def record_schedule(
    job: JobView, status: ElasticTrainingJobStatus, capacity: CapacityPlan, now: datetime
) -> ScheduleWritten:
    """status.workersByCapacity, cost and schedule on ``status`` (this round's, from the status step); cost
    and projection at most every STATUS_REFRESH."""
    prev = job.status
    st = status.model_copy()
    events: list[KubeEvent] = []
    st.workers_by_capacity = capacity.workers
    why = capacity.decision.why if capacity.decision is not None else ""
    if capacity.add_on_demand or capacity.release:
        slack = capacity.schedule.slack_seconds if capacity.schedule is not None else None
        events.append(
            KubeEvent(
                "Normal",
                "DeadlinePolicy",
                f"on-demand workers: +{capacity.add_on_demand} -{len(capacity.release)} "
                f"({why}, slack {slack} s)",
            )
        )
    released = [p.name for p in capacity.release]
    if released:
        # The release itself, named, whatever the running count does in the same round (issue 36).
        events.append(
            KubeEvent(
                "Normal", str(Reason.ON_DEMAND_RELEASED), f"released first: {', '.join(released)} ({why})"
            )
        )
    stale = (
        prev.cost is None or prev.cost.update_time is None or now - prev.cost.update_time >= STATUS_REFRESH
    )
    changed = prev.workers_by_capacity != capacity.workers
    if stale or changed:
        st.cost = add_cost(prev.cost, prev.workers_by_capacity or capacity.workers, job.spec, job.prices, now)
        st.schedule = capacity.schedule
    else:
        st.cost = prev.cost
        keep = prev.schedule
        new = capacity.schedule
        decided = new is not None and (
            keep is None or (keep.on_demand_wanted, keep.reason) != (new.on_demand_wanted, new.reason)
        )
        st.schedule = new if decided else keep
    st.schedule = _with_released(st.schedule, prev.schedule, released)
    if st.phase == Phase.SUCCEEDED and st.schedule is not None:
        # The policy decides from the status the round read, and the final report is often read in the
        # round that ends the job: its last word was then "AheadOfSchedule" forever (issue 36, a loaded
        # clean-clone run). A finished job's schedule says Finished, at its completion time.
        st.schedule = st.schedule.model_copy(
            update={
                "reason": str(Why.FINISHED),
                "on_demand_wanted": 0,
                "projected_finish": st.completion_time or st.schedule.projected_finish,
            }
        )
    return ScheduleWritten(status=st, events=tuple(events))


def _with_released(
    schedule: ScheduleStatus | None, prev: ScheduleStatus | None, released: list[str]
) -> ScheduleStatus | None:
    """``schedule`` carrying every release so far: the previous names plus this round's, the newest kept."""
    before = prev.on_demand_released if prev is not None else []
    if schedule is None or (schedule.on_demand_released == before and not released):
        return schedule
    names = [*before, *(n for n in released if n not in before)][-MAX_RELEASED_NAMES:]
    return schedule.model_copy(update={"on_demand_released": names})

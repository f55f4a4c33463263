"""The planner's deadline policy steps: on-demand workers to add or release, cost and schedule status.

The numbers come from decide/deadline_plan.py; this turns them into drains, events and status fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from etj_operator.api.models import CapacityType
from etj_operator.decide.capacity import free_capacity
from etj_operator.decide.deadline_plan import CapacityPlan, plan_capacity
from etj_operator.decide.plan_model import JobView, Observed, Plan
from etj_operator.decide.schedule import add_cost
from etj_operator.decide.types import Drain, KubeEvent
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason

# Cost and projection are refreshed at most this often unless the workers change: every write is a status
# patch, and one per reconcile would be a write per event for nothing.
STATUS_REFRESH = timedelta(seconds=60)


def deadline_step(
    job: JobView, obs: Observed, out: Plan, survivors: Sequence[PodInfo], acting: bool
) -> CapacityPlan:
    """The deadline policy's pod changes (decide/deadline_plan.py); drains are appended to ``out``."""
    spec = job.spec
    spot_free = (
        free_capacity(spec, obs, frozenset({CapacityType.SPOT})).total if spec.deadline is not None else 0
    )
    cap = plan_capacity(spec, job.status, survivors, obs.nodes, spot_free, job.deadline_costs, obs.now)
    if not acting:
        return CapacityPlan(pin_spot=cap.pin_spot, schedule=cap.schedule, workers=cap.workers)
    why = cap.decision.why if cap.decision is not None else ""
    for pod in cap.release:
        out.drains.append(
            Drain(
                pod.name,
                Reason.ON_DEMAND_RELEASED,
                f"on-demand worker {pod.name} released first ({why})",
                pod.node,
            )
        )
    for pod in cap.give_way:
        out.drains.append(
            Drain(pod.name, Reason.REPLACED_BY_ON_DEMAND, f"pending spot worker {pod.name} gives way ({why})")
        )
    return cap


def schedule_status(job: JobView, out: Plan, capacity: CapacityPlan, now: datetime) -> None:
    """status.workersByCapacity, cost and schedule; cost and projection at most every STATUS_REFRESH."""
    prev = job.status
    st = out.status
    st.workers_by_capacity = capacity.workers
    if capacity.add_on_demand or capacity.release:
        why = capacity.decision.why if capacity.decision is not None else ""
        slack = capacity.schedule.slack_seconds if capacity.schedule is not None else None
        out.events.append(
            KubeEvent(
                "Normal",
                "DeadlinePolicy",
                f"on-demand workers: +{capacity.add_on_demand} -{len(capacity.release)} "
                f"({why}, slack {slack} s)",
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

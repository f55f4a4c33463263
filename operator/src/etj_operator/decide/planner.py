"""The pure planner: observed state in, a plan out. No Kubernetes calls, no clocks, no globals.

``plan()`` is level-based: given the same observation it returns the same plan, so the operator can run
it after every event, after a restart, or twice in a row without creating duplicates. Everything the
decision needs (job, nodes, pods, GPUs in use, progress, the time) is passed in.

The decision is a chain of small named steps (plan_steps.STEPS) over one context: each reads what the
steps before it settled and adds to the partial plan. This module is the planner's front door: the
reconciler and the tests import the inputs, the plan and ``plan`` from here.
"""

from __future__ import annotations

from etj_operator.decide.capacity import FreeCapacity, free_capacity, worker_demand
from etj_operator.decide.finish import FINAL_REPORT_MISSING
from etj_operator.decide.interruptions import (
    NODE_MISSING_GRACE,
    NOT_READY_GRACE,
    STORE_STAYS_ON,
    interruption_of,
)
from etj_operator.decide.plan_deadline import STATUS_REFRESH
from etj_operator.decide.plan_model import (
    FINAL_REPORT_GRACE,
    JobView,
    Observed,
    Plan,
    store_image,
    trainer_image,
)
from etj_operator.decide.plan_steps import STEPS, PlanContext
from etj_operator.decide.slots import next_rendezvous_index

__all__ = [
    "FINAL_REPORT_GRACE",
    "FINAL_REPORT_MISSING",
    "NODE_MISSING_GRACE",
    "NOT_READY_GRACE",
    "STATUS_REFRESH",
    "STORE_STAYS_ON",
    "FreeCapacity",
    "JobView",
    "Observed",
    "Plan",
    "free_capacity",
    "interruption_of",
    "next_rendezvous_index",
    "plan",
    "store_image",
    "trainer_image",
    "worker_demand",
]


def plan(job: JobView, obs: Observed) -> Plan:
    """One reconcile's decisions: every step of ``STEPS`` in order over one context, then its plan."""
    context = PlanContext(job, obs)
    for step in STEPS:
        step(context)
    return context.out

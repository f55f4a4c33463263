"""The pure planner: observed state in, a plan out. No Kubernetes calls, no clocks, no globals.

``plan()`` is level-based: given the same observation it returns the same plan, so the operator can run
it after every event, after a restart, or twice in a row without creating duplicates. Everything the
decision needs (job, nodes, pods, GPUs in use, progress, the time) is passed in.

The decision is a chain of small named steps, in drain_steps.py, judge_steps.py, deadline_steps.py,
create_steps.py and status_step.py. Each takes what it reads as parameters and returns what it decides (a
``StepResult``: drains, Events, when to look again, and its own typed decision); ``plan()`` merges each into
the plan and passes it on, so the order of the calls below is the data flow. This module is the planner's
front door: the reconciler and the tests import the inputs, the plan and ``plan`` from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from etj_operator.decide.plan import drain_steps as drain
from etj_operator.decide.plan import judge_steps as judge
from etj_operator.decide.plan import kueue_steps as kueue
from etj_operator.decide.plan.capacity import FreeCapacity, LazyCapacity, free_capacity, worker_demand
from etj_operator.decide.plan.create_steps import place_rendezvous, refill_workers, resolve_image
from etj_operator.decide.plan.deadline_steps import STATUS_REFRESH, apply_deadline_policy, record_schedule
from etj_operator.decide.plan.finish import FINAL_REPORT_MISSING
from etj_operator.decide.plan.interruptions import (
    NODE_MISSING_GRACE,
    NOT_READY_GRACE,
    STORE_STAYS_ON,
    interruption_of,
)
from etj_operator.decide.plan.model import (
    FINAL_REPORT_GRACE,
    JobPods,
    JobView,
    Observed,
    Plan,
    StepResult,
    remaining,
    store_image,
    trainer_image,
)
from etj_operator.decide.plan.slots import next_rendezvous_index
from etj_operator.decide.plan.status_step import Judged, write_status
from etj_operator.observe.pods import PodInfo

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
    """One reconcile's decisions: each step is given what the steps before it decided, and its result is
    merged into the plan (``Plan.take``) in this order: what is going away, what crashed, how the job
    stands, which workers stop, what to create, where the store runs, what status says, when it expires.

    Long because: the steps' data flow is the point, and it reads top to bottom only in one function.
    """
    spec, prev, now, out = job.spec, job.status, obs.now, Plan()
    pods = JobPods.of(obs.pods)
    # What is going away, and what crashed.
    survivors = _drained(out, pods.active, drain.drain_interrupted(pods.active, obs))
    out.take(drain.recheck_not_ready(pods.active, obs))
    crashed = drain.drain_crashed(pods.workers, obs, prev.phase)
    out.take(crashed)
    # How the job stands.
    failures = judge.count_failures(spec, prev, out.drains, crashed.new_failures, now)
    out.new_failures = failures.new
    crashes = judge.count_crashes(prev, obs.progress, out.drains, now)
    out.take(crashes)
    outcome = judge.judge_outcome(spec, prev, pods.workers, obs, failures)
    out.take(outcome)
    started = judge.judge_start_blocks(spec, prev, outcome.verdict, pods, survivors, now)
    out.take(started)
    # A Kueue job runs only while its base Workload is admitted (decide/plan/kueue_steps.py).
    seats = kueue.seats_of(job, obs)
    gated = kueue.gate_on_admission(job, seats, started.verdict, survivors)
    survivors = _drained(out, survivors, gated)
    verdict = gated.verdict
    avoided = judge.avoid_failed_nodes(spec, prev, out.drains, verdict.terminal, now)
    out.take(avoided)
    out.avoid_nodes = avoided.names
    # Which workers stop.
    stop = verdict.stop_reason
    survivors = _drained(out, survivors, drain.stop_workers(stop, survivors))
    survivors = _drained(out, survivors, kueue.drain_unseated(job, seats, stop, survivors))
    trimmed = drain.trim_to_max(spec.replicas.max, prev.desired_replicas, stop, survivors)
    survivors = _drained(out, survivors, trimmed)
    survivors = _drained(out, survivors, drain.recreate_stale_avoiders(stop, out.avoid_nodes, survivors))
    # What to create: images, the deadline policy's on-demand workers, the refill, the store.
    images = resolve_image(job)
    out.trainer_image, out.store_image = images.trainer, images.store
    acting = stop is None and not outcome.finish.awaiting_report
    deadline = apply_deadline_policy(job, obs, survivors, acting)
    survivors = _drained(out, survivors, deadline)
    # Under Kueue the quota says how many workers run (no refill by free nodes), and the deadline policy's
    # on-demand workers are seats pinned to on-demand flavors.
    on_demand = kueue.on_demand_seats(job, obs, seats, survivors, deadline.capacity)
    survivors = _drained(out, survivors, on_demand)
    room = LazyCapacity(spec, obs, frozenset(out.avoid_nodes))  # free capacity, computed once if needed
    if acting and images.trainer is not None and job.kueue is not None:
        seated = kueue.seat_workers(job, obs, seats, pods.workers, survivors, on_demand.leaving)
        out.take(seated)
        out.create_workers, out.extra_workers = seated.create_workers, seated.extra_workers
        out.worker_seats, out.startup_workers = seated.seats, seated.startup_workers
    elif acting and images.trainer is not None:
        refill = refill_workers(job, now, pods.workers, survivors, out.drains, deadline.capacity, room)
        out.take(refill)
        out.create_workers, out.create_on_demand = refill.create_workers, refill.create_on_demand
        out.extra_workers, out.pin_spot = refill.extra_workers, refill.pin_spot
        out.startup_workers = refill.startup_workers
    store = place_rendezvous(job, pods, obs, stop, images.store)
    out.take(store)
    out.rendezvous_capacity, out.ensure_service = store.capacity, store.ensure_service
    out.serve_rendezvous, out.create_rendezvous = store.serve, store.create is not None
    out.rendezvous_index = store.create or 0
    # What status says, and when a finished job expires.
    judged = Judged(verdict, outcome.finish, failures, crashes.crashes, started.start, avoided)
    written = write_status(job, obs, pods, survivors, out.drains, judged, images.trainer, room)
    out.take(written)
    schedule = record_schedule(job, written.status, deadline.capacity, now)
    out.take(schedule)
    out.status = schedule.status
    admitted = kueue.kueue_status(job, seats, out.status, now, on_demand.on_demand)
    out.take(admitted)
    out.status = admitted.status
    workloads = kueue.manage_workloads(job, seats, pods.workers, stop, on_demand.on_demand)
    out.take(workloads)
    out.create_workloads, out.delete_workloads = list(workloads.create), list(workloads.delete)
    out.take(judge.warn_report_missing(outcome.finish, prev))
    expiry = judge.expire_ttl(spec, verdict.terminal, out.status.completion_time, now)
    out.take(expiry)
    out.delete_job = expiry.delete_job
    return out


def _drained(out: Plan, survivors: Sequence[PodInfo], step: StepResult) -> tuple[PodInfo, ...]:
    """Merge a draining step into ``out``; the survivors after it."""
    out.take(step)
    return remaining(survivors, step.drains)

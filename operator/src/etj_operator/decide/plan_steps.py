"""The planner's steps: small pure functions over one ``PlanContext``, run in the order of ``STEPS``.

Each step reads what the steps before it settled (drains, survivors, the stop reason) and adds to the
partial plan; none does I/O or reads a clock. The order is the decision's order: drain what is going
away, count crashes, judge the outcome, stop or trim workers, refill, place the store, write status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from etj_operator.api.models import ElasticTrainingJobSpec, ElasticTrainingJobStatus, Phase
from etj_operator.api.status import AvoidedNode
from etj_operator.decide.bad_nodes import AVOIDING_NODE, avoid_nodes, budget_failures, record_failures
from etj_operator.decide.capacity import LazyCapacity
from etj_operator.decide.crash_loop import judge_crashes, stall_wake_in
from etj_operator.decide.deadline_plan import CapacityPlan
from etj_operator.decide.finish import FINAL_REPORT_MISSING, Finish, finish
from etj_operator.decide.interruptions import interruption_of, not_ready_wait
from etj_operator.decide.job_status import StatusInputs, build_status, stalled_seconds
from etj_operator.decide.plan_deadline import deadline_step, schedule_status
from etj_operator.decide.plan_model import JobView, Observed, Plan, store_image, trainer_image
from etj_operator.decide.refill import workers_to_add
from etj_operator.decide.sharing import extra_slots
from etj_operator.decide.slots import free_slots, next_rendezvous_index
from etj_operator.decide.store_move import plan_store
from etj_operator.decide.types import Drain, KubeEvent
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import INTERRUPTIONS, Reason


@dataclass
class PlanContext:
    """One reconcile's inputs, its partial plan, and the facts the steps settle for the steps after them."""

    job: JobView
    obs: Observed
    out: Plan = field(default_factory=Plan)
    workers: list[PodInfo] = field(default_factory=list)
    rdzv: list[PodInfo] = field(default_factory=list)
    active: list[PodInfo] = field(default_factory=list)  # active workers
    survivors: list[PodInfo] = field(default_factory=list)  # active workers no step drains (yet)
    failures: int = 0  # the job's failures, this reconcile's included
    failure_times: list[datetime] = field(default_factory=list)  # status.failureTimes, this reconcile's in
    budget_failures: int = 0  # those that count against maxFailures (failureWindowSeconds)
    avoided: list[AvoidedNode] = field(default_factory=list)  # status.avoidedNodes
    crash_times: list[datetime] = field(default_factory=list)  # status.crashTimes, this reconcile's in
    crash_looping: bool = False
    crash_detail: str = ""  # the newest crash's cause
    outcome: Finish = field(default_factory=Finish)
    failed: bool = False
    terminal: bool = False  # Failed or Succeeded
    stop_reason: Reason | None = None  # why every worker stops (finished, failed, suspended); None: none
    capacity: CapacityPlan = field(default_factory=CapacityPlan)
    lazy: LazyCapacity = field(init=False)  # free capacity, computed once if a step needs it

    def __post_init__(self) -> None:
        self.workers = [p for p in self.obs.pods if p.role == "worker"]
        self.rdzv = [p for p in self.obs.pods if p.role == "rendezvous"]
        self.active = [p for p in self.workers if p.active]
        self.survivors = list(self.active)
        self.failures = self.job.status.failures or 0
        # Free capacity costs a pass over every node; it is computed only when a decision needs it.
        self.lazy = LazyCapacity(self.job.spec, self.obs)

    @property
    def spec(self) -> ElasticTrainingJobSpec:
        return self.job.spec

    @property
    def prev(self) -> ElasticTrainingJobStatus:
        return self.job.status

    @property
    def live_rdzv(self) -> list[PodInfo]:
        return [p for p in self.rdzv if p.active]


Step = Callable[[PlanContext], None]


def drain_interrupted(c: PlanContext) -> None:
    """Drain every active worker whose node (or the pod itself) is going away."""
    draining: set[str] = set()
    for pod in c.active:
        sig = interruption_of(pod, c.obs)
        if sig is not None:
            c.out.drains.append(Drain(pod.name, sig.reason, sig.message, pod.node, sig.since))
            draining.add(pod.name)
    c.survivors = [p for p in c.survivors if p.name not in draining]


def recheck_not_ready(c: PlanContext) -> None:
    """Look again when a NotReady node's grace period ends, even if no event arrives by then."""
    for pod in c.active:
        node = c.obs.nodes.get(pod.node) if pod.node else None
        if node is not None and node.signal is not None and node.signal.reason == Reason.NODE_NOT_READY:
            wait = not_ready_wait(node.signal, c.obs.now)
            if wait > 0:
                c.out.requeue(wait)


def drain_crashed(c: PlanContext) -> None:
    """Crashed workers count against the budget and are deleted so their slot is refilled."""
    if c.prev.phase in (Phase.SUCCEEDED, Phase.FAILED):
        return
    for pod in c.workers:
        if pod.terminating or pod.phase != "Failed":
            continue
        sig = interruption_of(pod, c.obs)
        if sig is None:
            c.out.new_failures += 1
            how = f"{pod.exit_reason}, exit code" if pod.exit_reason not in (None, "Error") else "exit code"
            reason, msg = Reason.WORKER_FAILED, f"worker {pod.name} failed ({how} {pod.exit_code})"
            if pod.last_line:
                msg += f": {pod.last_line}"  # the trainer's last log line names the cause
        else:
            # The node went away under it: an interruption, not a crash of the trainer.
            reason, msg = sig.reason, f"worker {pod.name} stopped: {sig.message}"
        c.out.drains.append(Drain(pod.name, reason, msg, pod.node))


def count_failures(c: PlanContext) -> None:
    """Interruptions count as failures too when the job's failure policy says so."""
    if c.spec.failure_policy.count_interruptions:
        c.out.new_failures += sum(1 for d in c.out.drains if d.reason in INTERRUPTIONS)
    c.failures += c.out.new_failures
    policy = c.spec.failure_policy
    c.failure_times = record_failures(c.prev.failure_times, c.out.new_failures, c.obs.now, policy)
    c.budget_failures = budget_failures(c.failure_times, c.failures, policy)


def count_crashes(c: PlanContext) -> None:
    """Crashes for CrashLooping: failed worker pods, restarts inside pods (decide/crash_loop.py)."""
    pods = [d.message for d in c.out.drains if d.reason == Reason.WORKER_FAILED and d.role == "worker"]
    stopped = c.prev.phase in (Phase.SUCCEEDED, Phase.FAILED)
    crashes = judge_crashes(c.prev, c.obs.progress, pods, c.obs.now, stopped)
    c.crash_times, c.crash_looping, c.crash_detail = crashes.times, crashes.looping, crashes.detail
    if crashes.wake_in is not None:
        c.out.requeue(crashes.wake_in)


def judge_outcome(c: PlanContext) -> None:
    """Which terminal state or suspension applies, if any: the reason every worker stops."""
    c.outcome = finish(c.workers, c.obs)
    if c.outcome.awaiting_report:
        c.out.requeue(1.0)  # the reconciler re-reads the store each time round
    c.failed = c.prev.phase == Phase.FAILED or c.budget_failures > c.spec.failure_policy.max_failures
    c.terminal = c.failed or c.prev.phase == Phase.SUCCEEDED or c.outcome.done
    if c.terminal:
        c.stop_reason = Reason.FAILED if c.failed else Reason.FINISHED
    elif c.spec.suspend:
        c.stop_reason = Reason.SUSPENDED


def avoid_failed_nodes(c: PlanContext) -> None:
    """New workers stay off a node where a worker crashed (failurePolicy.avoidNodeSeconds): a bad GPU or a
    full disk would crash its replacement too. Interruptions and drains say nothing about the node's health
    and are not avoided; neither is anything once the job stops."""
    crashed = [
        (d.node, d.message)
        for d in c.out.drains
        if d.reason == Reason.WORKER_FAILED and d.role == "worker" and d.node and not c.terminal
    ]
    now, seconds = c.obs.now, c.spec.failure_policy.avoid_node_seconds
    c.avoided = avoid_nodes(c.prev.avoided_nodes, crashed, now, seconds, c.spec.replicas.max)
    c.out.avoid_nodes = [a.node for a in c.avoided]
    c.lazy.avoid = frozenset(c.out.avoid_nodes)  # no room there for new workers
    fresh = {node for node, _ in crashed}
    for a in c.avoided:
        if a.node in fresh:  # added or refreshed by this crash (not every reconcile while it lasts)
            msg = f"new workers avoid node {a.node} until {a.until.isoformat()}: {a.reason}"
            c.out.events.append(KubeEvent("Warning", AVOIDING_NODE, msg))


def stop_workers(c: PlanContext) -> None:
    """A finished, failed or suspended job keeps no worker."""
    if c.stop_reason is None:
        return
    for pod in c.survivors:
        c.out.drains.append(
            Drain(pod.name, c.stop_reason, f"worker {pod.name} stopped: {c.stop_reason}", pod.node)
        )
    c.survivors = []


def trim_to_max(c: PlanContext) -> None:
    """Scaled down by the user (or the scale subresource): drop pending workers first, then the highest
    slots, so the lowest, longest-running ranks stay.

    Without a lower max it is an excess worker: an index that lagged past the expectation TTL let one more
    pod be created (rare, and corrected here).
    """
    most = c.spec.replicas.max
    if c.stop_reason is not None or len(c.survivors) <= most:
        return
    lowered = (c.prev.desired_replicas or 0) > most
    why = Reason.SCALED_BY_USER if lowered else Reason.EXCESS_WORKER
    extra = sorted(c.survivors, key=lambda p: (p.phase == "Running", -(p.slot or 0)))
    for pod in extra[: len(c.survivors) - most]:
        c.out.drains.append(Drain(pod.name, why, f"replicas.max is {most}", pod.node))
    dropped = {d.pod for d in c.out.drains}
    c.survivors = [p for p in c.survivors if p.name not in dropped]


def recreate_stale_avoiders(c: PlanContext) -> None:
    """A Pending worker created to avoid a node that is no longer avoided is recreated: its affinity is fixed
    at creation, and it may be waiting for exactly that node (a small pool whose nodes all crashed once)."""
    if c.stop_reason is not None:
        return
    allowed = set(c.out.avoid_nodes)
    for pod in c.survivors:
        stale = sorted(set(pod.avoids) - allowed)
        if pod.phase == "Pending" and pod.node is None and stale:
            msg = f"pending worker {pod.name} recreated: node {', '.join(stale)} no longer avoided"
            c.out.drains.append(Drain(pod.name, Reason.AVOIDANCE_EXPIRED, msg))
    gone = {d.pod for d in c.out.drains}
    c.survivors = [p for p in c.survivors if p.name not in gone]


def resolve_image(c: PlanContext) -> None:
    """Without an image (none in the spec, none recorded, no operator default) no pod can be created; the
    Ready condition and a Warning event say so, and the job waits for a spec edit."""
    c.out.trainer_image = trainer_image(c.job)
    c.out.store_image = store_image(c.job, c.out.trainer_image)


def apply_deadline_policy(c: PlanContext) -> None:
    """The deadline policy's on-demand workers to add and release (decide/plan_deadline.py)."""
    # Finishing (workers exited 0, the final report not read yet): nothing new starts, nothing is stopped.
    acting = c.stop_reason is None and not c.outcome.awaiting_report
    c.capacity = deadline_step(c.job, c.obs, c.out, c.survivors, acting)
    gone = {d.pod for d in c.out.drains}
    c.survivors = [p for p in c.survivors if p.name not in gone]


def refill_workers(c: PlanContext) -> None:
    """Create the missing workers. Pending pods are the demand signal for Karpenter/cluster-autoscaler."""
    if c.stop_reason is not None or c.out.trainer_image is None or c.outcome.awaiting_report:
        return
    out = c.out
    out.create_on_demand = free_slots(c.workers, c.capacity.add_on_demand)
    out.pin_spot = c.capacity.pin_spot
    survivors = len(c.survivors) + len(out.create_on_demand)
    adding = workers_to_add(c.spec, c.prev, out, c.lazy, c.obs.now, survivors)
    out.create_workers = free_slots(c.workers, adding, out.create_on_demand)
    # Which of them run beyond min, at the elastic-extra class; on-demand first: the deadline policy bought
    # them to keep the job on time.
    creates = [*out.create_on_demand, *out.create_workers]
    out.extra_workers = extra_slots(c.spec.replicas.min, c.survivors, creates, c.job.extra_priority_class)
    if out.create_workers:
        # Only pods with room now: one waiting for the autoscaler must not hold the first world back.
        placeable = min(len(out.create_workers), c.lazy.get().total)
        out.startup_workers = len(c.survivors) + placeable


def place_rendezvous(c: PlanContext) -> None:
    """The store: one pod per job on capacity that is not reclaimed, behind a headless Service."""
    out = c.out
    out.rendezvous_capacity = list(c.spec.placement.rendezvous.capacity_types)
    live = c.live_rdzv
    if c.stop_reason is not None:
        out.drains += [
            Drain(p.name, c.stop_reason, "rendezvous store not needed", p.node, role="rendezvous")
            for p in live
        ]
        return
    out.ensure_service = True
    # Make before break (decide/store_move.py): a store whose node is being emptied stays until its
    # replacement is Ready; a lost one is replaced at once under a fresh name.
    store = plan_store(c.job.name, c.rdzv, c.obs, next_rendezvous_index(c.job.name, c.rdzv))
    out.drains += store.drains
    out.events += store.events
    out.serve_rendezvous = store.serve
    if store.requeue is not None:
        out.requeue(store.requeue)
    if store.create is not None and out.store_image is not None:
        out.create_rendezvous = True
        out.rendezvous_index = store.create


def write_status(c: PlanContext) -> None:
    """Phase, conditions, counts and events (decide/job_status.py)."""
    running = sum(1 for p in c.survivors if p.running)
    inputs = StatusInputs(
        job=c.job.name,
        generation=c.job.generation,
        now=c.obs.now,
        prev=c.prev,
        spec=c.spec,
        running=running,
        desired=0 if c.stop_reason is not None else c.spec.replicas.max,
        drains=c.out.drains,
        failures=c.budget_failures,
        failed=c.failed,
        succeeded=c.terminal and not c.failed,
        suspended=c.spec.suspend and not c.terminal,
        terminating=any(p.terminating for p in c.workers),
        rendezvous_running=any(p.running for p in c.live_rdzv),
        # Below min is the only time "is there room for min?" is a question; skip the pass otherwise.
        free_slots=c.lazy.get().total if running < c.spec.replicas.min else None,
        progress=c.obs.progress,
        progress_time=c.obs.progress_time,
        trainer_image=c.out.trainer_image,
        usage_namespaces=c.obs.usage_namespaces,
        create_rejection=c.obs.create_rejection,
        progress_tracked=c.obs.progress_tracked,
        crashes=len(c.crash_times),
        crash_looping=c.crash_looping,
        crash_detail=c.crash_detail,
        finished=c.outcome.done or c.outcome.awaiting_report,
    )
    c.out.status, events = build_status(inputs)
    c.out.events += events  # after those of earlier steps (AvoidingNode)
    # Wake when the step would count as stalled: the resync alone could be late by that much.
    wake = stall_wake_in(c.out.status.progress, stalled_seconds(inputs, c.out.status), c.spec.failure_policy)
    if wake is not None:
        c.out.requeue(wake)
    # status.failures stays the job's whole-life count; the budget's window lives in failureTimes.
    c.out.status.failures = c.failures
    c.out.status.failure_times = c.failure_times
    c.out.status.avoided_nodes = c.avoided
    c.out.status.crash_times = c.crash_times


def record_schedule(c: PlanContext) -> None:
    """status.workersByCapacity, cost and schedule (decide/plan_deadline.py)."""
    schedule_status(c.job, c.out, c.capacity, c.obs.now)


def warn_report_missing(c: PlanContext) -> None:
    """Succeeded without the trainer's final report: say so once, on the reconcile that decides it."""
    if c.outcome.report_missing and c.prev.phase != Phase.SUCCEEDED:
        c.out.events.append(KubeEvent("Warning", FINAL_REPORT_MISSING, c.outcome.report_missing))


def expire_ttl(c: PlanContext) -> None:
    """ttlSecondsAfterFinished: delete the finished job when it expires, else look again then."""
    ttl = c.spec.ttl_seconds_after_finished
    done_at = c.out.status.completion_time
    if not c.terminal or ttl is None or done_at is None:
        return
    left = done_at + timedelta(seconds=ttl) - c.obs.now
    if left.total_seconds() <= 0:
        c.out.delete_job = True
    else:
        c.out.requeue(left.total_seconds())


# The order reads as the decision: what is going away, what crashed, how the job stands, which workers
# stop, what to create, where the store runs, what status says, when the job expires.
STEPS: tuple[Step, ...] = (
    drain_interrupted,
    recheck_not_ready,
    drain_crashed,
    count_failures,
    count_crashes,
    judge_outcome,
    avoid_failed_nodes,
    stop_workers,
    trim_to_max,
    recreate_stale_avoiders,
    resolve_image,
    apply_deadline_policy,
    refill_workers,
    place_rendezvous,
    write_status,
    record_schedule,
    warn_report_missing,
    expire_ttl,
)

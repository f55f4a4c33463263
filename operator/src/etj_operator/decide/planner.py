"""The pure planner: observed state in, a plan out. No Kubernetes calls, no clocks, no globals.

``plan()`` is level-based: given the same observation it returns the same plan, so the operator can run
it after every event, after a restart, or twice in a row without creating duplicates. Everything the
decision needs (job, nodes, pods, GPUs in use, progress, the time) is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from etj_contract.progress import FINAL_REPORT_DEADLINE_S
from etj_operator.api.models import (
    CapacityType,
    ElasticTrainingJobSpec,
    ElasticTrainingJobStatus,
    Phase,
)
from etj_operator.decide.deadline_plan import CapacityPlan, plan_capacity
from etj_operator.decide.job_status import StatusInputs, build_status
from etj_operator.decide.schedule import DeadlineCosts, PriceDefaults, add_cost
from etj_operator.decide.types import Drain, KubeEvent
from etj_operator.decide.workload import capacity_tolerations, rendezvous_index
from etj_operator.observe.nodes import NodeInfo, fits
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import INTERRUPTIONS, Reason, Signal
from etj_operator.quantity import MILLI_RESOURCES, parse_milli

# A pod bound to a node the index has never seen is only "on a deleted node" after this long: watches
# of different resources are not ordered, so a fresh node may reach us after the pod bound to it.
NODE_MISSING_GRACE = timedelta(seconds=60)
# A NotReady node (kubelet restart, network blip, an overloaded control plane) often recovers within
# seconds; draining would cost a resize for nothing. Kubernetes itself evicts only after 300 s.
NOT_READY_GRACE = timedelta(seconds=60)
# Workers that exited 0 have normally had their final report acknowledged (rank 0 retries it for up to 60 s
# before it exits: etj_trainer.progress), and the operator re-reads the store at once when it sees them
# (reconciler.py). Until that report is in status the store is kept and the job is not Succeeded, for at most
# this long: the accuracy and last resizes live in that report only.
FINAL_REPORT_GRACE = timedelta(seconds=FINAL_REPORT_DEADLINE_S + 30)
# Signals that drain workers but leave the store where it is: a cordon alone is often undone, and a drain
# that follows it is held by the store's PodDisruptionBudget (dataplane.store_disruption_budget); a
# rebalance recommendation is a hint. The store moves on notices that its node will go away.
STORE_STAYS_ON = frozenset({Reason.NODE_CORDONED, Reason.REBALANCE_RECOMMENDATION})


@dataclass(frozen=True)
class JobView:
    name: str
    namespace: str
    uid: str
    generation: int
    spec: ElasticTrainingJobSpec
    status: ElasticTrainingJobStatus
    # The operator's default trainer image (--default-trainer-image, the chart's trainer.image), for jobs
    # whose spec names none.
    default_image: str | None = None
    # The operator's default prices (the chart's ``prices``) and what a change costs a job (``deadline``).
    prices: PriceDefaults = field(default_factory=PriceDefaults)
    deadline_costs: DeadlineCosts = field(default_factory=DeadlineCosts)


def trainer_image(job: JobView) -> str | None:
    """The image the job's pods run: the spec's; else the one the job already runs (status.trainerImage),
    so a changed operator default never mixes two images in one job; else the operator's default."""
    return job.spec.trainer.image or job.status.trainer_image or job.default_image


@dataclass(frozen=True)
class Observed:
    nodes: Mapping[str, NodeInfo]
    pods: Sequence[PodInfo]  # this job's pods (workers and rendezvous)
    now: datetime
    node_usage: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # GPUs requested per node
    # Namespaces whose pods node_usage counts; empty: all. A namespaced operator (--namespace, the chart's
    # watchNamespaces) cannot see other namespaces' pods, so GPUs they use look free (docs/operator.md).
    usage_namespaces: tuple[str, ...] = ()
    deleted_nodes: Mapping[str, datetime] = field(default_factory=dict)  # tombstones from the node index
    progress: Mapping[str, Any] | None = None
    progress_time: datetime | None = None
    # How long to wait for the final report once workers exited 0; zero when the operator does not read
    # progress at all (--progress-seconds 0): no report can come.
    final_report_grace: timedelta = FINAL_REPORT_GRACE
    # The apiserver's message refusing the last pod create (quota, admission), while creates keep failing.
    create_rejection: str | None = None
    # Whether the operator reads the trainer's progress at all (--progress-seconds > 0): the Progressing
    # condition can only be judged from it.
    progress_tracked: bool = True


@dataclass
class Plan:
    create_workers: list[int] = field(default_factory=list)  # slots; names are <job>-worker-<slot>
    # Slots of new workers pinned to on-demand capacity (the deadline policy asks for them).
    create_on_demand: list[int] = field(default_factory=list)
    pin_spot: bool = False  # create_workers are pinned to spot (a job whose deadline policy adds on-demand)
    # Workers the job has once those of create_workers that fit on free capacity now exist: new agents wait
    # (bounded) for that many before their first rendezvous (etj_trainer/startup.py), so a job's first world
    # forms at the size already scheduled instead of 0->2->4.
    startup_workers: int = 0
    drains: list[Drain] = field(default_factory=list)
    ensure_service: bool = False
    create_rendezvous: bool = False
    rendezvous_index: int = 0  # the new store pod is workload.rendezvous_pod_name(job, index)
    rendezvous_capacity: list[CapacityType] = field(default_factory=list)
    status: ElasticTrainingJobStatus = field(default_factory=ElasticTrainingJobStatus)
    trainer_image: str | None = None  # what new worker and store pods run (None: nothing may be created)
    events: list[KubeEvent] = field(default_factory=list)
    new_failures: int = 0
    requeue_after: float | None = None  # seconds until a time-based decision changes
    delete_job: bool = False  # ttlSecondsAfterFinished expired

    def requeue(self, seconds: float) -> None:
        seconds = max(0.5, seconds)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


def interruption_of(pod: PodInfo, obs: Observed) -> Signal | None:
    """Why this pod must be drained now, if anything says its node (or the pod) is going away."""
    if pod.signal is not None:
        return pod.signal
    if pod.node is None:
        return None
    node = obs.nodes.get(pod.node)
    if node is None:
        if pod.node in obs.deleted_nodes:
            return Signal(Reason.NODE_DELETED, f"node {pod.node} was deleted", obs.deleted_nodes[pod.node])
        bound = pod.scheduled_at or pod.created
        if bound is not None and obs.now - bound > NODE_MISSING_GRACE:
            return Signal(Reason.NODE_DELETED, f"node {pod.node} no longer exists")
        return None
    if node.signal is not None and node.signal.reason == Reason.NODE_NOT_READY:
        return node.signal if _not_ready_wait(node.signal, obs.now) == 0 else None
    return node.signal


def _not_ready_wait(signal: Signal, now: datetime) -> float:
    """Seconds until a NotReady signal counts (0: it counts now)."""
    if signal.since is None:
        return NOT_READY_GRACE.total_seconds()
    return max(0.0, (signal.since + NOT_READY_GRACE - now).total_seconds())


@dataclass(frozen=True)
class FreeCapacity:
    """Room for more workers on eligible nodes, and how much of it is older than the scale-up delay."""

    total: int = 0
    settled: int = 0
    young_since: datetime | None = None  # earliest Ready time among nodes still inside the delay


def free_capacity(
    spec: ElasticTrainingJobSpec, obs: Observed, types: frozenset[CapacityType] | None = None
) -> FreeCapacity:
    """One pass over the nodes (this runs on every reconcile of every job, so it stays cheap).

    ``types``: count only nodes of these capacity types (the deadline policy asks about spot alone).
    """
    res = spec.trainer.resources
    allowed = set(spec.placement.capacity_types) & (types if types is not None else set(CapacityType))
    selector = spec.placement.node_selector
    tolerations = [
        *capacity_tolerations(spec.placement.capacity_types),
        *(t.to_dict() for t in spec.placement.tolerations),
    ]
    cutoff = obs.now - timedelta(seconds=spec.scaling.scale_up_delay_seconds)
    demand = worker_demand(spec)
    total = settled = 0
    young: datetime | None = None
    for node in obs.nodes.values():
        # Cheap rejections first; fits() re-checks them, the taint matching is the expensive part.
        if node.capacity_type not in allowed or not node.schedulable:
            continue
        if res.gpu and node.gpus(res.gpu_resource_name) < res.gpu:
            continue
        if not fits(node, capacity_types=allowed, node_selector=selector, tolerations=tolerations):
            continue
        room = _room(node, demand, obs.node_usage.get(node.name, {}), spec.replicas.max)
        if not room:
            continue
        total += room
        if node.ready_since is not None and node.ready_since > cutoff:
            young = node.ready_since if young is None else min(young, node.ready_since)
        else:
            settled += room
    return FreeCapacity(total, settled, young)


def worker_demand(spec: ElasticTrainingJobSpec) -> dict[str, int]:
    """What one worker pod requests, in NodeInfo.allocatable's units (GPUs whole, cpu/memory in milli)."""
    res = spec.trainer.resources
    demand = {res.gpu_resource_name: res.gpu} if res.gpu else {}
    for key, raw in (("cpu", res.cpu), ("memory", res.memory)):
        amount = parse_milli(raw) if raw is not None else None
        if amount:
            demand[key] = amount
    return demand


def _room(node: NodeInfo, demand: Mapping[str, int], used: Mapping[str, int], most: int) -> int:
    """How many more workers fit on ``node`` by every resource a worker requests (at most ``most``).

    A node that does not report cpu or memory at all is not limited by it (it cannot be judged); one that
    lacks a requested extended resource has no room.
    """
    room = most
    for key, need in demand.items():
        if key not in node.allocatable and key in MILLI_RESOURCES:
            continue
        free = max(0, node.allocatable.get(key, 0) - used.get(key, 0))
        room = min(room, free // need)
    return room


def _last_resize(status: ElasticTrainingJobStatus) -> datetime | None:
    return max((e.time for e in status.resize_history), default=None)


def _store_drains(rdzv: Sequence[PodInfo], obs: Observed) -> list[Drain]:
    """Store pods to delete: an interrupted or exited one gracefully, one on a lost node at once.

    A pod on a deleted (or long NotReady) node stays Terminating until its kubelet confirms, which never
    happens; removing it (grace 0) is what the pod garbage collector would do minutes later.
    """
    out: list[Drain] = []
    for pod in rdzv:
        sig = interruption_of(pod, obs)
        if sig is not None and sig.reason in STORE_STAYS_ON:
            sig = None  # moving the store costs the rendezvous; only a real notice justifies it
        node_lost = sig is not None and sig.reason in (Reason.NODE_DELETED, Reason.NODE_NOT_READY)
        if pod.terminating and not node_lost:
            continue
        if sig is None and pod.phase not in ("Failed", "Succeeded"):
            continue
        why = sig.reason if sig else Reason.WORKER_FAILED
        message = sig.message if sig else "store pod exited"
        since = sig.since if sig else None
        out.append(Drain(pod.name, why, message, pod.node, since, role="rendezvous", force=node_lost))
    return out


def next_rendezvous_index(job: str, rdzv: Sequence[PodInfo]) -> int:
    """One past every store pod still known (terminating ones included): a name no pod has now. A pod
    already gone from the API (force-deleted before we saw it fail) may see its name reused, so nothing
    keys on a store pod's name (the reconciler's bounds told are keyed by uid)."""
    indices = [i for p in rdzv if (i := rendezvous_index(job, p.name)) is not None]
    return max(indices, default=-1) + 1


def _free_slots(pods: Sequence[PodInfo], count: int, also_taken: Sequence[int] = ()) -> list[int]:
    taken = {p.slot for p in pods if p.slot is not None} | set(also_taken)
    out: list[int] = []
    slot = 0
    while len(out) < count:
        if slot not in taken:
            out.append(slot)
        slot += 1
    return out


def plan(job: JobView, obs: Observed) -> Plan:
    """One reconcile's decisions, in the order they depend on each other (numbered steps below).

    Longer than our ~80-line rule on purpose: each numbered step reads the drains and counts the steps
    before it settled, and split into functions they would pass a dozen locals back and forth.
    """
    spec, prev = job.spec, job.status
    now = obs.now
    out = Plan()
    workers = [p for p in obs.pods if p.role == "worker"]
    rdzv = [p for p in obs.pods if p.role == "rendezvous"]
    active = [p for p in workers if p.active]
    finished = prev.phase in (Phase.SUCCEEDED, Phase.FAILED)

    # 1. Interruptions: drain every active worker whose node (or the pod itself) is going away.
    draining: set[str] = set()
    for pod in active:
        sig = interruption_of(pod, obs)
        if sig is not None:
            out.drains.append(Drain(pod.name, sig.reason, sig.message, pod.node, sig.since))
            draining.add(pod.name)

    # Look again when a NotReady node's grace period ends, even if no event arrives by then.
    for pod in active:
        node = obs.nodes.get(pod.node) if pod.node else None
        if node is not None and node.signal is not None and node.signal.reason == Reason.NODE_NOT_READY:
            wait = _not_ready_wait(node.signal, now)
            if wait > 0:
                out.requeue(wait)

    # 2. Crashed workers: count against the budget, delete so the slot is refilled.
    failures = prev.failures or 0
    for pod in workers:
        if pod.terminating or pod.phase != "Failed" or finished:
            continue
        sig = interruption_of(pod, obs)
        if sig is None:
            out.new_failures += 1
            how = f"{pod.exit_reason}, exit code" if pod.exit_reason not in (None, "Error") else "exit code"
            reason, msg = Reason.WORKER_FAILED, f"worker {pod.name} failed ({how} {pod.exit_code})"
            if pod.last_line:
                msg += f": {pod.last_line}"  # the trainer's last log line names the cause
        else:
            # The node went away under it: an interruption, not a crash of the trainer.
            reason, msg = sig.reason, f"worker {pod.name} stopped: {sig.message}"
        out.drains.append(Drain(pod.name, reason, msg, pod.node))
    if spec.failure_policy.count_interruptions:
        out.new_failures += sum(1 for d in out.drains if d.reason in INTERRUPTIONS)
    failures += out.new_failures

    # 3. Terminal states and suspension: which of them applies, and the workers they stop.
    finish = _finish(workers, obs)
    if finish.awaiting_report:
        out.requeue(1.0)  # the reconciler re-reads the store each time round
    succeeded = finish.done
    failed = prev.phase == Phase.FAILED or failures > spec.failure_policy.max_failures
    terminal = failed or prev.phase == Phase.SUCCEEDED or succeeded
    stop_reason = (
        (Reason.FAILED if failed else Reason.FINISHED)
        if terminal
        else (Reason.SUSPENDED if spec.suspend else None)
    )
    survivors = [p for p in active if p.name not in draining]
    if stop_reason is not None:
        for pod in survivors:
            out.drains.append(
                Drain(pod.name, stop_reason, f"worker {pod.name} stopped: {stop_reason}", pod.node)
            )
        survivors = []
    elif len(survivors) > spec.replicas.max:
        # Scaled down by the user (or the scale subresource): drop pending workers first, then the
        # highest slots, so the lowest, longest-running ranks stay.
        # Without a lower max it is an excess worker: an index that lagged past the expectation TTL
        # let one more pod be created (rare, and corrected here).
        lowered = (prev.desired_replicas or 0) > spec.replicas.max
        why = Reason.SCALED_BY_USER if lowered else Reason.EXCESS_WORKER
        extra = sorted(survivors, key=lambda p: (p.phase == "Running", -(p.slot or 0)))
        for pod in extra[: len(survivors) - spec.replicas.max]:
            out.drains.append(Drain(pod.name, why, f"replicas.max is {spec.replicas.max}", pod.node))
        dropped = {d.pod for d in out.drains}
        survivors = [p for p in survivors if p.name not in dropped]

    # 4. Refill missing workers. Pending pods are the demand signal for Karpenter/cluster-autoscaler.
    # Free capacity costs a pass over every node; it is computed only when a decision needs it (not on the
    # drain path, where latency matters and all jobs on lost nodes reconcile at once).
    # Without an image (none in the spec, none recorded, no operator default) no pod can be created; the
    # Ready condition and a Warning event say so, and the job waits for a spec edit.
    out.trainer_image = trainer_image(job)
    # Finishing (workers exited 0, the final report not read yet): nothing new starts, nothing is stopped.
    creatable = stop_reason is None and out.trainer_image is not None and not finish.awaiting_report
    lazy = _LazyCapacity(spec, obs)
    capacity = _deadline_step(job, obs, out, survivors, stop_reason is None and not finish.awaiting_report)
    gone = {d.pod for d in out.drains}
    survivors = [p for p in survivors if p.name not in gone]
    if creatable:
        out.create_on_demand = _free_slots(workers, capacity.add_on_demand)
        out.pin_spot = capacity.pin_spot
        adding = _workers_to_add(job, obs, out, len(survivors) + len(out.create_on_demand), lazy)
        out.create_workers = _free_slots(workers, adding, out.create_on_demand)
        if out.create_workers:
            # Only pods with room now: one waiting for the autoscaler must not hold the first world back.
            placeable = min(len(out.create_workers), lazy.get().total)
            out.startup_workers = len(survivors) + placeable

    # 5. Rendezvous store: one pod per job on capacity that is not reclaimed, behind a headless Service.
    rdzv_spec = spec.placement.rendezvous
    out.rendezvous_capacity = list(rdzv_spec.capacity_types)
    live_rdzv = [p for p in rdzv if p.active]
    if stop_reason is not None:
        out.drains += [
            Drain(p.name, stop_reason, "rendezvous store not needed", p.node, role="rendezvous")
            for p in live_rdzv
        ]
    else:
        out.ensure_service = True
        out.drains += _store_drains(rdzv, obs)
        lost = {d.pod for d in out.drains if d.role == "rendezvous"}
        # A lost store is replaced at once under a fresh name (the agents wait for it and re-form the
        # world on it: etj_trainer.store_link); nothing waits for the old pod to be gone.
        if not any(p.name not in lost for p in live_rdzv) and out.trainer_image is not None:
            out.create_rendezvous = True
            out.rendezvous_index = next_rendezvous_index(job.name, rdzv)

    # 6. Status, events, TTL.
    running = sum(1 for p in survivors if p.running)
    inputs = StatusInputs(
        job=job.name,
        generation=job.generation,
        now=now,
        prev=prev,
        spec=spec,
        running=running,
        desired=0 if stop_reason is not None else spec.replicas.max,
        drains=out.drains,
        failures=failures,
        failed=failed,
        succeeded=terminal and not failed,
        suspended=spec.suspend and not terminal,
        terminating=any(p.terminating for p in workers),
        rendezvous_running=any(p.running for p in live_rdzv),
        # Below min is the only time "is there room for min?" is a question; skip the pass otherwise.
        free_slots=lazy.get().total if running < spec.replicas.min else None,
        progress=obs.progress,
        progress_time=obs.progress_time,
        trainer_image=out.trainer_image,
        usage_namespaces=obs.usage_namespaces,
        create_rejection=obs.create_rejection,
        progress_tracked=obs.progress_tracked,
    )
    # The Progressing deadline needs no timer of its own: the resync (--resync-seconds) re-plans anyway.
    out.status, out.events = build_status(inputs)
    _schedule_status(job, out, capacity, now)
    if finish.report_missing and prev.phase != Phase.SUCCEEDED:
        out.events.append(KubeEvent("Warning", FINAL_REPORT_MISSING, finish.report_missing))
    if terminal and spec.ttl_seconds_after_finished is not None and out.status.completion_time is not None:
        left = out.status.completion_time + timedelta(seconds=spec.ttl_seconds_after_finished) - now
        if left.total_seconds() <= 0:
            out.delete_job = True
        else:
            out.requeue(left.total_seconds())
    return out


FINAL_REPORT_MISSING = "FinalReportMissing"
# Cost and projection are refreshed at most this often unless the workers change: every write is a status
# patch, and one per reconcile would be a write per event for nothing.
STATUS_REFRESH = timedelta(seconds=60)


def _deadline_step(
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


def _schedule_status(job: JobView, out: Plan, capacity: CapacityPlan, now: datetime) -> None:
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


@dataclass(frozen=True)
class _Finish:
    done: bool = False  # the job has Succeeded
    awaiting_report: bool = False  # workers exited 0 but their final report is not read yet
    report_missing: str = ""  # done without the final report: the Warning's message


def _finish(workers: Sequence[PodInfo], obs: Observed) -> _Finish:
    """Has training finished, and has its final report (accuracy, last resizes) been read?

    Only a worker that exited 0 by itself (not one we are deleting) finishes the job. Rank 0 posts the
    final report before any worker can exit, so it is normally in the store by then: the job is Succeeded
    once that report is read, or after ``obs.final_report_grace`` without it (with a Warning).
    """
    reported = bool(obs.progress and obs.progress.get("finished"))
    exited = [p for p in workers if p.exited_ok]
    if not exited:
        # A report alone never finishes the job: it is only as trustworthy as whoever reached the store
        # (docs/operator.md, "Threat model"); a worker the operator started must exit 0 as well.
        return _Finish()
    if reported or obs.final_report_grace <= timedelta(0):
        return _Finish(done=True)
    since = min((p.finished_at for p in exited if p.finished_at is not None), default=None)
    if since is not None and obs.now - since < obs.final_report_grace:
        return _Finish(awaiting_report=True)
    return _Finish(
        done=True,
        report_missing=(
            f"workers exited 0 but the trainer's final report (accuracy, last resizes) was not read within "
            f"{obs.final_report_grace.total_seconds():.0f} s; status.progress is from the last report read"
        ),
    )


class _LazyCapacity:
    def __init__(self, spec: ElasticTrainingJobSpec, obs: Observed) -> None:
        self.spec, self.obs = spec, obs
        self.value: FreeCapacity | None = None

    def get(self) -> FreeCapacity:
        if self.value is None:
            self.value = free_capacity(self.spec, self.obs)
        return self.value


def _workers_to_add(job: JobView, obs: Observed, out: Plan, survivors: int, lazy: _LazyCapacity) -> int:
    """How many new worker pods to create now; sets a requeue when a timer will allow more later."""
    spec, prev, now = job.spec, job.status, obs.now
    missing = spec.replicas.max - survivors
    if missing <= 0:
        return 0
    # Below min the job cannot train at all: waiting gains nothing, so refill at once. A crashed worker
    # (within the failure budget) is restarted at once too: that restores the size, it is no new resize.
    restarts = sum(1 for d in out.drains if d.reason == Reason.WORKER_FAILED and d.role == "worker")
    urgent = min(missing, max(0, spec.replicas.min - survivors) + restarts)
    rest = missing - urgent
    if rest == 0:
        return urgent
    last = _last_resize(prev)
    if any(d.reason != Reason.WORKER_FAILED for d in out.drains):
        last = now  # a resize is happening right now
    if prev.start_time is None and not prev.resize_history:
        return missing  # first start: ask for everything, pending pods drive the autoscaler
    cooldown = timedelta(seconds=spec.scaling.cooldown_seconds)
    if last is not None and now < last + cooldown:
        out.requeue((last + cooldown - now).total_seconds())
        return urgent
    delay = timedelta(seconds=spec.scaling.scale_up_delay_seconds)
    # Capacity that just appeared must survive scaleUpDelaySeconds first (spot flapping); when there is
    # no free capacity at all, pending pods are exactly what asks the autoscaler for nodes.
    capacity = lazy.get() if delay else None
    if capacity is not None and capacity.young_since is not None and capacity.settled < rest:
        out.requeue((capacity.young_since + delay - now).total_seconds())
        return urgent + capacity.settled
    return missing

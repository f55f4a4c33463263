"""The job's conditions as a table: one rule per condition type, each naming its reasons from one enum.

Pure: ``build_conditions`` turns one reconcile's facts into the full conditions list. lastTransitionTime
only moves when a condition's status changes (``set_condition``), so an unchanged job writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from etj_operator.api.models import Condition, ConditionStatus, ConditionType, Phase, set_condition
from etj_operator.decide.failures.crash_loop import (
    CRASH_DETAIL_SEP,
    CRASH_LOOP_CRASHES,
    CRASH_LOOPING,
    STALL_STEPS,
)
from etj_operator.decide.failures.start_blocks import cause
from etj_operator.decide.types import KubeEvent


class ConditionReason(StrEnum):
    """Every reason a condition rule gives (the Resizing condition also carries the drain's own reason; Ready,
    Failed and PodsBlocked the blocked pod's: Unschedulable or a kubelet waiting reason, start_blocks.py)."""

    MIN_WORKERS_RUNNING = "MinWorkersRunning"
    JOB_SUCCEEDED = Phase.SUCCEEDED.value  # Ready=False on a finished, failed or suspended job: its phase
    JOB_FAILED = Phase.FAILED.value
    JOB_SUSPENDED = Phase.SUSPENDED.value
    NO_TRAINER_IMAGE = "NoTrainerImage"
    RENDEZVOUS_NOT_RUNNING = "RendezvousNotRunning"
    WAITING_FOR_WORKERS = "WaitingForWorkers"
    WORKERS_TERMINATING = "WorkersTerminating"
    STABLE = "Stable"
    SUSPENDED_BY_USER = "SuspendedByUser"
    NOT_SUSPENDED = "NotSuspended"
    TRAINING_FINISHED = "TrainingFinished"
    NOT_FINISHED = "NotFinished"
    FAILURE_BUDGET_EXHAUSTED = "FailureBudgetExhausted"
    WITHIN_FAILURE_BUDGET = "WithinFailureBudget"
    ENOUGH_CAPACITY = "EnoughCapacity"
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"
    FAILED_CREATE = "FailedCreate"
    OBJECT_CONFLICT = "ObjectConflict"  # an object with a name of the job's own that it does not own
    HOST_PATH_FORBIDDEN = "HostPathForbidden"  # a hostPath volume where the operator forbids them
    PODS_CREATED = "PodsCreated"
    STEP_ADVANCING = "StepAdvancing"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    PROGRESS_STALLED = "ProgressStalled"  # before the deadline: many measured step times without a step
    REPEATED_CRASHES = "RepeatedCrashes"
    NO_RECENT_CRASHES = "NoRecentCrashes"
    NOT_TRAINING = "NotTraining"
    PROGRESS_NOT_READ = "ProgressNotRead"
    NO_DURABLE_CHECKPOINT = "NoDurableCheckpoint"
    CHECKPOINT_PVC = "CheckpointPVC"
    CHECKPOINT_OBJECT_STORE = "CheckpointObjectStore"
    NO_BLOCKED_PODS = "NoBlockedPods"
    CHECKPOINT_WRITE_FAILED = "CheckpointWriteFailed"
    CHECKPOINT_WRITTEN = "CheckpointWritten"
    NO_CHECKPOINT_YET = "NoCheckpointYet"


NO_TRAINER_IMAGE_MESSAGE = (
    "spec.trainer.image is not set and the operator has no default trainer image: set spec.trainer.image, "
    "or the chart's trainer.image (etj operator run --default-trainer-image, ETJ_DEFAULT_TRAINER_IMAGE)"
)
VOLATILE_MESSAGE = (
    "neither checkpoint.pvc nor checkpoint.uri is set: the shared checkpoints live in each pod's emptyDir, "
    "so losing every worker at once (a whole spot pool) restarts training from step 0"
)
PARTIAL_USAGE_NOTE = (
    "counting only GPUs used by pods in the watched namespaces: the operator is namespaced, so GPUs that "
    "pods of other namespaces use on the same nodes look free"
)
_PHASE_REASON = {
    Phase.SUCCEEDED: ConditionReason.JOB_SUCCEEDED,
    Phase.FAILED: ConditionReason.JOB_FAILED,
    Phase.SUSPENDED: ConditionReason.JOB_SUSPENDED,
}


@dataclass(frozen=True)
class JobFacts:
    """What the conditions are computed from: this reconcile's phase, counts and drains."""

    phase: Phase
    running: int  # workers Running and not being drained
    min_workers: int
    max_workers: int
    rendezvous_running: bool
    has_trainer_image: bool
    suspended: bool
    resizing: bool  # workers being drained, or still shutting down
    drain_reason: str | None  # the first worker drain's reason (None: no worker drained this round)
    drain_messages: str  # every worker drain's message, "; "-joined
    failures: int
    max_failures: int
    free_slots: int | None  # more workers that would fit now; None: not computed (at least min running)
    partial_usage: bool  # GPU use of other namespaces is invisible (namespaced operator)
    create_rejection: str | None = None  # the apiserver's refusal of a pod create, while it lasts
    stalled_seconds: float | None = None  # step standing still while Ready (job_status.stalled_seconds)
    progress_deadline: int = 0  # failurePolicy.progressDeadlineSeconds (0: no check)
    stall_after: float = 0.0  # seconds without a step that count as a stall (crash_loop.stall_threshold)
    step_seconds: float | None = None  # the measured step time it adapts to
    crashes: int = 0  # crashes within the crash-loop window
    crash_looping: bool = False
    crash_window: int = 0  # the window's seconds
    crash_detail: str = ""  # the newest crash's cause
    progress_tracked: bool = True  # the operator reads the trainer's progress at all
    step: int | None = None
    last_error: str | None = None  # the trainer's last error line (progress doc lastError)
    checkpoint_pvc: str | None = None  # spec.checkpoint.pvc's claim
    checkpoint_uri: str | None = None  # spec.checkpoint.uri
    blocked_reason: str | None = None  # the first blocked pod's reason (start_blocks.StartBlocks)
    blocked_message: str = ""  # which pod, and the kubelet's or scheduler's words
    failed_as: tuple[str, str] | None = None  # Failed because a pod never started: reason, message
    checkpoint_error: str | None = None  # the trainer's newest failed shared write, while they fail
    failed_writes: int = 0  # shared writes failed in a row (progress doc failedWrites)
    max_failed_writes: int = 0  # spec.checkpoint.maxFailedWrites
    last_checkpoint: str | None = None  # "step N at PATH": status.lastCheckpoint, a confirmed write


Verdict = tuple[bool | ConditionStatus, str, str]  # status, reason, message


def _ready(f: JobFacts) -> Verdict:
    if f.phase in (Phase.RUNNING, Phase.RESIZING) and f.rendezvous_running:
        running = f"{f.running} of {f.min_workers}..{f.max_workers} workers running"
        return True, ConditionReason.MIN_WORKERS_RUNNING, running
    if f.phase == Phase.FAILED and f.failed_as is not None:
        return False, *f.failed_as  # `kubectl get etj` shows the cause (its Reason column), not "Failed"
    if f.phase in _PHASE_REASON:
        return False, _PHASE_REASON[f.phase], f"job is {f.phase}"
    if not f.has_trainer_image:
        return False, ConditionReason.NO_TRAINER_IMAGE, NO_TRAINER_IMAGE_MESSAGE
    if f.blocked_reason is not None:
        return False, f.blocked_reason, f.blocked_message  # the pod it waits for, and why it cannot start
    if not f.rendezvous_running:
        return False, ConditionReason.RENDEZVOUS_NOT_RUNNING, "the rendezvous store pod is not running yet"
    waiting = f"{f.running} of at least {f.min_workers} workers running"
    return False, ConditionReason.WAITING_FOR_WORKERS, waiting


def _resizing(f: JobFacts) -> Verdict:
    if not f.resizing:
        return False, ConditionReason.STABLE, ""
    reason = f.drain_reason or ConditionReason.WORKERS_TERMINATING
    return True, reason, f.drain_messages or "waiting for drained workers to exit"


def _suspended(f: JobFacts) -> Verdict:
    reason = ConditionReason.SUSPENDED_BY_USER if f.suspended else ConditionReason.NOT_SUSPENDED
    return f.suspended, reason, ""


def _succeeded(f: JobFacts) -> Verdict:
    done = f.phase == Phase.SUCCEEDED
    return done, ConditionReason.TRAINING_FINISHED if done else ConditionReason.NOT_FINISHED, ""


def _failed(f: JobFacts) -> Verdict:
    failed = f.phase == Phase.FAILED
    if failed and f.failed_as is not None:
        return True, *f.failed_as
    reason = ConditionReason.FAILURE_BUDGET_EXHAUSTED if failed else ConditionReason.WITHIN_FAILURE_BUDGET
    return failed, reason, f"{f.failures}/{f.max_failures} worker failures"


def _capacity(f: JobFacts) -> Verdict:
    if f.free_slots is None:
        return (
            True,
            ConditionReason.ENOUGH_CAPACITY,
            (f"{f.running} workers running, at least replicas.min ({f.min_workers})"),
        )
    reachable = f.running + f.free_slots
    enough = reachable >= f.min_workers
    message = f"room for {min(reachable, f.max_workers)} of {f.min_workers}..{f.max_workers} workers"
    if f.partial_usage:
        message += f" ({PARTIAL_USAGE_NOTE})"
    return (
        enough,
        ConditionReason.ENOUGH_CAPACITY if enough else ConditionReason.INSUFFICIENT_CAPACITY,
        message,
    )


def rejection_reason(rejection: str) -> ConditionReason:
    """A refused create's reason: the operator's own refusals prefix their message with theirs
    (``ObjectConflict``: k8s/rejections.py; ``HostPathForbidden``: pod_policy.py); else ``FailedCreate``
    (the apiserver said no)."""
    own = (ConditionReason.OBJECT_CONFLICT, ConditionReason.HOST_PATH_FORBIDDEN)
    return next((r for r in own if rejection.startswith(r + ":")), ConditionReason.FAILED_CREATE)


def _replica_failure(f: JobFacts) -> Verdict:
    if f.create_rejection:
        return True, rejection_reason(f.create_rejection), f.create_rejection
    return False, ConditionReason.PODS_CREATED, ""


def _progressing(f: JobFacts) -> Verdict:
    if f.phase in _PHASE_REASON:
        return False, _PHASE_REASON[f.phase], f"job is {f.phase}"
    if not f.progress_tracked or f.progress_deadline <= 0:
        why = (
            "the operator does not read progress"
            if not f.progress_tracked
            else "progressDeadlineSeconds is 0"
        )
        return ConditionStatus.UNKNOWN, ConditionReason.PROGRESS_NOT_READ, why
    if f.stalled_seconds is None:
        return ConditionStatus.UNKNOWN, ConditionReason.NOT_TRAINING, "the job is not Ready"
    at = "no step reported" if f.step is None else f"step {f.step}"
    after = f.stall_after or float(f.progress_deadline)
    if f.stalled_seconds > after:
        if after < f.progress_deadline:
            # Judged by the job's own pace (crash_loop.stall_threshold), well before the fixed deadline.
            reason = ConditionReason.PROGRESS_STALLED
            step = f"{STALL_STEPS} x the measured step time {f.step_seconds or 0:.2f} s"
            limit = f"stalled after {after:.0f} s: {step}, at least stallFloorSeconds, "
            limit += f"at most progressDeadlineSeconds {f.progress_deadline}"
        else:
            reason = ConditionReason.PROGRESS_DEADLINE_EXCEEDED
            limit = f"progressDeadlineSeconds {f.progress_deadline}"
        message = f"{at}: no progress for {f.stalled_seconds:.0f} s ({limit})"
        if f.last_error:
            message += f"; the trainer's last error: {f.last_error}"
        return False, reason, message
    return True, ConditionReason.STEP_ADVANCING, at


def _crash_looping(f: JobFacts) -> Verdict:
    if f.phase in _PHASE_REASON:
        return False, _PHASE_REASON[f.phase], f"job is {f.phase}"
    counted = f"{f.crashes} crashes in the last {f.crash_window} s"
    if not f.crash_looping:
        return False, ConditionReason.NO_RECENT_CRASHES, counted if f.crashes else ""
    message = f"{counted} (failed worker pods and restarts inside pods; {CRASH_LOOP_CRASHES} make a loop)"
    if f.crash_detail:
        message += f"{CRASH_DETAIL_SEP}{f.crash_detail}"
    return True, ConditionReason.REPEATED_CRASHES, message


def _pods_blocked(f: JobFacts) -> Verdict:
    if f.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED):
        return False, _PHASE_REASON[f.phase], f"job is {f.phase}"
    if f.blocked_reason is None:
        return False, ConditionReason.NO_BLOCKED_PODS, ""
    return True, f.blocked_reason, f.blocked_message


def _checkpoint_volatile(f: JobFacts) -> Verdict:
    if f.checkpoint_uri is not None:
        return False, ConditionReason.CHECKPOINT_OBJECT_STORE, f"checkpoints go to {f.checkpoint_uri}"
    if f.checkpoint_pvc is not None:
        return False, ConditionReason.CHECKPOINT_PVC, f"checkpoints go to the volume claim {f.checkpoint_pvc}"
    return True, ConditionReason.NO_DURABLE_CHECKPOINT, VOLATILE_MESSAGE


def _checkpoint_durable(f: JobFacts) -> Verdict:
    if f.checkpoint_error:
        left = f.max_failed_writes - f.failed_writes
        then = (
            f"{left} more and the workers stop" if left >= 0 else "the workers stop"
        ) + f" (checkpoint.maxFailedWrites {f.max_failed_writes})"
        newest = f"newest durable: {f.last_checkpoint}" if f.last_checkpoint else "none durable yet"
        message = f"{f.failed_writes} shared checkpoint writes failed in a row, {then}; {newest}; "
        return False, ConditionReason.CHECKPOINT_WRITE_FAILED, message + f"error: {f.checkpoint_error}"
    if f.checkpoint_uri is None and f.checkpoint_pvc is None:
        return ConditionStatus.UNKNOWN, ConditionReason.NO_DURABLE_CHECKPOINT, "see CheckpointVolatile"
    if f.last_checkpoint is None:
        return ConditionStatus.UNKNOWN, ConditionReason.NO_CHECKPOINT_YET, "no shared checkpoint written yet"
    return True, ConditionReason.CHECKPOINT_WRITTEN, f.last_checkpoint


# The table, in the order the conditions are listed in status.
RULES: tuple[tuple[ConditionType, Callable[[JobFacts], Verdict]], ...] = (
    (ConditionType.READY, _ready),
    (ConditionType.RESIZING, _resizing),
    (ConditionType.SUSPENDED, _suspended),
    (ConditionType.SUCCEEDED, _succeeded),
    (ConditionType.FAILED, _failed),
    (ConditionType.CAPACITY_AVAILABLE, _capacity),
    (ConditionType.REPLICA_FAILURE, _replica_failure),
    (ConditionType.PROGRESSING, _progressing),
    (ConditionType.CHECKPOINT_VOLATILE, _checkpoint_volatile),
    (ConditionType.CRASH_LOOPING, _crash_looping),
    (ConditionType.PODS_BLOCKED, _pods_blocked),
    (ConditionType.CHECKPOINT_DURABLE, _checkpoint_durable),
)


def build_conditions(
    prev: Sequence[Condition], facts: JobFacts, *, generation: int, now: datetime
) -> list[Condition]:
    conds = list(prev)
    for type_, rule in RULES:
        status, reason, message = rule(facts)
        conds = set_condition(conds, type_, status, str(reason), message, generation=generation, now=now)
    return conds


def ready_reason(conditions: Sequence[Condition]) -> str | None:
    return next((c.reason for c in conditions if c.type == ConditionType.READY), None)


def _status(conditions: Sequence[Condition], type_: str) -> str | None:
    return next((str(c.status) for c in conditions if c.type == type_), None)


def _message(conditions: Sequence[Condition], type_: str) -> str | None:
    return next((c.message for c in conditions if c.type == type_ and c.status == "True"), None)


def condition_warnings(
    prev: Sequence[Condition], conds: Sequence[Condition], phase: Phase, create_rejection: str | None
) -> list[KubeEvent]:
    """Warnings for conditions that just turned bad: no trainer image, no progress, a refused create, a crash
    loop, a failed write of the shared checkpoint. Each is posted on the transition only, not on every
    reconcile while it lasts."""
    events: list[KubeEvent] = []
    no_image = ConditionReason.NO_TRAINER_IMAGE
    if ready_reason(conds) == no_image and ready_reason(prev) != no_image:
        events.append(KubeEvent("Warning", no_image, NO_TRAINER_IMAGE_MESSAGE))
    if (
        _status(conds, ConditionType.PROGRESSING) == "False"
        and _status(prev, ConditionType.PROGRESSING) != "False"
        and phase in (Phase.RUNNING, Phase.RESIZING)
    ):
        cond = next(c for c in conds if c.type == ConditionType.PROGRESSING)
        events.append(KubeEvent("Warning", cond.reason, cond.message))  # ProgressStalled or ...Exceeded
    if (
        _status(conds, ConditionType.CRASH_LOOPING) == "True"
        and _status(prev, ConditionType.CRASH_LOOPING) != "True"
    ):
        message = next(c.message for c in conds if c.type == ConditionType.CRASH_LOOPING)
        events.append(KubeEvent("Warning", CRASH_LOOPING, message))
    blocked = next((c for c in conds if c.type == ConditionType.PODS_BLOCKED and c.status == "True"), None)
    was = next((c for c in prev if c.type == ConditionType.PODS_BLOCKED and c.status == "True"), None)
    if blocked is not None and (was is None or cause(was.reason) != cause(blocked.reason)):
        # Once per distinct cause, quoting the kubelet or the scheduler: not on every retry of the same pull,
        # nor when the scheduler's count of nodes changes.
        events.append(KubeEvent("Warning", blocked.reason, blocked.message))
    if (
        _status(conds, ConditionType.CHECKPOINT_DURABLE) == "False"
        and _status(prev, ConditionType.CHECKPOINT_DURABLE) != "False"
    ):
        cond = next(c for c in conds if c.type == ConditionType.CHECKPOINT_DURABLE)
        events.append(KubeEvent("Warning", cond.reason, cond.message))  # quotes the trainer's error
    if create_rejection and create_rejection != _message(prev, ConditionType.REPLICA_FAILURE):
        # Once per distinct refusal, not on every retry of the same one.
        events.append(KubeEvent("Warning", rejection_reason(create_rejection), create_rejection))
    return events

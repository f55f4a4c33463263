"""Status the planner writes: phase, the full conditions list, counts, resize history and progress.

Pure: built from the previous status and this round's observation. Deterministic for an unchanged
observation (lastTransitionTime only moves on a transition), so a no-op reconcile writes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from etj_contract.progress import ProgressDoc, ResizeRecord, TrainerResize
from etj_operator.api.models import (
    MAX_RESIZE_HISTORY,
    ConditionType,
    ElasticTrainingJobSpec,
    ElasticTrainingJobStatus,
    LastCheckpoint,
    Phase,
    Progress,
    ResizeEvent,
    set_condition,
)
from etj_operator.signals import INTERRUPTIONS, Reason
from etj_operator.timeutil import parse_time
from etj_operator.workload import worker_selector

if TYPE_CHECKING:
    from etj_operator.planner import Drain, KubeEvent

# A trainer-reported resize is the same event as one the operator recorded if the sizes match and
# the times are this close (the trainer's time is when training resumed, after the rendezvous).
RESIZE_MATCH_WINDOW = timedelta(seconds=300)


@dataclass(frozen=True)
class StatusInputs:
    job: str
    generation: int
    now: datetime
    prev: ElasticTrainingJobStatus
    spec: ElasticTrainingJobSpec
    running: int  # worker pods Running and not being drained
    desired: int
    drains: Sequence[Drain]
    failures: int
    failed: bool
    succeeded: bool
    suspended: bool
    terminating: bool  # worker pods still shutting down
    rendezvous_running: bool
    free_slots: int | None  # more workers that would fit on eligible nodes now; None: not computed (≥ min)
    progress: Mapping[str, Any] | None = None
    progress_time: datetime | None = None
    trainer_image: str | None = None  # what the pods run; None: no image anywhere, nothing can start
    usage_namespaces: tuple[str, ...] = ()  # namespaces whose pods' GPU use free_slots subtracts; (): all


NO_TRAINER_IMAGE = "NoTrainerImage"
NO_TRAINER_IMAGE_MESSAGE = (
    "spec.trainer.image is not set and the operator has no default trainer image: set spec.trainer.image, "
    "or the chart's trainer.image (etj operator run --default-trainer-image, ETJ_DEFAULT_TRAINER_IMAGE)"
)


PARTIAL_USAGE_NOTE = (
    "counting only GPUs used by pods in the watched namespaces: the operator is namespaced, so GPUs that "
    "pods of other namespaces use on the same nodes look free"
)


def _resize_reason(inp: StatusInputs, prev_running: int) -> str:
    worker_drains = [d for d in inp.drains if d.role == "worker"]
    if inp.running > prev_running:
        return Reason.CAPACITY_ADDED
    for preferred in (INTERRUPTIONS, {Reason.WORKER_FAILED}, set(Reason)):
        for drain in worker_drains:
            if drain.reason in preferred:
                return drain.reason
    return "WorkerLost"  # a worker stopped without anything we saw telling us why (e.g. deleted by hand)


def _phase(inp: StatusInputs, resizing: bool) -> Phase:
    if inp.failed:
        return Phase.FAILED
    if inp.succeeded:
        return Phase.SUCCEEDED
    if inp.suspended:
        return Phase.SUSPENDED
    if inp.running < inp.spec.replicas.min:
        return Phase.PENDING
    return Phase.RESIZING if resizing else Phase.RUNNING


def _apply_progress(st: ElasticTrainingJobStatus, data: Mapping[str, Any], at: datetime | None) -> None:
    """Copy the trainer's progress document (etj_contract.progress) into status; drop what does not parse."""
    doc = ProgressDoc.from_json(dict(data))
    fields = {
        "epoch": doc.epoch,
        "step": doc.step,
        "samplesSeen": doc.samples_seen,
        "samplesPerSecond": doc.samples_per_second,
        "loss": doc.loss,
        "accuracy": doc.accuracy,
    }
    try:
        progress = Progress.model_validate({k: v for k, v in fields.items() if v is not None})
        progress.last_update_time = at
        st.progress = progress
    except ValidationError:
        pass
    for value, attr in (
        (doc.world_size, "world_size"),
        (doc.per_worker_batch, "per_worker_batch"),
        (doc.accumulation_steps, "accumulation_steps"),
        (doc.lr_multiplier, "lr_multiplier"),
    ):
        if value is not None and value >= 0:
            setattr(st, attr, value)
    if doc.last_checkpoint is not None:
        with contextlib.suppress(ValidationError):
            st.last_checkpoint = LastCheckpoint.model_validate(doc.last_checkpoint)
    st.resize_history = merge_resizes(st.resize_history, doc.resizes)


# Reasons the trainer puts in its own resize records; the operator's reasons say *why*.
TRAINER_REASONS = frozenset(str(r) for r in TrainerResize)


def _latest_same_resize(
    history: Sequence[ResizeEvent], event: ResizeEvent, unmatched: Callable[[ResizeEvent], bool]
) -> ResizeEvent | None:
    """The newest entry for the same change (sizes, within the window) that ``unmatched`` says is still
    waiting for the other side's record of it."""
    return next(
        (
            e
            for e in reversed(history)
            if unmatched(e)
            and (e.from_, e.to) == (event.from_, event.to)
            and abs(e.time - event.time) <= RESIZE_MATCH_WINDOW
        ),
        None,
    )


def record_resize(history: Sequence[ResizeEvent], event: ResizeEvent) -> list[ResizeEvent]:
    """Add the operator's record of a running-count change.

    If the trainer already reported this resize -- an in-place leave re-forms the world before the pod
    is gone, so its report can arrive first -- give that entry the operator's reason instead of adding a
    second entry for the same resize.
    """
    out = [e.model_copy() for e in history]
    match = _latest_same_resize(out, event, lambda e: e.reason in TRAINER_REASONS)
    if match is None:
        return [*out, event][-MAX_RESIZE_HISTORY:]
    match.reason = event.reason
    return out


def merge_resizes(history: Sequence[ResizeEvent], reported: Sequence[ResizeRecord]) -> list[ResizeEvent]:
    """Merge the trainer's resize records into the operator's: enrich a matching entry, else append.

    Idempotent: an entry already enriched (same time and sizes) is left alone on the next poll.
    """
    out = [e.model_copy() for e in history]
    for record in reported:
        try:
            rep = ResizeEvent.model_validate({**record.to_json(), "time": parse_time(record.time)})
        except ValidationError:
            continue
        if any(e.time == rep.time and e.from_ == rep.from_ and e.to == rep.to for e in out):
            continue
        match = _latest_same_resize(out, rep, lambda e: e.pause_seconds is None)
        if match is not None:
            match.time = rep.time
            match.pause_seconds = rep.pause_seconds
            match.steps_lost = rep.steps_lost
            match.reason = match.reason or rep.reason
        else:
            out.append(rep)
    out.sort(key=lambda e: e.time)
    return out[-MAX_RESIZE_HISTORY:]


def build_status(inp: StatusInputs) -> tuple[ElasticTrainingJobStatus, list[KubeEvent]]:
    from etj_operator.planner import KubeEvent  # planner imports this module

    spec, now, gen = inp.spec, inp.now, inp.generation
    st = inp.prev.model_copy(deep=True)
    events: list[KubeEvent] = []
    st.observed_generation = gen
    st.desired_replicas = inp.desired
    st.current_replicas = inp.running
    st.workers = f"{inp.running}/{inp.desired}"
    st.selector = worker_selector(inp.job)
    st.failures = inp.failures

    prev_running = inp.prev.current_replicas or 0
    worker_drains = [d for d in inp.drains if d.role == "worker"]
    if inp.running != prev_running:
        reason = _resize_reason(inp, prev_running)
        st.resize_history = record_resize(
            st.resize_history,
            ResizeEvent.model_validate(
                {"time": now, "from": prev_running, "to": inp.running, "reason": str(reason)}
            ),
        )
        detail = "; ".join(d.message for d in worker_drains)
        events.append(
            KubeEvent(
                "Normal",
                str(reason),
                f"workers {prev_running} -> {inp.running}" + (f": {detail}" if detail else ""),
            )
        )
    elif worker_drains:
        # Pending workers drained (no running count change) still deserve a trace.
        events.append(
            KubeEvent("Normal", str(worker_drains[0].reason), "; ".join(d.message for d in worker_drains))
        )
    for drain in worker_drains:
        if drain.reason == Reason.WORKER_FAILED:
            events.append(
                KubeEvent(
                    "Warning",
                    str(Reason.WORKER_FAILED),
                    f"{drain.message}; {inp.failures}/{spec.failure_policy.max_failures} failures",
                )
            )

    if inp.progress:
        _apply_progress(st, inp.progress, inp.progress_time)
    if inp.trainer_image is not None:
        st.trainer_image = inp.trainer_image

    resizing = bool(worker_drains) or inp.terminating
    phase = _phase(inp, resizing)
    if phase != inp.prev.phase and phase == Phase.FAILED:
        events.append(
            KubeEvent(
                "Warning",
                str(Reason.FAILED),
                f"{inp.failures} worker failures exceed failurePolicy.maxFailures",
            )
        )
    st.phase = phase
    if st.start_time is None and inp.running > 0:
        st.start_time = now
    if phase in (Phase.SUCCEEDED, Phase.FAILED) and st.completion_time is None:
        st.completion_time = now

    conds = list(st.conditions)
    ready = phase in (Phase.RUNNING, Phase.RESIZING) and inp.rendezvous_running
    if ready:
        ready_reason, ready_msg = (
            "MinWorkersRunning",
            f"{inp.running} of {spec.replicas.min}..{spec.replicas.max} workers running",
        )
    elif phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED):
        ready_reason, ready_msg = str(phase), f"job is {phase}"
    elif inp.trainer_image is None:
        ready_reason, ready_msg = NO_TRAINER_IMAGE, NO_TRAINER_IMAGE_MESSAGE
        prev_ready = next((c for c in inp.prev.conditions if c.type == ConditionType.READY), None)
        if prev_ready is None or prev_ready.reason != NO_TRAINER_IMAGE:
            events.append(KubeEvent("Warning", NO_TRAINER_IMAGE, NO_TRAINER_IMAGE_MESSAGE))
    elif not inp.rendezvous_running:
        ready_reason, ready_msg = "RendezvousNotRunning", "the rendezvous store pod is not running yet"
    else:
        ready_reason, ready_msg = (
            "WaitingForWorkers",
            f"{inp.running} of at least {spec.replicas.min} workers running",
        )
    conds = set_condition(conds, ConditionType.READY, ready, ready_reason, ready_msg, generation=gen, now=now)
    if resizing:
        why = str(worker_drains[0].reason) if worker_drains else "WorkersTerminating"
        conds = set_condition(
            conds,
            ConditionType.RESIZING,
            True,
            why,
            "; ".join(d.message for d in worker_drains) or "waiting for drained workers to exit",
            generation=gen,
            now=now,
        )
    else:
        conds = set_condition(conds, ConditionType.RESIZING, False, "Stable", "", generation=gen, now=now)
    conds = set_condition(
        conds,
        ConditionType.SUSPENDED,
        inp.suspended,
        "SuspendedByUser" if inp.suspended else "NotSuspended",
        "",
        generation=gen,
        now=now,
    )
    conds = set_condition(
        conds,
        ConditionType.SUCCEEDED,
        phase == Phase.SUCCEEDED,
        "TrainingFinished" if phase == Phase.SUCCEEDED else "NotFinished",
        "",
        generation=gen,
        now=now,
    )
    conds = set_condition(
        conds,
        ConditionType.FAILED,
        phase == Phase.FAILED,
        "FailureBudgetExhausted" if phase == Phase.FAILED else "WithinFailureBudget",
        f"{inp.failures}/{spec.failure_policy.max_failures} worker failures",
        generation=gen,
        now=now,
    )
    if inp.free_slots is None:
        enough, capacity_msg = (
            True,
            f"{inp.running} workers running, at least replicas.min ({spec.replicas.min})",
        )
    else:
        reachable = inp.running + inp.free_slots
        enough = reachable >= spec.replicas.min
        room = min(reachable, spec.replicas.max)
        capacity_msg = f"room for {room} of {spec.replicas.min}..{spec.replicas.max} workers"
        if inp.usage_namespaces:
            capacity_msg += f" ({PARTIAL_USAGE_NOTE})"
    conds = set_condition(
        conds,
        ConditionType.CAPACITY_AVAILABLE,
        enough,
        "EnoughCapacity" if enough else "InsufficientCapacity",
        capacity_msg,
        generation=gen,
        now=now,
    )
    st.conditions = conds
    return st, events

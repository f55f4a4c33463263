"""Status the planner writes: phase, the full conditions list, counts, resize history and progress.

Pure: built from the previous status and this round's observation. Deterministic for an unchanged
observation (lastTransitionTime only moves on a transition), so a no-op reconcile writes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from etj_contract.progress import ProgressDoc
from etj_operator.api.models import (
    ConditionType,
    ElasticTrainingJobSpec,
    ElasticTrainingJobStatus,
    LastCheckpoint,
    Phase,
    Progress,
    ResizeEvent,
    ResizeMode,
)
from etj_operator.decide.failures.crash_loop import CRASH_LOOP_WINDOW_S, next_step_seconds, stall_threshold
from etj_operator.decide.failures.start_blocks import StartBlocks, failed_as
from etj_operator.decide.objects.names import worker_selector
from etj_operator.decide.status.conditions import (
    JobFacts,
    build_conditions,
    condition_warnings,
)
from etj_operator.decide.status.resize_history import mark_unjoined, merge_resizes, record_resize
from etj_operator.decide.types import Drain, KubeEvent
from etj_operator.observe.signals import INTERRUPTIONS, Reason


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
    create_rejection: str | None = None  # the apiserver refused a pod create (its message), still current
    progress_tracked: bool = True  # the operator reads the trainer's progress (--progress-seconds > 0)
    crashes: int = 0  # crashes within the crash-loop window (status.crashTimes)
    crash_looping: bool = False  # decide/failures/crash_loop.crash_looping
    crash_detail: str = ""  # the newest crash's cause, for the CrashLooping message
    finished: bool = False  # a worker exited 0 by itself: training is over (decide/plan/finish.py)
    start: StartBlocks = field(default_factory=StartBlocks)  # pods that never start; does that fail the job


def _resize_reason(inp: StatusInputs, prev_running: int) -> str:
    worker_drains = [d for d in inp.drains if d.role == "worker"]
    if inp.running > prev_running:
        return Reason.CAPACITY_ADDED
    for preferred in (INTERRUPTIONS, {Reason.WORKER_FAILED}, set(Reason)):
        for drain in worker_drains:
            if drain.reason in preferred:
                return drain.reason
    if inp.finished:
        # Workers that exit 0 by themselves are not drained, so no drain names the cause: the last one
        # of a job (or all of them at once) leaving after the final step is the job finishing.
        return Reason.FINISHED
    return (
        Reason.WORKER_LOST
    )  # a worker stopped without anything we saw telling us why (e.g. deleted by hand)


def world_running(inp: StatusInputs) -> bool:
    """Is a training world running, so that a change in running pods resizes it?

    Pods that start before the first world (0->1->3->4 while the first world waits for them, issue 16) are
    not resizes of anything, nor are pods exiting after the trainer finished: the timeline would show
    restarts that never happened. The trainer's first progress report is the proof that a world exists,
    its finished report that it is over; an operator that does not read progress (--progress-seconds 0)
    cannot tell, and records every change.
    """
    if not inp.progress_tracked:
        return True
    # A worker that exited 0 by itself is proof too: only the end of training lets one exit 0, and its
    # final report may not be read yet.
    finished = inp.succeeded or inp.finished or ProgressDoc.from_json(dict(inp.progress or {})).finished
    return inp.prev.progress is not None and not finished


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


def _apply_progress(
    st: ElasticTrainingJobStatus, data: Mapping[str, Any], at: datetime | None, procs_per_worker: int
) -> None:
    """Copy the trainer's progress document (etj_contract.progress) into status; drop what does not parse.

    The trainer counts ranks (worldSize, its resize records); status.resizeHistory counts worker pods.
    """
    doc = ProgressDoc.from_json(dict(data))
    fields = {
        "epoch": doc.epoch,
        "step": doc.step,
        "samplesSeen": doc.samples_seen,
        "samplesTotal": doc.samples_total,
        "samplesPerSecond": doc.samples_per_second,
        "loss": doc.loss,
        "accuracy": doc.accuracy,
    }
    try:
        progress = Progress.model_validate({k: v for k, v in fields.items() if v is not None})
        progress.last_update_time = at
        before = st.progress
        changed = before is None or before.step != progress.step
        progress.last_step_time = at if changed else before.last_step_time if before else None
        progress.step_seconds = before.step_seconds if before else None
        if changed and before is not None and progress.step is not None and at is not None:
            progress.step_seconds = next_step_seconds(
                before.step_seconds, before.last_step_time, before.step, progress.step, at
            )
        # The store's crash count, so the next read counts only its increase (decide/plan/judge_steps.py
        # count_crashes).
        progress.crashes = doc.crashes if doc.crashes is not None else before.crashes if before else None
        st.progress = progress
    except ValidationError:
        pass
    for value, attr in (
        (doc.world_size, "world_size"),
        (doc.per_rank_batch, "per_rank_batch"),
        (doc.per_worker_batch, "per_worker_batch"),
        (doc.accumulation_steps, "accumulation_steps"),
        (doc.lr_multiplier, "lr_multiplier"),
        (doc.lr, "lr"),
    ):
        if value is not None and value >= 0:
            setattr(st, attr, value)
    if doc.last_checkpoint is not None:
        with contextlib.suppress(ValidationError):
            st.last_checkpoint = LastCheckpoint.model_validate(doc.last_checkpoint)
    st.resize_history = merge_resizes(st.resize_history, doc.resizes, procs_per_worker)


def stalled_seconds(inp: StatusInputs, st: ElasticTrainingJobStatus) -> float | None:
    """How long the step has stood still while the job was Ready; None while it is not Ready.

    The clock starts at the later of the step's last change and the job becoming Ready, so a job that
    waited for capacity (or its first step) is not stalled by that wait.
    """
    if st.phase not in (Phase.RUNNING, Phase.RESIZING) or not inp.rendezvous_running:
        return None  # not Ready (conditions._ready)
    ready = next(
        (c for c in inp.prev.conditions if c.type == ConditionType.READY and c.status == "True"), None
    )
    since = ready.last_transition_time if ready is not None else inp.now
    step_time = st.progress.last_step_time if st.progress else None
    if step_time is not None and step_time > since:
        since = step_time
    return max(0.0, (inp.now - since).total_seconds())


def _facts(
    inp: StatusInputs,
    st: ElasticTrainingJobStatus,
    phase: Phase,
    resizing: bool,
    worker_drains: Sequence[Drain],
) -> JobFacts:
    """What the condition rules look at, from this round's inputs."""
    spec = inp.spec
    doc = ProgressDoc.from_json(dict(inp.progress or {}))
    last = st.last_checkpoint
    return JobFacts(
        phase=phase,
        running=inp.running,
        min_workers=spec.replicas.min,
        max_workers=spec.replicas.max,
        rendezvous_running=inp.rendezvous_running,
        has_trainer_image=inp.trainer_image is not None,
        suspended=inp.suspended,
        resizing=resizing,
        drain_reason=str(worker_drains[0].reason) if worker_drains else None,
        drain_messages="; ".join(d.message for d in worker_drains),
        failures=inp.failures,
        max_failures=spec.failure_policy.max_failures,
        free_slots=inp.free_slots,
        partial_usage=bool(inp.usage_namespaces),
        create_rejection=inp.create_rejection,
        stalled_seconds=stalled_seconds(inp, st),
        progress_deadline=inp.spec.failure_policy.progress_deadline_seconds,
        stall_after=stall_threshold(st.progress.step_seconds if st.progress else None, spec.failure_policy),
        step_seconds=st.progress.step_seconds if st.progress else None,
        crashes=inp.crashes,
        crash_looping=inp.crash_looping,
        crash_window=CRASH_LOOP_WINDOW_S,
        crash_detail=inp.crash_detail,
        progress_tracked=inp.progress_tracked,
        step=st.progress.step if st.progress else None,
        last_error=doc.last_error,
        checkpoint_pvc=spec.checkpoint.pvc.claim_name if spec.checkpoint.pvc is not None else None,
        checkpoint_uri=spec.checkpoint.uri,
        blocked_reason=inp.start.reason,
        blocked_message=inp.start.message,
        failed_as=failed_as(inp.start, inp.prev.conditions, inp.failed),
        checkpoint_error=doc.checkpoint_error,
        failed_writes=doc.failed_writes or 0,
        max_failed_writes=spec.checkpoint.max_failed_writes,
        last_checkpoint=f"step {last.step} at {last.path}" if last is not None else None,
    )


def build_status(inp: StatusInputs) -> tuple[ElasticTrainingJobStatus, list[KubeEvent]]:
    now, gen = inp.now, inp.generation
    st = inp.prev.model_copy(deep=True)
    events: list[KubeEvent] = []
    st.observed_generation = gen
    st.desired_replicas = inp.desired
    st.current_replicas = inp.running
    st.workers = f"{inp.running}/{inp.desired}"
    st.selector = worker_selector(inp.job)
    st.failures = inp.failures

    worker_drains = [d for d in inp.drains if d.role == "worker"]
    events += _record_worker_changes(inp, st, worker_drains)

    if inp.progress:
        _apply_progress(st, inp.progress, inp.progress_time, inp.spec.procs_per_worker)
    if inp.succeeded or ProgressDoc.from_json(dict(inp.progress or {})).finished:
        # The trainer's final report holds every resize it made: a scale-up still unmeasured never joined.
        st.resize_history = mark_unjoined(st.resize_history)
    if inp.trainer_image is not None:
        st.trainer_image = inp.trainer_image
    st.resize_mode = ResizeMode.IN_PLACE if inp.spec.resizes_in_place else ResizeMode.RESTART

    resizing = bool(worker_drains) or inp.terminating
    phase = _phase(inp, resizing)
    if phase != inp.prev.phase and phase == Phase.FAILED:
        budget = f"{inp.failures} worker failures exceed failurePolicy.maxFailures"
        message = inp.start.failure_message or budget  # a pod that never started, or the budget
        events.append(KubeEvent("Warning", str(Reason.FAILED), message))
    st.phase = phase
    if st.start_time is None and inp.running > 0:
        st.start_time = now
    if phase in (Phase.SUCCEEDED, Phase.FAILED) and st.completion_time is None:
        st.completion_time = now

    facts = _facts(inp, st, phase, resizing, worker_drains)
    conds = build_conditions(st.conditions, facts, generation=gen, now=now)
    events += condition_warnings(inp.prev.conditions, conds, phase, inp.create_rejection)
    st.conditions = conds
    return st, events


def _record_worker_changes(
    inp: StatusInputs, st: ElasticTrainingJobStatus, worker_drains: list[Drain]
) -> list[KubeEvent]:
    """A change of the running count: into resize history (once the world runs) and an Event; drains of
    pending workers a trace of their own; each crashed worker a Warning with the failure budget."""
    events: list[KubeEvent] = []
    prev_running = inp.prev.current_replicas or 0
    if inp.running != prev_running:
        reason = _resize_reason(inp, prev_running)
        if world_running(inp):
            st.resize_history = record_resize(
                st.resize_history,
                ResizeEvent.model_validate(
                    {"time": inp.now, "from": prev_running, "to": inp.running, "reason": str(reason)}
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
    budget = inp.spec.failure_policy.max_failures
    for drain in worker_drains:
        if drain.reason == Reason.WORKER_FAILED:
            events.append(
                KubeEvent(
                    "Warning", str(Reason.WORKER_FAILED), f"{drain.message}; {inp.failures}/{budget} failures"
                )
            )
    return events

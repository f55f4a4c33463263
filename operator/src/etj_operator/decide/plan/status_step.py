"""The planner's status step: phase, conditions, counts and Events from what the steps before it decided
(decide/status/job_status.py builds them; this gathers its inputs and adds the failure bookkeeping)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from etj_operator.api.models import ElasticTrainingJobStatus
from etj_operator.decide.failures.crash_loop import Crashes, stall_wake_in
from etj_operator.decide.failures.start_blocks import StartBlocks
from etj_operator.decide.plan.capacity import LazyCapacity
from etj_operator.decide.plan.finish import Finish
from etj_operator.decide.plan.judge_steps import Avoided, Failures
from etj_operator.decide.plan.model import JobPods, JobView, Observed, StepResult, Verdict
from etj_operator.decide.status.job_status import StatusInputs, build_status, stalled_seconds
from etj_operator.decide.types import Drain
from etj_operator.observe.pods import PodInfo


@dataclass(frozen=True, kw_only=True)
class StatusWritten(StepResult):
    status: ElasticTrainingJobStatus


@dataclass(frozen=True)
class Judged:
    """What the judging steps settled that status reports."""

    verdict: Verdict
    finish: Finish
    failures: Failures
    crashes: Crashes
    start: StartBlocks
    avoided: Avoided


def write_status(
    job: JobView,
    obs: Observed,
    pods: JobPods,
    survivors: Sequence[PodInfo],
    drains: Sequence[Drain],
    judged: Judged,
    trainer_image: str | None,
    room: LazyCapacity,
) -> StatusWritten:
    """Phase, conditions, counts and events (decide/status/job_status.py), and when the step would count as
    stalled. ``drains``: every drain of this reconcile so far."""
    spec, verdict = job.spec, judged.verdict
    running = sum(1 for p in survivors if p.running)
    inputs = StatusInputs(
        job=job.name,
        generation=job.generation,
        now=obs.now,
        prev=job.status,
        spec=spec,
        running=running,
        desired=0 if verdict.stop_reason is not None else spec.replicas.max,
        drains=drains,
        failures=judged.failures.budget,
        failed=verdict.failed,
        succeeded=verdict.terminal and not verdict.failed,
        suspended=spec.suspend and not verdict.terminal,
        terminating=any(p.terminating for p in pods.workers),
        rendezvous_running=any(p.running for p in pods.live_rdzv),
        # Below min is the only time "is there room for min?" is a question; skip the pass otherwise.
        free_slots=room.get().total if running < spec.replicas.min else None,
        progress=obs.progress,
        progress_time=obs.progress_time,
        trainer_image=trainer_image,
        usage_namespaces=obs.usage_namespaces,
        create_rejection=obs.create_rejection,
        progress_tracked=obs.progress_tracked,
        crashes=len(judged.crashes.times),
        crash_looping=judged.crashes.looping,
        crash_detail=judged.crashes.detail,
        finished=judged.finish.done or judged.finish.awaiting_report,
        start=judged.start,
    )
    status, events = build_status(inputs)
    # Wake when the step would count as stalled: the resync alone could be late by that much.
    wake = stall_wake_in(status.progress, stalled_seconds(inputs, status), spec.failure_policy)
    # status.failures stays the job's whole-life count; the budget's window lives in failureTimes.
    status.failures = judged.failures.total
    status.failure_times = judged.failures.times
    status.avoided_nodes = judged.avoided.nodes
    status.crash_times = judged.crashes.times
    return StatusWritten(status=status, events=tuple(events), wake_in=wake)

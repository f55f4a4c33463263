"""The planner's steps that judge how the job stands: failures and crashes counted, the verdict (finished,
failed, suspended), pods that never start, nodes to avoid, and when a finished job expires.

Each takes only what it reads and returns its decision as a ``StepResult`` subclass the planner merges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from etj_operator.api.models import ElasticTrainingJobSpec, ElasticTrainingJobStatus, Phase
from etj_operator.api.status import AvoidedNode
from etj_operator.decide.failures.bad_nodes import (
    AVOIDING_NODE,
    avoid_nodes,
    budget_failures,
    record_failures,
)
from etj_operator.decide.failures.crash_loop import Crashes, judge_crashes
from etj_operator.decide.failures.start_blocks import StartBlocks, judge_start, not_ready_since
from etj_operator.decide.plan.finish import FINAL_REPORT_MISSING, Finish, finish
from etj_operator.decide.plan.model import JobPods, Observed, StepResult, Verdict
from etj_operator.decide.types import Drain, KubeEvent
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import INTERRUPTIONS, Reason


@dataclass(frozen=True)
class Failures:
    new: int = 0  # this reconcile's failures (crashes, and interruptions if the policy counts them)
    total: int = 0  # the job's whole-life count (status.failures), this reconcile's included
    times: list[datetime] = field(default_factory=list)  # status.failureTimes, this reconcile's in
    budget: int = 0  # those that count against maxFailures (failureWindowSeconds)


def count_failures(
    spec: ElasticTrainingJobSpec,
    prev: ElasticTrainingJobStatus,
    drains: Sequence[Drain],
    crashed: int,
    now: datetime,
) -> Failures:
    """``crashed`` workers, and interruptions among ``drains`` when the failure policy counts them."""
    policy = spec.failure_policy
    new = crashed
    if policy.count_interruptions:
        new += sum(1 for d in drains if d.reason in INTERRUPTIONS)
    total = (prev.failures or 0) + new
    times = record_failures(prev.failure_times, new, now, policy)
    return Failures(new, total, times, budget_failures(times, total, policy))


@dataclass(frozen=True, kw_only=True)
class CrashCount(StepResult):
    crashes: Crashes


def count_crashes(
    prev: ElasticTrainingJobStatus, progress: Mapping[str, Any] | None, drains: Sequence[Drain], now: datetime
) -> CrashCount:
    """Crashes for CrashLooping: failed worker pods, restarts inside pods (decide/failures/crash_loop.py)."""
    pods = [d.message for d in drains if d.reason == Reason.WORKER_FAILED and d.role == "worker"]
    stopped = prev.phase in (Phase.SUCCEEDED, Phase.FAILED)
    crashes = judge_crashes(prev, progress, pods, now, stopped)
    return CrashCount(crashes=crashes, wake_in=crashes.wake_in)


@dataclass(frozen=True, kw_only=True)
class Outcome(StepResult):
    finish: Finish
    verdict: Verdict


def judge_outcome(
    spec: ElasticTrainingJobSpec,
    prev: ElasticTrainingJobStatus,
    workers: Sequence[PodInfo],
    obs: Observed,
    failures: Failures,
) -> Outcome:
    """Which terminal state or suspension applies, if any: the reason every worker stops."""
    done = finish(workers, obs)
    failed = prev.phase == Phase.FAILED or failures.budget > spec.failure_policy.max_failures
    terminal = failed or prev.phase == Phase.SUCCEEDED or done.done
    stop = (Reason.FAILED if failed else Reason.FINISHED) if terminal else None
    if stop is None and spec.suspend:
        stop = Reason.SUSPENDED
    # Awaiting the final report: the reconciler re-reads the store each time round.
    wake = 1.0 if done.awaiting_report else None
    return Outcome(finish=done, verdict=Verdict(failed, terminal, stop), wake_in=wake)


@dataclass(frozen=True, kw_only=True)
class StartJudged(StepResult):
    start: StartBlocks = field(default_factory=StartBlocks)
    verdict: Verdict  # the job's verdict, Failed when its pods waited past the deadline


def judge_start_blocks(
    spec: ElasticTrainingJobSpec,
    prev: ElasticTrainingJobStatus,
    verdict: Verdict,
    pods: JobPods,
    survivors: Sequence[PodInfo],
    now: datetime,
) -> StartJudged:
    """Pods that never start (a missing image or Secret, no node that fits): reported, and after
    failurePolicy.podStartDeadlineSeconds of the job waiting for them, the job fails
    (decide/failures/start_blocks.py). A stopped job waits for nothing."""
    if verdict.stop_reason is not None:
        return StartJudged(verdict=verdict)
    live = pods.live_rdzv
    running = sum(1 for p in survivors if p.running)
    ready = running >= spec.replicas.min and any(p.running for p in live)
    since = not_ready_since(prev.conditions)
    deadline = spec.failure_policy.pod_start_deadline_seconds
    start = judge_start([*pods.active, *live], ready, since, now, deadline, prev.start_time is not None)
    if start.failure is not None:
        verdict = Verdict(failed=True, terminal=True, stop_reason=Reason.FAILED)
    # A pod event may never come: the wait itself ends the job.
    return StartJudged(start=start, verdict=verdict, wake_in=start.wake_in)


@dataclass(frozen=True, kw_only=True)
class Avoided(StepResult):
    nodes: list[AvoidedNode] = field(default_factory=list)  # status.avoidedNodes

    @property
    def names(self) -> list[str]:
        return [a.node for a in self.nodes]


def avoid_failed_nodes(
    spec: ElasticTrainingJobSpec,
    prev: ElasticTrainingJobStatus,
    drains: Sequence[Drain],
    terminal: bool,
    now: datetime,
) -> Avoided:
    """New workers stay off a node where a worker crashed (failurePolicy.avoidNodeSeconds): a bad GPU or a
    full disk would crash its replacement too. Interruptions and drains say nothing about the node's health
    and are not avoided; neither is anything once the job stops."""
    crashed = [
        (d.node, d.message)
        for d in drains
        if d.reason == Reason.WORKER_FAILED and d.role == "worker" and d.node and not terminal
    ]
    seconds = spec.failure_policy.avoid_node_seconds
    avoided = avoid_nodes(prev.avoided_nodes, crashed, now, seconds, spec.replicas.max)
    fresh = {node for node, _ in crashed}
    events = tuple(
        KubeEvent(
            "Warning",
            AVOIDING_NODE,
            f"new workers avoid node {a.node} until {a.until.isoformat()}: {a.reason}",
        )
        for a in avoided
        if a.node in fresh  # added or refreshed by this crash (not every reconcile while it lasts)
    )
    return Avoided(nodes=avoided, events=events)


def warn_report_missing(done: Finish, prev: ElasticTrainingJobStatus) -> StepResult:
    """Succeeded without the trainer's final report: say so once, on the reconcile that decides it."""
    if done.report_missing and prev.phase != Phase.SUCCEEDED:
        return StepResult(events=(KubeEvent("Warning", FINAL_REPORT_MISSING, done.report_missing),))
    return StepResult()


@dataclass(frozen=True, kw_only=True)
class Expiry(StepResult):
    delete_job: bool = False


def expire_ttl(
    spec: ElasticTrainingJobSpec, terminal: bool, completed: datetime | None, now: datetime
) -> Expiry:
    """ttlSecondsAfterFinished: delete the finished job when it expires, else look again then. ``completed``:
    the completion time this reconcile's status says."""
    ttl = spec.ttl_seconds_after_finished
    if not terminal or ttl is None or completed is None:
        return Expiry()
    left = (completed + timedelta(seconds=ttl) - now).total_seconds()
    return Expiry(delete_job=True) if left <= 0 else Expiry(wake_in=left)

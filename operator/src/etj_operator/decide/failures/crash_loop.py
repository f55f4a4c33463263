"""Crash loops and stalls, judged soon (pure): the job's Events and conditions within two minutes.

- **Crash loop.** A crash is a worker pod that failed (``drain_crashed``) or a restart inside a pod that its
  agent reported to the store (the progress document's ``crashes`` counter: the agent restarts crashed
  workers and starts its own count again after progress, so the pod never fails while the loop makes some
  progress between crashes). Their times live in ``status.crashTimes``, within ``CRASH_LOOP_WINDOW_S``.
  One fault takes its peers down with it (every agent of the world restarts at once), so crashes less
  than ``CRASH_COLLAPSE_S`` apart are one. The job is crash looping from the ``CRASH_LOOP_CRASHES``-th crash
  within the window, with or without progress in between, until it runs a whole window without one
  (the hysteresis keeps a loop slower than the threshold from flapping the condition and its Event).
- **Stall.** The step may stand still for ``STALL_STEPS`` measured step times
  (``status.progress.stepSeconds``), but at least ``failurePolicy.stallFloorSeconds`` (a resize or a
  restore pauses a few seconds) and at most ``failurePolicy.progressDeadlineSeconds`` (the user's bound, as
  before). Without a measured step time the deadline alone applies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from etj_contract.progress import ProgressDoc
from etj_operator.api.models import ConditionType, ElasticTrainingJobStatus, FailurePolicy
from etj_operator.api.status import MAX_FAILURE_TIMES, Progress

CRASH_LOOP_CRASHES = 3  # crashes within the window that make a loop
CRASH_LOOP_WINDOW_S = 600  # and the window: also how long the job must run clean before the loop ends
CRASH_COLLAPSE_S = 10  # crashes closer than this are one fault (peers restart together)
STALL_STEPS = 20  # step times without a step before the step counts as stalled
STEP_SECONDS_WEIGHT = 0.3  # weight of a new sample in the moving average of the step time
CRASH_LOOPING = "CrashLooping"  # the Warning Event's reason when the condition turns True
CRASH_DETAIL_SEP = "; the last: "  # in the condition's message, before the newest crash's cause


def reported_crashes(before: int | None, now: int | None) -> int:
    """Crashes the store counted since the last read: the increase of its counter. A smaller count is a new
    store (the old one moved or was lost, its count with it): all of its crashes are new."""
    if now is None:
        return 0
    if before is None or now < before:
        return now
    return now - before


def record_crashes(times: Sequence[datetime], new: int, now: datetime) -> list[datetime]:
    """status.crashTimes with ``new`` crashes at ``now``: entries older than the window dropped, crashes
    within CRASH_COLLAPSE_S of the last one kept as one, bounded."""
    start = now - timedelta(seconds=CRASH_LOOP_WINDOW_S)
    kept = [t for t in times if t > start]
    if new > 0 and not (kept and (now - kept[-1]).total_seconds() < CRASH_COLLAPSE_S):
        kept.append(now)
    return kept[-MAX_FAILURE_TIMES:]


def crash_looping(times: Sequence[datetime], was_looping: bool) -> bool:
    """Looping from the CRASH_LOOP_CRASHES-th crash in the window; once looping, until none is left in it."""
    return len(times) >= CRASH_LOOP_CRASHES or (was_looping and len(times) > 0)


def loop_ends_in(times: Sequence[datetime], now: datetime) -> float | None:
    """Seconds until the newest crash leaves the window (the loop can end then); None without crashes."""
    if not times:
        return None
    return max(0.0, (times[-1] + timedelta(seconds=CRASH_LOOP_WINDOW_S) - now).total_seconds())


def stall_threshold(step_seconds: float | None, policy: FailurePolicy) -> float:
    """Seconds without a step after which the job counts as stalled; 0: the check is off."""
    deadline = policy.progress_deadline_seconds
    if deadline <= 0:
        return 0.0
    if step_seconds is None:
        return float(deadline)
    return min(float(deadline), max(float(policy.stall_floor_seconds), STALL_STEPS * step_seconds))


def next_step_seconds(
    before: float | None, last_step_time: datetime | None, last_step: int | None, step: int, at: datetime
) -> float | None:
    """The moving average of the step time after the step changed from ``last_step`` (seen at
    ``last_step_time``) to ``step`` (seen at ``at``). Samples are as coarse as the operator's reads, and a
    pause (a resize, a restore) inflates one of them, which only makes the stall threshold more patient
    for a while. A step that went back (a restore) is no sample."""
    if last_step_time is None or last_step is None or step <= last_step:
        return before
    sample = max(0.0, (at - last_step_time).total_seconds()) / (step - last_step)
    if before is None:
        return sample
    return (1 - STEP_SECONDS_WEIGHT) * before + STEP_SECONDS_WEIGHT * sample


def stall_wake_in(progress: Progress | None, stalled: float | None, policy: FailurePolicy) -> float | None:
    """Seconds until the step would count as stalled, for a job whose step time is measured (the threshold
    adapts down to stallFloorSeconds, and the resync alone could be late by that much); None otherwise (the
    fixed deadline is judged on the resync, as before)."""
    if progress is None or progress.step_seconds is None or stalled is None:
        return None
    after = stall_threshold(progress.step_seconds, policy)
    return after - stalled + 1.0 if after > 0 and stalled <= after else None


@dataclass(frozen=True)
class Crashes:
    times: list[datetime] = field(default_factory=list)  # status.crashTimes
    looping: bool = False
    detail: str = ""  # the newest crash's cause (the CrashLooping message names it)
    wake_in: float | None = None  # look again then: the loop can end (nothing else may wake the job)


def judge_crashes(
    prev: ElasticTrainingJobStatus,
    progress: Mapping[str, Any] | None,
    failed_pods: Sequence[str],
    now: datetime,
    stopped: bool,
) -> Crashes:
    """This reconcile's crashes (``failed_pods``: the messages of the worker pods that failed, and the
    store's crash counter in ``progress`` against status.progress.crashes) and the verdict on them.

    Idempotent for one observation: the counter's increase is measured against the status this plan read,
    so a plan computed again (a status write that conflicted) counts the same crashes once."""
    doc = ProgressDoc.from_json(dict(progress or {}))
    seen = prev.progress.crashes if prev.progress is not None else None
    new = 0 if stopped else len(failed_pods) + reported_crashes(seen, doc.crashes)
    times = record_crashes(prev.crash_times, new, now)
    was = next((x for x in prev.conditions if x.type == ConditionType.CRASH_LOOPING), None)
    was_looping = was is not None and was.status == "True"
    looping = crash_looping(times, was_looping)
    detail = ""
    if new:
        detail = failed_pods[-1] if failed_pods else doc.last_error or ""
    elif was_looping and was is not None:
        detail = was.message.partition(CRASH_DETAIL_SEP)[2]  # unchanged until the next crash
    ends = loop_ends_in(times, now) if looping else None
    return Crashes(times, looping, detail, None if ends is None else ends + 1.0)

"""Crash loops and stalls are visible within two minutes (issue 26): named tables of reconcile timelines.

A crash is a failed worker pod or a restart inside a pod that its agent reported to the store (the progress
document's ``crashes`` counter). Before this, an agent's crash budget restarted its count after any
progress, so a loop that made a few steps between crashes kept Progressing True and posted nothing; and a
stall was judged only after progressDeadlineSeconds (600 s), whatever the job's pace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from etj_contract.progress import ProgressDoc, merge
from etj_operator.api.models import ConditionType, ElasticTrainingJobStatus, FailurePolicy
from etj_operator.decide.failures.crash_loop import (
    CRASH_LOOP_WINDOW_S,
    next_step_seconds,
    record_crashes,
    reported_crashes,
    stall_threshold,
)
from etj_operator.decide.plan.planner import plan
from etj_operator.observe.pods import PodInfo
from tests.operator.factories import NOW, cluster, job, observe, spec, started, store, worker

RUNNING = [worker(i, f"spot-{i}") for i in range(4)]
CRASHED = worker(3, "spot-3", phase="Failed", exit_code=1)


def doc(step: int, crashes: int | None = None, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step, "resizes": [], "finished": False, **kw}
    if crashes is not None:
        out["crashes"] = crashes
    return out


@dataclass(frozen=True)
class Round:
    at: float  # seconds after NOW
    progress: dict[str, Any] | None  # what the store holds
    looping: str  # the CrashLooping condition's status after this round
    pods: tuple[PodInfo, ...] = (*RUNNING, store())


@dataclass(frozen=True)
class LoopCase:
    name: str
    rounds: list[Round]
    warned_at: list[float] = field(
        default_factory=list
    )  # rounds (their ``at``) that post a CrashLooping Warning
    message: str = ""  # text the Warning contains


def crash_round(at: float, step: int, crashes: int, looping: str) -> Round:
    return Round(
        at, doc(step, crashes, lastError="RuntimeError: CUDA error: an illegal memory access"), looping
    )


LOOP_CASES = [
    LoopCase(
        "crashes inside the pods with progress between them are a loop from the third, within a minute",
        [
            Round(0, doc(100), "False"),
            crash_round(20, 130, 1, "False"),
            crash_round(40, 160, 2, "False"),
            crash_round(60, 190, 3, "True"),
            Round(80, doc(220, 3), "True"),
        ],
        warned_at=[60],
        message="3 crashes in the last 600 s",
    ),
    LoopCase(
        "failed worker pods are crashes too, and the Warning names the last one's cause",
        [
            Round(0, doc(100), "False", (*RUNNING[:3], CRASHED, store())),
            Round(30, doc(110), "False", (*RUNNING[:3], CRASHED, store())),
            Round(60, doc(120), "True", (*RUNNING[:3], CRASHED, store())),
        ],
        warned_at=[60],
        message="worker train-worker-3 failed (exit code 1)",
    ),
    LoopCase(
        "a pod failure and restarts inside pods add up",
        [
            Round(0, doc(100, 0), "False", (*RUNNING[:3], CRASHED, store())),
            crash_round(30, 130, 1, "False"),
            crash_round(60, 160, 2, "True"),
        ],
        warned_at=[60],
    ),
    LoopCase(
        "peers that crash with the fault (one read, or seconds apart) are one crash",
        [
            Round(0, doc(100, 0), "False"),
            crash_round(20, 100, 4, "False"),  # four agents restarted at once
            crash_round(25, 100, 6, "False"),  # two more, five seconds later
        ],
    ),
    LoopCase(
        "two crashes in ten minutes are no loop",
        [
            Round(0, doc(100, 0), "False"),
            crash_round(100, 200, 1, "False"),
            crash_round(650, 900, 2, "False"),
            crash_round(1200, 1500, 3, "False"),  # the first left the window
        ],
    ),
    LoopCase(
        "a loop ends once the job ran a whole window clean, and one crash then is no new loop",
        [
            Round(0, doc(100, 0), "False"),
            crash_round(20, 120, 1, "False"),
            crash_round(40, 140, 2, "False"),
            crash_round(60, 160, 3, "True"),
            crash_round(400, 500, 4, "True"),  # still looping: no second Warning
            Round(399 + CRASH_LOOP_WINDOW_S, doc(900, 4), "True"),
            Round(400 + CRASH_LOOP_WINDOW_S, doc(910, 4), "False"),  # the newest crash is a window old
            crash_round(1100, 1200, 5, "False"),
        ],
        warned_at=[60],
    ),
    LoopCase(
        "a new store (its count restarted) counts its own crashes, not a negative number",
        [
            Round(0, doc(100), "False"),
            crash_round(20, 120, 7, "False"),
            crash_round(40, 10, 1, "False"),  # a new store: its first crash
            crash_round(60, 20, 2, "True"),
        ],
        warned_at=[60],
    ),
]


@pytest.mark.parametrize("case", LOOP_CASES, ids=lambda c: c.name)
def test_crash_loop(case: LoopCase) -> None:
    s = spec(failurePolicy={"maxFailures": 100, "failureWindowSeconds": 0})
    st: ElasticTrainingJobStatus = started(4, progress=None)
    warned: list[float] = []
    messages: list[str] = []
    for r in case.rounds:
        now = NOW + timedelta(seconds=r.at)
        obs = observe(cluster(), list(r.pods), now=now, progress=r.progress, progress_time=now)
        out = plan(job(s, st), obs)
        st = out.status
        cond = next(c for c in st.conditions if c.type == ConditionType.CRASH_LOOPING)
        assert cond.status == r.looping, (r, cond)
        events = [e for e in out.events if e.reason == "CrashLooping"]
        assert all(e.type == "Warning" for e in events)
        warned += [r.at] * len(events)
        messages += [e.message for e in events]
        if cond.status == "True":
            assert cond.reason == "RepeatedCrashes" and out.requeue_after is not None, out
            # it wakes when the loop can end, even if nothing else happens
            newest = max(st.crash_times)
            assert out.requeue_after <= (newest - now).total_seconds() + CRASH_LOOP_WINDOW_S + 1
    assert warned == case.warned_at
    assert all(case.message in m for m in messages), messages


@dataclass(frozen=True)
class StallRound:
    at: float
    step: int
    status: str  # Progressing after this round
    reason: str
    wake: float | None = None  # the plan's requeue_after, when it must be there


@dataclass(frozen=True)
class StallCase:
    name: str
    policy: dict[str, int]
    rounds: list[StallRound]


STALL_CASES = [
    StallCase(
        "a job stepping each second stalls after the 90 s floor, not the 600 s deadline, and wakes for it",
        {},
        [
            StallRound(0, 100, "True", "StepAdvancing"),
            StallRound(5, 105, "True", "StepAdvancing"),
            StallRound(10, 110, "True", "StepAdvancing", wake=91),
            StallRound(100, 110, "True", "StepAdvancing", wake=1),
            StallRound(101.5, 110, "False", "ProgressStalled"),
        ],
    ),
    StallCase(
        "a slow job (20 s a step) gets 20 step times",
        {},
        [
            StallRound(0, 10, "True", "StepAdvancing"),
            StallRound(20, 11, "True", "StepAdvancing"),
            StallRound(40, 12, "True", "StepAdvancing", wake=401),
            StallRound(430, 12, "True", "StepAdvancing"),
            StallRound(441, 12, "False", "ProgressStalled"),
        ],
    ),
    StallCase(
        "never later than progressDeadlineSeconds (60 s a step: 20 step times are past the deadline)",
        {"progressDeadlineSeconds": 600},
        [
            StallRound(0, 10, "True", "StepAdvancing"),
            StallRound(60, 11, "True", "StepAdvancing"),
            StallRound(120, 12, "True", "StepAdvancing", wake=601),
            StallRound(721, 12, "False", "ProgressDeadlineExceeded"),
        ],
    ),
    StallCase(
        "a floor at the deadline keeps the fixed deadline (long checkpoint pauses)",
        {"progressDeadlineSeconds": 600, "stallFloorSeconds": 600},
        [
            StallRound(0, 100, "True", "StepAdvancing"),
            StallRound(10, 110, "True", "StepAdvancing"),
            StallRound(300, 110, "True", "StepAdvancing"),
            StallRound(611, 110, "False", "ProgressDeadlineExceeded"),
        ],
    ),
]


@pytest.mark.parametrize("case", STALL_CASES, ids=lambda c: c.name)
def test_stall(case: StallCase) -> None:
    s = spec(failurePolicy={"maxFailures": 2, **case.policy})
    st: ElasticTrainingJobStatus = started(4, progress=None)
    warnings = 0
    for r in case.rounds:
        now = NOW + timedelta(seconds=r.at)
        progress = doc(r.step)
        obs = observe(cluster(), [*RUNNING, store()], now=now, progress=progress, progress_time=now)
        out = plan(job(s, st), obs)
        st = out.status
        cond = next(c for c in st.conditions if c.type == ConditionType.PROGRESSING)
        assert (cond.status, cond.reason) == (r.status, r.reason), (r, cond, st.progress)
        if r.wake is not None:
            assert out.requeue_after == pytest.approx(r.wake, abs=0.5), (r, st.progress)
        warnings += sum(1 for e in out.events if e.reason == r.reason and e.type == "Warning")
    assert warnings == 1


def test_the_stall_message_names_the_threshold_and_the_step_time() -> None:
    s = spec(failurePolicy={"maxFailures": 2})
    st: ElasticTrainingJobStatus = started(4, progress=None)
    for at, step in ((0, 100), (10, 110), (200, 110)):
        now = NOW + timedelta(seconds=at)
        obs = observe(cluster(), [*RUNNING, store()], now=now, progress=doc(step), progress_time=now)
        st = plan(job(s, st), obs).status
    cond = next(c for c in st.conditions if c.type == ConditionType.PROGRESSING)
    assert "step 110: no progress for 190 s (stalled after 90 s" in cond.message, cond.message
    assert "measured step time 1.00 s" in cond.message and "progressDeadlineSeconds 600" in cond.message


REPORTED = [
    # name, counter in status, counter in the store, new crashes
    ("first read counts all", None, 2, 2),
    ("an increase", 2, 5, 3),
    ("no change", 5, 5, 0),
    ("a new store restarted the count", 5, 1, 1),
    ("a store without the counter (older image)", 5, None, 0),
]


@pytest.mark.parametrize(("name", "before", "now", "new"), REPORTED, ids=[r[0] for r in REPORTED])
def test_reported_crashes(name: str, before: int | None, now: int | None, new: int) -> None:
    assert reported_crashes(before, now) == new


THRESHOLDS = [
    # name, step seconds, policy, threshold
    ("no measured step time: the deadline", None, {}, 600),
    ("fast steps: the floor", 0.2, {}, 90),
    ("20 step times between floor and deadline", 10.0, {}, 200),
    ("slow steps: the deadline caps it", 100.0, {}, 600),
    ("a deadline below the floor wins", 0.2, {"progressDeadlineSeconds": 20}, 20),
    ("a zero deadline turns it off", 1.0, {"progressDeadlineSeconds": 0}, 0),
]


@pytest.mark.parametrize(("name", "seconds", "policy", "after"), THRESHOLDS, ids=[t[0] for t in THRESHOLDS])
def test_stall_threshold(name: str, seconds: float | None, policy: dict[str, int], after: float) -> None:
    assert stall_threshold(seconds, FailurePolicy.model_validate(policy)) == after


def test_the_step_time_is_a_moving_average_and_a_restore_is_no_sample() -> None:
    t0 = NOW
    first = next_step_seconds(None, t0, 100, 110, t0 + timedelta(seconds=10))
    assert first == 1.0
    paused = next_step_seconds(first, t0, 110, 111, t0 + timedelta(seconds=31))
    assert paused == pytest.approx(0.7 * 1.0 + 0.3 * 31)  # a pause makes the threshold more patient
    assert next_step_seconds(first, t0, 110, 90, t0 + timedelta(seconds=5)) == first  # restored: went back


def test_crash_times_drop_old_entries_and_collapse_near_ones() -> None:
    old = NOW - timedelta(seconds=CRASH_LOOP_WINDOW_S + 1)
    near = NOW - timedelta(seconds=3)
    assert record_crashes([old], 1, NOW) == [NOW]
    assert record_crashes([near], 2, NOW) == [near]
    assert record_crashes([near], 0, NOW) == [near]


def test_the_store_counts_crash_reports_and_no_report_takes_one_back() -> None:
    stored = ProgressDoc.from_json(doc(7))
    crash = ProgressDoc.from_json({"lastError": "RuntimeError: boom", "crash": True})
    once = merge(stored, crash)
    twice = merge(once, crash)
    assert (once.crashes, twice.crashes, twice.step, twice.crash) == (1, 2, 7, False)
    # rank 0's reports (no counter), a plain error report, and a trainer's own counter change nothing
    later = merge(twice, ProgressDoc.from_json(doc(9, crashes=0)))
    later = merge(later, ProgressDoc.from_json({"lastError": "ValueError: x"}))
    assert (later.crashes, later.step) == (2, 9)
    assert ProgressDoc.from_json(later.to_json()).crashes == 2
    assert merge(None, crash).crashes == 1

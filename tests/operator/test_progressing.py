"""The Progressing condition (issue 15): a crash loop or a hang inside the pods used to look healthy, since
status said Ready while the step stood still. Cases are timelines of reconciles, each a named sentence."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from etj_contract.progress import ProgressDoc, merge
from etj_operator.api.models import ConditionType, ElasticTrainingJobStatus
from etj_operator.decide.plan.planner import plan
from tests.operator.factories import NOW, cluster, job, observe, spec, started, store, worker

RUNNING = [worker(i, f"spot-{i}") for i in range(4)]
DEADLINE = 300


@dataclass(frozen=True)
class Round:
    at: float  # seconds after NOW
    progress: dict[str, Any] | None  # what the store holds (None: nothing read yet)
    status: str  # the Progressing condition's status after this round
    reason: str
    pods: tuple[Any, ...] = (*RUNNING, store())
    tracked: bool = True


@dataclass(frozen=True)
class Case:
    name: str
    rounds: list[Round]
    warning: str | None = None  # text the ProgressDeadlineExceeded Warning must contain (None: no Warning)


def doc(step: int, **kw: Any) -> dict[str, Any]:
    return {"step": step, "resizes": [], "finished": False, **kw}


CASES = [
    Case(
        "a step that keeps advancing is progressing",
        [
            Round(0, doc(1), "True", "StepAdvancing"),
            Round(200, doc(50), "True", "StepAdvancing"),
            Round(450, doc(120), "True", "StepAdvancing"),
        ],
    ),
    Case(
        "a step that stands still past the deadline is not, and the Warning names the trainer's last error",
        [
            Round(0, doc(10), "True", "StepAdvancing"),
            Round(DEADLINE, doc(10, lastError="OSError: /data/train: no such file"), "True", "StepAdvancing"),
            Round(
                DEADLINE + 1,
                doc(10, lastError="OSError: /data/train: no such file"),
                "False",
                "ProgressDeadlineExceeded",
            ),
        ],
        warning="OSError: /data/train: no such file",
    ),
    Case(
        "a crash loop before the first step is caught too (the clock starts when the job is Ready)",
        [
            Round(0, None, "True", "StepAdvancing"),
            Round(DEADLINE + 5, None, "False", "ProgressDeadlineExceeded"),
        ],
        warning="no step reported",
    ),
    Case(
        "waiting for capacity is not a stall: the clock starts when the job becomes Ready",
        [
            Round(0, None, "Unknown", "NotTraining", pods=(store(),)),
            Round(DEADLINE * 3, None, "Unknown", "NotTraining", pods=(store(),)),
            Round(DEADLINE * 3 + 1, None, "True", "StepAdvancing"),
            Round(DEADLINE * 4, doc(1), "True", "StepAdvancing"),
        ],
    ),
    Case(
        "a stalled job that advances again is progressing again",
        [
            Round(0, doc(10), "True", "StepAdvancing"),
            Round(DEADLINE + 1, doc(10), "False", "ProgressDeadlineExceeded"),
            Round(DEADLINE + 30, doc(11), "True", "StepAdvancing"),
        ],
        warning="step 10",
    ),
    Case(
        "an operator that reads no progress cannot judge it",
        [
            Round(0, None, "Unknown", "ProgressNotRead", tracked=False),
            Round(DEADLINE * 2, None, "Unknown", "ProgressNotRead", tracked=False),
        ],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_progressing(case: Case) -> None:
    s = spec(failurePolicy={"maxFailures": 2, "progressDeadlineSeconds": DEADLINE})
    # no progress yet: these cases start before the trainer first reports
    st: ElasticTrainingJobStatus = started(0 if case.rounds[0].pods == (store(),) else 4, progress=None)
    warnings: list[str] = []
    read_at: dict[str, Any] = {}
    for r in case.rounds:
        now = NOW + timedelta(seconds=r.at)
        # The reconciler's progress_time: when the document last changed.
        key = repr(r.progress)
        read_at.setdefault(key, now)
        obs = observe(
            cluster(),
            list(r.pods),
            now=now,
            progress=r.progress,
            progress_time=read_at[key] if r.progress else None,
            progress_tracked=r.tracked,
        )
        out = plan(job(s, st), obs)
        st = out.status
        cond = next(c for c in st.conditions if c.type == ConditionType.PROGRESSING)
        assert (cond.status, cond.reason) == (r.status, r.reason), (r, cond)
        warnings += [e.message for e in out.events if e.reason == "ProgressDeadlineExceeded"]
    if case.warning is None:
        assert not warnings
    else:
        assert len(warnings) == 1 and case.warning in warnings[0], warnings


def test_a_zero_deadline_disables_the_check() -> None:
    s = spec(failurePolicy={"maxFailures": 2, "progressDeadlineSeconds": 0})
    out = plan(
        job(s, started(4)), observe(cluster(), [*RUNNING, store()], progress=doc(1), progress_time=NOW)
    )
    cond = next(c for c in out.status.conditions if c.type == ConditionType.PROGRESSING)
    assert (cond.status, cond.reason) == ("Unknown", "ProgressNotRead")


def test_an_error_only_report_keeps_the_counters_and_the_error_is_sticky() -> None:
    stored = ProgressDoc.from_json(doc(7, loss=0.5))
    err = merge(stored, ProgressDoc.from_json({"lastError": "Traceback...\nValueError: bad ETJ_LR 'x'"}))
    assert (err.step, err.loss, err.last_error) == (7, 0.5, "ValueError: bad ETJ_LR 'x'")
    later = merge(err, ProgressDoc.from_json(doc(7, loss=0.4)))
    assert (later.loss, later.last_error) == (0.4, "ValueError: bad ETJ_LR 'x'")
    assert ProgressDoc.from_json({"lastError": "x" * 5000}).last_error == "x" * 1024

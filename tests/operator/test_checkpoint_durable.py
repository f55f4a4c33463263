"""A checkpoint is durable or the job says so (issue 37): the CheckpointDurable condition from the trainer's
progress report (failedWrites, checkpointError, lastCheckpoint), by named cases, and its Warning Event."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from etj_operator.api.models import ConditionType
from etj_operator.decide.plan.planner import plan
from etj_operator.decide.status.conditions import ConditionReason, JobFacts, build_conditions
from tests.operator.factories import cluster, job, observe, spec, started, store, worker
from tests.operator.test_conditions import RUNNING

R = ConditionReason
# A running job that checkpoints to S3: test_conditions' running job with a bucket.
ON_S3 = replace(RUNNING, running=2, min_workers=1, checkpoint_uri="s3://b/run", max_failed_writes=3)
ERROR = "s3://b/run/ckpt-000000020.pt: MaxRetryError: Connection refused"

CASES: dict[str, tuple[JobFacts, str, str, tuple[str, ...]]] = {
    # case -> (facts, status, reason, words the message must hold)
    "a confirmed shared write is durable, and named": (
        replace(ON_S3, last_checkpoint="step 10 at s3://b/run/ckpt-000000010.pt"),
        "True",
        R.CHECKPOINT_WRITTEN,
        ("step 10 at s3://b/run/ckpt-000000010.pt",),
    ),
    "no shared write yet is not known durable": (ON_S3, "Unknown", R.NO_CHECKPOINT_YET, ()),
    "no shared location: CheckpointVolatile says why": (
        replace(ON_S3, checkpoint_uri=None),
        "Unknown",
        R.NO_DURABLE_CHECKPOINT,
        ("CheckpointVolatile",),
    ),
    "a failed write quotes the error and what is still durable": (
        replace(ON_S3, checkpoint_error=ERROR, failed_writes=1, last_checkpoint="step 10 at s3://b/x"),
        "False",
        R.CHECKPOINT_WRITE_FAILED,
        ("1 shared checkpoint writes failed", "2 more and the workers stop", "step 10 at s3://b/x", ERROR),
    ),
    "a failure before any durable write says none is": (
        replace(ON_S3, checkpoint_error=ERROR, failed_writes=1),
        "False",
        R.CHECKPOINT_WRITE_FAILED,
        ("none durable yet", ERROR),
    ),
    "past maxFailedWrites the workers stop": (
        replace(ON_S3, checkpoint_error=ERROR, failed_writes=4),
        "False",
        R.CHECKPOINT_WRITE_FAILED,
        ("the workers stop (checkpoint.maxFailedWrites 3)",),
    ),
    "a volume's failed write is as much a failure": (
        replace(ON_S3, checkpoint_uri=None, checkpoint_pvc="ckpt", checkpoint_error="OSError: ENOSPC"),
        "False",
        R.CHECKPOINT_WRITE_FAILED,
        ("ENOSPC",),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_checkpoint_durable(case: str) -> None:
    facts, status, reason, words = CASES[case]
    conds = build_conditions([], facts, generation=1, now=datetime(2026, 1, 1, tzinfo=UTC))
    (cond,) = [c for c in conds if c.type == ConditionType.CHECKPOINT_DURABLE]
    assert (cond.status, cond.reason) == (status, reason)
    for word in words:
        assert word in cond.message, cond.message


RUNNING = [worker(i, f"spot-{i}") for i in range(2)]
DURABLE = {"step": 10, "path": "s3://b/run/ckpt-000000010.pt", "time": "2026-01-01T11:59:00Z"}
# The trainer's reports through an outage, in order -> (condition status, Warning Events posted)
OUTAGE: list[tuple[str, dict[str, Any], str, int]] = [
    ("written", {"step": 12, "lastCheckpoint": DURABLE}, "True", 0),
    ("a write fails", {"step": 21, "lastCheckpoint": DURABLE, "failedWrites": 1, "checkpointError": ERROR},
     "False", 1),
    ("another fails: no second Event", {"step": 31, "lastCheckpoint": DURABLE, "failedWrites": 2,
                                        "checkpointError": ERROR}, "False", 0),
    ("written again", {"step": 41, "lastCheckpoint": {**DURABLE, "step": 40}}, "True", 0),
]  # fmt: skip


def test_an_outage_raises_the_condition_once_and_clears_it() -> None:
    s = spec(checkpoint={"uri": "s3://b/run"})
    st = started(2)
    for case, progress, want, warnings in OUTAGE:
        out = plan(job(s, st), observe(cluster(), [*RUNNING, store()], progress=progress))
        st = out.status
        (cond,) = [c for c in st.conditions if c.type == ConditionType.CHECKPOINT_DURABLE]
        assert cond.status == want, (case, cond)
        posted = [e for e in out.events if e.reason == R.CHECKPOINT_WRITE_FAILED]
        assert len(posted) == warnings and all(e.type == "Warning" and ERROR in e.message for e in posted), (
            case
        )
        # status.lastCheckpoint is the trainer's confirmed write only, never the step the write was for
        assert st.last_checkpoint is not None
        assert st.last_checkpoint.step == progress["lastCheckpoint"]["step"], case

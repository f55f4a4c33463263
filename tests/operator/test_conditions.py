"""The condition table: each rule's verdict for the facts that decide it, cases named as sentences."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from etj_operator.api.models import ConditionType, Phase
from etj_operator.decide.status.conditions import RULES, ConditionReason, JobFacts, build_conditions
from etj_operator.observe.signals import Reason

R = ConditionReason
RUNNING = JobFacts(
    phase=Phase.RUNNING,
    running=3,
    min_workers=2,
    max_workers=4,
    rendezvous_running=True,
    has_trainer_image=True,
    suspended=False,
    resizing=False,
    drain_reason=None,
    drain_messages="",
    failures=0,
    max_failures=3,
    free_slots=None,
    partial_usage=False,
)

CASES: dict[str, tuple[JobFacts, ConditionType, bool, str]] = {
    "a running job with its store is ready": (RUNNING, ConditionType.READY, True, R.MIN_WORKERS_RUNNING),
    "a finished job is not ready, for the phase's reason": (
        replace(RUNNING, phase=Phase.SUCCEEDED),
        ConditionType.READY,
        False,
        R.JOB_SUCCEEDED,
    ),
    "no image anywhere is why a pending job is not ready": (
        replace(RUNNING, phase=Phase.PENDING, has_trainer_image=False),
        ConditionType.READY,
        False,
        R.NO_TRAINER_IMAGE,
    ),
    "a pending job waits for its store before its workers": (
        replace(RUNNING, phase=Phase.PENDING, rendezvous_running=False),
        ConditionType.READY,
        False,
        R.RENDEZVOUS_NOT_RUNNING,
    ),
    "a pending job with its store waits for workers": (
        replace(RUNNING, phase=Phase.PENDING, running=1),
        ConditionType.READY,
        False,
        R.WAITING_FOR_WORKERS,
    ),
    "a drain names the resize": (
        replace(RUNNING, resizing=True, drain_reason=Reason.SPOT_INTERRUPTION, drain_messages="node x"),
        ConditionType.RESIZING,
        True,
        Reason.SPOT_INTERRUPTION,
    ),
    "workers still exiting keep the job resizing": (
        replace(RUNNING, resizing=True),
        ConditionType.RESIZING,
        True,
        R.WORKERS_TERMINATING,
    ),
    "no drain: stable": (RUNNING, ConditionType.RESIZING, False, R.STABLE),
    "suspension is the user's": (
        replace(RUNNING, suspended=True),
        ConditionType.SUSPENDED,
        True,
        R.SUSPENDED_BY_USER,
    ),
    "a failed phase exhausted the budget": (
        replace(RUNNING, phase=Phase.FAILED),
        ConditionType.FAILED,
        True,
        R.FAILURE_BUDGET_EXHAUSTED,
    ),
    "a succeeded phase finished training": (
        replace(RUNNING, phase=Phase.SUCCEEDED),
        ConditionType.SUCCEEDED,
        True,
        R.TRAINING_FINISHED,
    ),
    "too little room for replicas.min is insufficient capacity": (
        replace(RUNNING, running=0, free_slots=1),
        ConditionType.CAPACITY_AVAILABLE,
        False,
        R.INSUFFICIENT_CAPACITY,
    ),
    "a pod create the apiserver refuses is a replica failure": (
        replace(RUNNING, create_rejection='pods "x" is forbidden: exceeded quota: gpus'),
        ConditionType.REPLICA_FAILURE,
        True,
        R.FAILED_CREATE,
    ),
    "no refusal: the pods were created": (RUNNING, ConditionType.REPLICA_FAILURE, False, R.PODS_CREATED),
    "no volume and no object store: checkpoints are volatile": (
        RUNNING,
        ConditionType.CHECKPOINT_VOLATILE,
        True,
        R.NO_DURABLE_CHECKPOINT,
    ),
    "a volume claim keeps checkpoints": (
        replace(RUNNING, checkpoint_pvc="ckpt"),
        ConditionType.CHECKPOINT_VOLATILE,
        False,
        R.CHECKPOINT_PVC,
    ),
    "an object store keeps checkpoints": (
        replace(RUNNING, checkpoint_uri="s3://b/p"),
        ConditionType.CHECKPOINT_VOLATILE,
        False,
        R.CHECKPOINT_OBJECT_STORE,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_condition_rule(case: str) -> None:
    facts, type_, status, reason = CASES[case]
    conds = {
        c.type: c for c in build_conditions([], facts, generation=1, now=datetime(2026, 1, 1, tzinfo=UTC))
    }
    assert (conds[type_].status, conds[type_].reason) == ("True" if status else "False", reason)


def test_every_condition_type_has_one_rule_and_every_fixed_reason_is_in_the_enum() -> None:
    # KueueAdmitted and OnDemandQuota are on Kueue jobs only, set by decide/kueue/condition.py
    # (tests/operator/test_kueue.py, test_kueue_deadline.py).
    kueue_only = {ConditionType.KUEUE_ADMITTED, ConditionType.ON_DEMAND_QUOTA}
    assert sorted(t for t, _ in RULES) == sorted(set(ConditionType) - kueue_only)
    for facts, *_ in CASES.values():
        for _, rule in RULES:
            reason = rule(facts)[1]
            assert reason in set(R) | set(Reason), reason

"""A job says why it is not running (issue 37, item 4): pods that never start (an image the kubelet
cannot pull, a missing Secret, no node that fits) become the PodsBlocked condition, the Ready condition's
reason and one Warning Event per cause, and after failurePolicy.podStartDeadlineSeconds the job is Failed
with that cause (decide/failures/start_blocks.py). Cases are timelines of reconciles, each a named sentence;
then
the parsing of the kubelet's and scheduler's words from pod bodies, as a table."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from etj_operator.api.models import ConditionType, ElasticTrainingJobStatus
from etj_operator.decide.plan.planner import plan
from etj_operator.observe.pods import Blocker, PodInfo, pod_info
from tests.operator.factories import LONG_AGO, NOW, cluster, job, observe, spec, started, store, worker

DEADLINE = 600
PULL = Blocker("ErrImagePull", 'failed to pull image "reg/trainer:nope": not found', "trainer")
BACKOFF = Blocker("ImagePullBackOff", 'Back-off pulling image "reg/trainer:nope"', "trainer")
NO_SECRET = Blocker("CreateContainerConfigError", 'secret "s3-creds" not found', "trainer")
INVALID = Blocker(
    "InvalidImageName", 'Failed to apply default image tag "Reg/T:x": invalid reference', "trainer"
)
NO_FIT = Blocker(
    "Unschedulable", "0/5 nodes are available: 5 node(s) didn't match Pod's node affinity/selector."
)


def pending(slot: int, blocker: Blocker | None, created: datetime = NOW, **kw: Any) -> PodInfo:
    return replace(worker(slot, None, phase="Pending"), blocker=blocker, created=created, **kw)


def store_pending(blocker: Blocker | None) -> PodInfo:
    return replace(store(None, phase="Pending"), blocker=blocker, created=NOW, ip=None)


RUNNING = worker(0, "spot-0")
STORE = store()


@dataclass(frozen=True)
class Round:
    at: float  # seconds after NOW
    pods: tuple[PodInfo, ...]
    phase: str
    ready: str  # the Ready condition's reason (the `kubectl get etj` Reason column)
    blocked: str | None = None  # PodsBlocked's reason while True (None: False)
    warnings: tuple[str, ...] = ()  # reasons of the Warning Events this round posts
    says: str = ""  # in the Ready condition's message


@dataclass(frozen=True)
class Case:
    name: str
    rounds: list[Round]
    deadline: int = DEADLINE
    start: ElasticTrainingJobStatus = field(default_factory=ElasticTrainingJobStatus)  # a new job


CASES = [
    Case(
        "a worker image that cannot be pulled is said at once, once, and fails the job after the deadline",
        [
            Round(0, (pending(0, PULL), STORE), "Pending", "ErrImagePull", "ErrImagePull", ("ErrImagePull",)),
            # The kubelet's back-off between retries is the same cause: no second Warning.
            Round(30, (pending(0, BACKOFF), STORE), "Pending", "ImagePullBackOff", "ImagePullBackOff"),
            Round(
                DEADLINE - 1, (pending(0, BACKOFF), STORE), "Pending", "ImagePullBackOff", "ImagePullBackOff"
            ),
            Round(
                DEADLINE,
                (pending(0, BACKOFF), STORE),
                "Failed",
                "ImagePullBackOff",
                warnings=("JobFailed",),
                says="not started after 600 s (failurePolicy.podStartDeadlineSeconds 600)",
            ),
            # Its pods are gone once it failed; the cause stays.
            Round(
                DEADLINE + 60,
                (),
                "Failed",
                "ImagePullBackOff",
                says='Back-off pulling image "reg/trainer:nope"',
            ),
        ],
    ),
    Case(
        "a store image that cannot be pulled fails the job naming the store's image, not the workers",
        [
            Round(
                0,
                (pending(0, NO_FIT), store_pending(BACKOFF)),
                "Pending",
                "ImagePullBackOff",
                "ImagePullBackOff",
                ("ImagePullBackOff",),
                says="store pod train-rdzv (container trainer): ImagePullBackOff: Back-off pulling image",
            ),
            Round(
                DEADLINE,
                (pending(0, NO_FIT), store_pending(BACKOFF)),
                "Failed",
                "ImagePullBackOff",
                warnings=("JobFailed",),
                says="store pod train-rdzv",
            ),
        ],
    ),
    Case(
        "a missing Secret is said, and the job starts once the Secret is there",
        [
            Round(
                0,
                (pending(0, NO_SECRET), STORE),
                "Pending",
                "CreateContainerConfigError",
                "CreateContainerConfigError",
                ("CreateContainerConfigError",),
                says='secret "s3-creds" not found',
            ),
            Round(120, (RUNNING, STORE), "Running", "MinWorkersRunning"),
        ],
    ),
    Case(
        "an image reference that does not parse fails the job at once: no retry can fix it",
        [
            Round(0, (pending(0, INVALID), STORE), "Failed", "InvalidImageName", warnings=("JobFailed",)),
        ],
    ),
    Case(
        "a pod no node can take carries the scheduler's words, and fails the job after the deadline",
        [
            Round(
                0,
                (pending(0, NO_FIT), STORE),
                "Pending",
                "Unschedulable",
                "Unschedulable",
                ("Unschedulable",),
            ),
            Round(
                DEADLINE,
                (pending(0, NO_FIT), STORE),
                "Failed",
                "Unschedulable",
                warnings=("JobFailed",),
                says="0/5 nodes are available: 5 node(s) didn't match",
            ),
        ],
    ),
    Case(
        "elastic extras waiting for capacity beside a Ready job are no news and never fail it",
        [
            Round(0, (RUNNING, pending(1, NO_FIT), STORE), "Running", "MinWorkersRunning"),
            Round(DEADLINE * 3, (RUNNING, pending(1, NO_FIT), STORE), "Running", "MinWorkersRunning"),
        ],
        start=started(1),
    ),
    Case(
        "a kubelet error on an extra is said, but fails nothing while the job trains",
        [
            Round(
                0,
                (RUNNING, pending(1, BACKOFF), STORE),
                "Running",
                "MinWorkersRunning",
                "ImagePullBackOff",
                ("ImagePullBackOff",),
            ),
            Round(
                DEADLINE * 3,
                (RUNNING, pending(1, BACKOFF), STORE),
                "Running",
                "MinWorkersRunning",
                "ImagePullBackOff",
            ),
        ],
        start=started(1),
    ),
    Case(
        "the clock starts when the job loses Ready, not when a long-pending extra was created",
        [
            Round(
                0,
                (RUNNING, pending(1, BACKOFF, LONG_AGO), STORE),
                "Running",
                "MinWorkersRunning",
                "ImagePullBackOff",
                ("ImagePullBackOff",),
            ),
            Round(
                60,
                (pending(1, BACKOFF, LONG_AGO), STORE),
                "Pending",
                "ImagePullBackOff",
                "ImagePullBackOff",
            ),
            Round(
                60 + DEADLINE - 1,
                (pending(1, BACKOFF, LONG_AGO), STORE),
                "Pending",
                "ImagePullBackOff",
                "ImagePullBackOff",
            ),
            Round(
                60 + DEADLINE,
                (pending(1, BACKOFF, LONG_AGO), STORE),
                "Failed",
                "ImagePullBackOff",
                warnings=("JobFailed",),
            ),
        ],
        start=started(1),
    ),
    # A job that has trained and lost its spot nodes waits for spot to come back: that is what an elastic
    # spot job is for. It says so, and the start-up deadline does not fail it (a job that never started
    # does fail: the first case above).
    Case(
        "a job that trained waits out a spot drought below min, told why, never failed for it",
        [
            Round(0, (RUNNING, pending(1, NO_FIT), STORE), "Running", "MinWorkersRunning"),
            Round(
                60,
                (pending(1, NO_FIT), STORE),
                "Pending",
                "Unschedulable",
                "Unschedulable",
                ("Unschedulable",),
            ),
            Round(
                60 + DEADLINE * 5, (pending(1, NO_FIT), STORE), "Pending", "Unschedulable", "Unschedulable"
            ),
        ],
        start=started(1),
    ),
    Case(
        "a deadline of 0 never fails the job, and still says why",
        [
            Round(
                0,
                (pending(0, BACKOFF), STORE),
                "Pending",
                "ImagePullBackOff",
                "ImagePullBackOff",
                ("ImagePullBackOff",),
            ),
            Round(
                DEADLINE * 10, (pending(0, BACKOFF), STORE), "Pending", "ImagePullBackOff", "ImagePullBackOff"
            ),
        ],
        deadline=0,
    ),
    Case(
        "a container that ran and then cannot pull again is the failure budget's matter, not start-up's",
        [
            Round(0, (pending(0, BACKOFF, ran=True), STORE), "Pending", "WaitingForWorkers"),
            Round(DEADLINE * 2, (pending(0, BACKOFF, ran=True), STORE), "Pending", "WaitingForWorkers"),
        ],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_start_blocks(case: Case) -> None:
    # No progress is read here: progressDeadlineSeconds 0 keeps its Warning out of these timelines.
    policy = {"podStartDeadlineSeconds": case.deadline, "progressDeadlineSeconds": 0}
    s = spec(replicas={"min": 1, "max": 2}, failurePolicy=policy)
    st = case.start
    for r in case.rounds:
        out = plan(job(s, st), observe(cluster(), list(r.pods), now=NOW + timedelta(seconds=r.at)))
        st = out.status
        conds = {c.type: c for c in st.conditions}
        ready, blocked = conds[ConditionType.READY], conds[ConditionType.PODS_BLOCKED]
        assert (st.phase, ready.reason) == (r.phase, r.ready), (r.at, ready)
        assert (blocked.reason if blocked.status == "True" else None) == r.blocked, (r.at, blocked)
        assert tuple(e.reason for e in out.events if e.type == "Warning") == r.warnings, (r.at, out.events)
        assert r.says in ready.message, (r.at, ready.message)
        if r.phase == "Failed":
            failed = conds[ConditionType.FAILED]
            assert (failed.status, failed.reason, failed.message) == ("True", r.ready, ready.message)
            assert not out.create_workers and not out.create_rendezvous
        if r.warnings == ("JobFailed",):
            # The failure's Event names the cause, not a failure budget.
            assert [e.message for e in out.events if e.type == "Warning"] == [ready.message]


def test_the_plan_wakes_when_the_deadline_passes() -> None:
    s = spec(failurePolicy={"podStartDeadlineSeconds": DEADLINE})
    out = plan(job(s), observe(cluster(), [pending(0, BACKOFF), STORE], now=NOW + timedelta(seconds=100)))
    # The Ready condition is new (since now): the whole deadline is left, plus a second.
    assert out.requeue_after is not None and out.requeue_after <= DEADLINE + 1


def _body(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "j-worker-0", "labels": {"etj.dev/job": "j"}}, "spec": {}, "status": status}


def _waiting(reason: str, message: str = "m", key: str = "containerStatuses", **cs: Any) -> dict[str, Any]:
    return {
        "phase": "Pending",
        key: [{"name": "c", "state": {"waiting": {"reason": reason, "message": message}}, **cs}],
    }


UNSCHEDULED = {
    "phase": "Pending",
    "conditions": [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/5 nodes are available",
        }
    ],
}
PARSED = [
    (
        "an image pull the registry refused",
        _waiting("ErrImagePull", "not found"),
        ("ErrImagePull", "not found", "c"),
        False,
    ),
    (
        "the kubelet's back-off between pulls",
        _waiting("ImagePullBackOff"),
        ("ImagePullBackOff", "m", "c"),
        False,
    ),
    (
        "a missing Secret",
        _waiting("CreateContainerConfigError"),
        ("CreateContainerConfigError", "m", "c"),
        False,
    ),
    (
        "an init container's missing ConfigMap",
        _waiting("CreateContainerConfigError", key="initContainerStatuses"),
        ("CreateContainerConfigError", "m", "c"),
        False,
    ),
    ("the scheduler's Unschedulable", UNSCHEDULED, ("Unschedulable", "0/5 nodes are available", None), False),
    ("a pod on its normal way up", _waiting("ContainerCreating"), None, False),
    ("a crash loop is not a start-up block", _waiting("CrashLoopBackOff", restartCount=3), None, True),
    (
        "a restarted container that cannot pull again has run",
        _waiting("ImagePullBackOff", lastState={"terminated": {"exitCode": 1}}),
        ("ImagePullBackOff", "m", "c"),
        True,
    ),
    (
        "a running pod",
        {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"running": {}}}]},
        None,
        True,
    ),
]


@pytest.mark.parametrize(("name", "status", "blocker", "ran"), PARSED, ids=[p[0] for p in PARSED])
def test_the_kubelets_and_schedulers_words_are_read(
    name: str, status: dict[str, Any], blocker: tuple[str, str, str | None] | None, ran: bool
) -> None:
    info = pod_info(_body(status))
    assert (info.blocker and (info.blocker.reason, info.blocker.message, info.blocker.container)) == blocker
    assert info.ran == ran

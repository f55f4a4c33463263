"""Many jobs, one pool: which new workers run at the job's priority and which at the elastic-extra class,
and a scheduler preemption read as a planned leave, never a failure (decide/plan/sharing.py, named tables)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from etj_operator.decide.objects import manifests
from etj_operator.decide.plan.planner import JobView, plan
from etj_operator.decide.plan.sharing import extra_slots
from etj_operator.observe.pods import PodInfo, pod_info
from etj_operator.observe.signals import Reason, pod_signal
from tests.operator.factories import NOW, cluster, observe, spec, started, store, worker

EXTRA = "etj-elastic-extra"
MINE = "team-a-high"


def _min(slot: int, node: str | None = None) -> PodInfo:
    return worker(slot, node, priority_class=MINE)


def _extra(slot: int, node: str | None = None) -> PodInfo:
    return worker(slot, node, priority_class=EXTRA)


@dataclass(frozen=True)
class Case:
    name: str
    job_min: int
    survivors: list[PodInfo]
    creates: list[int]
    extra_class: str | None
    extras: list[int]


CASES = [
    Case("first start, min 1 of 4: one min worker, three extras", 1, [], [0, 1, 2, 3], EXTRA, [1, 2, 3]),
    Case("first start, min = max: no extras", 4, [], [0, 1, 2, 3], EXTRA, []),
    Case("operator without an extra class: every worker at the job's priority", 1, [], [0, 1, 2], None, []),
    Case(
        "a lost min worker is replaced by a min worker although extras survive",
        2,
        [_min(0, "n0"), _extra(2, "n2"), _extra(3, "n3")],
        [1],
        EXTRA,
        [],
    ),
    Case(
        "at min already: the refill beyond it is an extra",
        2,
        [_min(0, "n0"), _min(1, "n1")],
        [2, 3],
        EXTRA,
        [2, 3],
    ),
    Case(
        "workers of a job without a class (default priority) still count as its min workers",
        2,
        [worker(0, "n0"), _extra(1, "n1")],
        [2, 3],
        EXTRA,
        [3],
    ),
    Case("nothing to create", 2, [_min(0, "n0")], [], EXTRA, []),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_extra_slots(case: Case) -> None:
    assert extra_slots(case.job_min, case.survivors, case.creates, case.extra_class) == case.extras


def test_plan_marks_extras_and_the_pods_get_their_classes() -> None:
    """The whole path: plan -> extra_workers -> manifests -> the pod's priorityClassName -> PodInfo."""
    view = JobView(
        "train",
        "ns",
        "uid-1",
        1,
        spec(replicas={"min": 2, "max": 4}, placement={"priorityClassName": MINE}),
        started(0),
        extra_priority_class=EXTRA,
    )
    # No worker yet: the first two are min workers, the two beyond min extras.
    p = plan(view, observe(cluster(spot=4), [store()]))
    assert (p.create_workers, p.extra_workers) == ([0, 1, 2, 3], [2, 3])
    # With min workers running, every further create is an extra.
    obs = observe(cluster(spot=4), [_min(0, "spot-0"), _min(1, "spot-1"), store()], now=NOW)
    p = plan(replace(view, status=started(2, resizeHistory=[])), obs)
    assert p.create_workers and p.extra_workers == p.create_workers
    for slot in p.create_workers:
        body = manifests.worker_pod(
            view.spec,
            job="train",
            namespace="ns",
            uid="u",
            token_secret="tok",
            slot=slot,
            priority_class=EXTRA,
        )
        assert pod_info(body).priority_class == EXTRA
    body = manifests.worker_pod(
        view.spec, job="train", namespace="ns", uid="u", token_secret="tok", slot=0, priority_class=MINE
    )
    assert body["spec"]["priorityClassName"] == MINE


def _preempted(phase: str) -> dict[str, object]:
    return {
        "metadata": {"name": "train-worker-3", "labels": {"etj.dev/job": "train", "etj.dev/role": "worker"}},
        "spec": {"nodeName": "spot-3", "priorityClassName": EXTRA},
        "status": {
            "phase": phase,
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "PreemptionByScheduler",
                    "message": "default-scheduler: preempting to accommodate a higher priority pod",
                }
            ],
        },
    }


def test_scheduler_preemption_is_its_own_reason() -> None:
    sig = pod_signal(_preempted("Running"))
    assert sig is not None and sig.reason == Reason.PREEMPTED and "higher priority" in sig.message


@pytest.mark.parametrize("phase", ["Running", "Failed"], ids=["seen-running", "seen-failed"])
def test_preempted_extra_is_a_leave_not_a_failure_even_counting_interruptions(phase: str) -> None:
    """failurePolicy.countInterruptions counts spot interruptions against maxFailures; a preemption is the
    sharing rule taking an extra back, and never counts."""
    s = spec(failurePolicy={"maxFailures": 0, "countInterruptions": True})
    view = JobView("train", "ns", "uid-1", 1, s, started(4), extra_priority_class=EXTRA)
    pods = [_min(0, "spot-0"), _extra(1, "spot-1"), _extra(2, "spot-2"), pod_info(_preempted(phase)), store()]
    p = plan(view, observe(cluster(spot=4), pods))
    assert [(d.pod, d.reason) for d in p.drains] == [("train-worker-3", Reason.PREEMPTED)]
    assert p.new_failures == 0 and (p.status.failures or 0) == 0
    assert p.status.phase != "Failed"

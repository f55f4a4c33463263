"""The planner, as named tables of cases: observation in, plan out (no Kubernetes anywhere)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import pytest

from etj_operator.api.models import CapacityType, ElasticTrainingJobStatus, Phase
from etj_operator.decide.plan.planner import FINAL_REPORT_GRACE, JobView, Observed, Plan, plan
from etj_operator.observe.signals import Reason, Signal
from tests.operator.factories import (
    NOW,
    cluster,
    job,
    node,
    observe,
    spec,
    started,
    status,
    store,
    worker,
)


@dataclass(frozen=True)
class Case:
    name: str
    job: JobView
    obs: Observed
    creates: list[int]
    drains: list[tuple[str, Reason]]
    phase: Phase
    requeue: float | None = None  # expected requeue_after (seconds), None = no timer needed
    check: Callable[[Plan], object] = field(default=lambda p: None)


def _resize(reason: str, frm: int, to: int) -> Callable[[Plan], object]:
    def check(p: Plan) -> None:
        last = p.status.resize_history[-1]
        assert (last.reason, last.from_, last.to) == (reason, frm, to)
        assert any(e.reason == reason for e in p.events), p.events

    return check


RUNNING4 = [worker(i, f"spot-{i}") for i in range(4)]


def _new_store(p: Plan, index: int, *, force: bool) -> None:
    """A replacement store is created now with this index, and the old one deleted (forced or not)."""
    assert p.create_rendezvous and p.rendezvous_index == index, (p.create_rendezvous, p.rendezvous_index)
    assert [d.force for d in p.drains if d.role == "rendezvous"] == ([force] if p.drains else [])


FINAL_REPORT: dict[str, Any] = {"step": 180, "finished": True, "accuracy": 0.98}
RECENT_RESIZE: dict[str, Any] = {
    "resizeHistory": [
        {"time": (NOW - timedelta(seconds=10)).isoformat(), "from": 4, "to": 3, "reason": "SpotInterruption"}
    ]
}
OLD_RESIZE: dict[str, Any] = {
    "resizeHistory": [
        {"time": (NOW - timedelta(minutes=10)).isoformat(), "from": 4, "to": 3, "reason": "SpotInterruption"}
    ]
}

CASES = [
    Case(
        "fresh job on free capacity asks for max workers and a store",
        job(),
        observe(cluster(), []),
        creates=[0, 1, 2, 3],
        drains=[],
        phase=Phase.PENDING,
        check=lambda p: (p.create_rendezvous and p.ensure_service) or pytest.fail("no store"),
    ),
    Case(
        "steady state at max does nothing",
        job(st=started(4)),
        observe(cluster(), [*RUNNING4, store()]),
        creates=[],
        drains=[],
        phase=Phase.RUNNING,
    ),
    Case(
        "spot loss drains the interrupted worker and records the resize",
        job(st=started(4)),
        observe(
            [*cluster(spot=2), node("spot-2", signal=Reason.SPOT_INTERRUPTION), node("spot-3")],
            [*RUNNING4, store()],
        ),
        creates=[],
        drains=[("train-worker-2", Reason.SPOT_INTERRUPTION)],
        phase=Phase.RESIZING,
        requeue=60,
        check=_resize("SpotInterruption", 4, 3),
    ),
    Case(
        "rank 0 loss is an ordinary drain, never a failure",
        job(st=started(4)),
        observe([node("spot-0", signal=Reason.SPOT_INTERRUPTION), *cluster()[1:]], [*RUNNING4, store()]),
        creates=[],
        drains=[("train-worker-0", Reason.SPOT_INTERRUPTION)],
        phase=Phase.RESIZING,
        requeue=60,
        check=lambda p: p.status.failures == 0 or pytest.fail("counted"),
    ),
    Case(
        "spot gain after the cooldown refills the missing worker",
        job(st=started(3, **OLD_RESIZE)),
        observe(cluster(), [*RUNNING4[:3], store()]),
        creates=[3],
        drains=[],
        phase=Phase.RUNNING,
    ),
    Case(
        "capacity flapping: a node younger than scaleUpDelaySeconds is not used yet",
        job(st=started(3, **OLD_RESIZE)),
        observe(
            [*cluster(spot=3), node("spot-3", ready_since=NOW - timedelta(seconds=5))],
            [*RUNNING4[:3], store()],
        ),
        creates=[],
        drains=[],
        phase=Phase.RUNNING,
        requeue=25,
    ),
    Case(
        "no free capacity at all: pending pods are created to ask the autoscaler",
        job(st=started(3, **OLD_RESIZE)),
        observe(cluster(spot=3), [*RUNNING4[:3], store()]),
        creates=[3],
        drains=[],
        phase=Phase.RUNNING,
    ),
    Case(
        "cooldown holds back the refill after a recent resize",
        job(st=started(3, **RECENT_RESIZE)),
        observe(cluster(), [*RUNNING4[:3], store()]),
        creates=[],
        drains=[],
        phase=Phase.RUNNING,
        requeue=50,
    ),
    Case(
        "below min refills up to min at once, even in the cooldown",
        job(spec(replicas={"min": 3, "max": 4}), started(1, **RECENT_RESIZE)),
        observe(cluster(), [RUNNING4[0], store()]),
        creates=[1, 2],
        drains=[],
        phase=Phase.PENDING,
        requeue=50,
    ),
    Case(
        "on-demand only job ignores spot capacity and spot interruptions elsewhere",
        job(spec(placement={"capacityTypes": ["on-demand"]}), started(1, desired=1, **OLD_RESIZE)),
        observe(
            [node("spot-0", signal=Reason.SPOT_INTERRUPTION), node("od-0", CapacityType.ON_DEMAND, 2)],
            [worker(0, "od-0"), store()],
        ),
        creates=[1, 2, 3],
        drains=[],
        phase=Phase.RUNNING,
        check=lambda p: p.status.conditions and None,
    ),
    Case(
        "interruption during a resize drains the new victim and never reuses a terminating slot",
        job(st=started(3, **RECENT_RESIZE)),
        observe(
            [*cluster(spot=1), node("spot-1", signal=Reason.NODE_DISRUPTED), *cluster(spot=0)],
            [worker(0, "spot-0"), worker(1, "spot-1"), worker(2, "spot-2", terminating=True), store()],
        ),
        creates=[],
        drains=[("train-worker-1", Reason.NODE_DISRUPTED)],
        phase=Phase.RESIZING,
        requeue=60,
    ),
    Case(
        "interruption that drops the job below min refills into free slots only",
        job(spec(replicas={"min": 2, "max": 2}), started(2, desired=2)),
        observe(
            [node("spot-0"), node("spot-1", signal=Reason.SPOT_INTERRUPTION), node("spot-2"), *cluster(0)],
            [worker(0, "spot-0"), worker(1, "spot-1"), store()],
        ),
        creates=[2],
        drains=[("train-worker-1", Reason.SPOT_INTERRUPTION)],
        phase=Phase.PENDING,
    ),
    Case(
        "job suspended: every worker and the store drained, nothing created",
        job(spec(suspend=True), started(4)),
        observe(cluster(), [*RUNNING4, store()]),
        creates=[],
        phase=Phase.SUSPENDED,
        drains=[
            *((f"train-worker-{i}", Reason.SUSPENDED) for i in range(4)),
            ("train-rdzv", Reason.SUSPENDED),
        ],
    ),
    Case(
        "job finished: a worker exited 0 after the final report, the rest and the store stop",
        job(st=started(4)),
        observe(
            cluster(),
            [worker(0, "spot-0", phase="Succeeded", finished_at=NOW), *RUNNING4[1:], store()],
            progress=FINAL_REPORT,
        ),
        creates=[],
        phase=Phase.SUCCEEDED,
        drains=[
            *((f"train-worker-{i}", Reason.FINISHED) for i in (1, 2, 3)),
            ("train-rdzv", Reason.FINISHED),
        ],
        check=lambda p: (
            (p.status.completion_time, p.status.progress and p.status.progress.accuracy) == (NOW, 0.98)
            or pytest.fail(f"{p.status.completion_time} {p.status.progress}")
        ),
    ),
    Case(
        # regression (issue 12): the store was stopped before the operator read the final report, and
        # status never got the accuracy
        "workers exited 0 but the final report is not read yet: keep the store, start nothing, look again",
        job(st=started(4)),
        observe(
            cluster(),
            [
                worker(0, "spot-0", phase="Succeeded", finished_at=NOW - timedelta(seconds=5)),
                *RUNNING4[1:],
                store(),
            ],
            progress={"step": 170, "finished": False},
        ),
        creates=[],
        drains=[],
        phase=Phase.RUNNING,
        requeue=1.0,
    ),
    Case(
        "workers exited 0 and no final report came within the grace: Succeeded, with a Warning",
        job(st=started(4)),
        observe(
            cluster(),
            [worker(0, "spot-0", phase="Succeeded", finished_at=NOW - FINAL_REPORT_GRACE), store()],
            progress={"step": 170, "finished": False},
        ),
        creates=[],
        drains=[("train-rdzv", Reason.FINISHED)],
        phase=Phase.SUCCEEDED,
        check=lambda p: (
            any(e.reason == "FinalReportMissing" and e.type == "Warning" for e in p.events)
            or pytest.fail(str(p.events))
        ),
    ),
    Case(
        "an operator that reads no progress does not wait for a final report",
        job(st=started(4)),
        observe(
            cluster(),
            [worker(0, "spot-0", phase="Succeeded", finished_at=NOW), store()],
            final_report_grace=timedelta(0),
        ),
        creates=[],
        drains=[("train-rdzv", Reason.FINISHED)],
        phase=Phase.SUCCEEDED,
        check=lambda p: all(e.type == "Normal" for e in p.events) or pytest.fail(str(p.events)),
    ),
    Case(
        # regression (issue 15): any pod that reached the store could POST finished: true, and with no
        # worker Running (all Pending for capacity here) the job became Succeeded
        "a finished report with no worker that exited 0 finishes nothing",
        job(st=started(0)),
        observe(
            cluster(spot=0),
            [worker(i, None, phase="Pending") for i in range(4)] + [store()],
            progress=FINAL_REPORT,
        ),
        creates=[],
        drains=[],
        phase=Phase.PENDING,
    ),
    Case(
        "a finished report while workers run (none exited) keeps the job running",
        job(st=started(4)),
        observe(cluster(), [*RUNNING4, store()], progress=FINAL_REPORT),
        creates=[],
        drains=[],
        phase=Phase.RUNNING,
    ),
    Case(
        "finished job stays finished and creates nothing",
        job(st=status(phase="Succeeded", completionTime=NOW.isoformat())),
        observe(cluster(), []),
        creates=[],
        drains=[],
        phase=Phase.SUCCEEDED,
    ),
    Case(
        "crashed worker within the budget is counted and restarted at once",
        job(st=started(4, failures=1, **RECENT_RESIZE)),
        observe(cluster(), [*RUNNING4[:3], worker(3, "spot-3", phase="Failed", exit_code=1), store()]),
        creates=[4],
        drains=[("train-worker-3", Reason.WORKER_FAILED)],
        phase=Phase.RESIZING,
        check=lambda p: p.status.failures == 2 or pytest.fail(str(p.status.failures)),
    ),
    Case(
        "crash beyond the budget fails the job",
        job(st=started(4, failures=2, failureTimes=[(NOW - timedelta(minutes=10)).isoformat()] * 2)),
        observe(cluster(), [*RUNNING4[:3], worker(3, "spot-3", phase="Failed", exit_code=1), store()]),
        creates=[],
        phase=Phase.FAILED,
        drains=[
            ("train-worker-3", Reason.WORKER_FAILED),
            *((f"train-worker-{i}", Reason.FAILED) for i in range(3)),
            ("train-rdzv", Reason.FAILED),
        ],
    ),
    Case(
        "a worker failing because its node died is an interruption, not a crash",
        job(st=started(4)),
        observe(
            [*cluster(spot=3), node("spot-3", signal=Reason.SPOT_INTERRUPTION)],
            [*RUNNING4[:3], worker(3, "spot-3", phase="Failed", exit_code=143), store()],
        ),
        creates=[],
        drains=[("train-worker-3", Reason.SPOT_INTERRUPTION)],
        phase=Phase.RESIZING,
        requeue=60,
        check=lambda p: p.status.failures == 0 or pytest.fail("counted"),
    ),
    Case(
        "a node NotReady for a moment is given time to recover",
        job(st=started(4)),
        observe([*cluster(spot=3), node("spot-3", signal=Reason.NODE_NOT_READY)], [*RUNNING4, store()]),
        creates=[],
        drains=[],
        phase=Phase.RUNNING,
        requeue=59,
    ),
    Case(
        "a node NotReady past the grace period is drained",
        job(st=started(4)),
        observe(
            [*cluster(spot=3), node("spot-3", signal=Reason.NODE_NOT_READY)],
            [*RUNNING4, store()],
            now=NOW + timedelta(seconds=61),
        ),
        creates=[],
        drains=[("train-worker-3", Reason.NODE_NOT_READY)],
        phase=Phase.RESIZING,
        requeue=60,
    ),
    Case(
        "deleted node drains its worker",
        job(st=started(4)),
        observe(cluster(spot=3), [*RUNNING4, store()], deleted_nodes={"spot-3": NOW}),
        creates=[],
        drains=[("train-worker-3", Reason.NODE_DELETED)],
        phase=Phase.RESIZING,
        requeue=60,
    ),
    Case(
        "a node not in the index yet is not mistaken for a deleted one",
        job(st=started(4)),
        observe(cluster(spot=3), [*RUNNING4[:3], replace(worker(3, "spot-9"), scheduled_at=NOW), store()]),
        creates=[],
        drains=[],
        phase=Phase.RUNNING,
    ),
    Case(
        "pod DisruptionTarget drains it",
        job(st=started(4)),
        observe(
            cluster(),
            [*RUNNING4[:3], replace(worker(3, "spot-3"), signal=Signal(Reason.POD_DISRUPTED, "x")), store()],
        ),
        creates=[],
        drains=[("train-worker-3", Reason.POD_DISRUPTED)],
        phase=Phase.RESIZING,
        requeue=60,
    ),
    Case(
        "user lowered max: pending workers go first, then the highest slots",
        job(spec(replicas={"min": 1, "max": 2}), started(3)),
        observe(
            cluster(), [worker(0, "spot-0"), worker(1, "spot-1"), worker(2, "spot-2"), worker(3), store()]
        ),
        creates=[],
        phase=Phase.RESIZING,
        drains=[("train-worker-3", Reason.SCALED_BY_USER), ("train-worker-2", Reason.SCALED_BY_USER)],
    ),
    Case(
        "more workers than max without a lower max (lagging index) drains the excess, not 'by user'",
        job(st=started(4)),
        observe(cluster(spot=5), [*RUNNING4, worker(4, "spot-4"), store()]),
        creates=[],
        drains=[("train-worker-4", Reason.EXCESS_WORKER)],
        phase=Phase.RESIZING,
    ),
    Case(
        "an older operator's store (no index label) on an interrupted node is replaced at once",
        job(st=started(4)),
        observe(
            [*cluster(on_demand=0), node("od-0", CapacityType.ON_DEMAND, signal=Reason.NODE_DISRUPTED)],
            [*RUNNING4, store("od-0")],
        ),
        creates=[],
        drains=[("train-rdzv", Reason.NODE_DISRUPTED)],
        phase=Phase.RUNNING,
        check=lambda p: _new_store(p, 0, force=False),
    ),
    Case(
        # issue 26: a cordon is the first step of `kubectl drain` and of node group upgrades, whose
        # evictions the store's PodDisruptionBudget refuses: the store stayed and blocked them for good.
        "a cordon moves the store, so a drain of its node can finish",
        job(st=started(4)),
        observe(
            [*cluster(on_demand=0), node("od-0", CapacityType.ON_DEMAND, signal=Reason.NODE_CORDONED)],
            [*RUNNING4, store("od-0")],
        ),
        creates=[],
        drains=[("train-rdzv", Reason.NODE_CORDONED)],
        phase=Phase.RUNNING,
        check=lambda p: _new_store(p, 0, force=False),
    ),
    Case(
        # issue 26 item 5: make before break. The old store stays (and the drain's eviction waits on its
        # PodDisruptionBudget) until the replacement is Ready; the Service still selects the old one.
        "a cordon starts the store's replacement first, outside the Service",
        job(st=started(4)),
        observe(
            [*cluster(on_demand=1), node("od-9", CapacityType.ON_DEMAND, signal=Reason.NODE_CORDONED)],
            [*RUNNING4, store("od-9", name="train-rdzv-4", store="4")],
        ),
        creates=[],
        drains=[],
        phase=Phase.RUNNING,
        requeue=300,
        check=lambda p: (
            (p.create_rendezvous, p.rendezvous_index, p.serve_rendezvous, p.events[-1].reason)
            == (True, 5, 4, "StoreMoving")
            or pytest.fail(str(p))
        ),
    ),
    Case(
        "nor does a rebalance recommendation (a hint, not a notice)",
        job(st=started(4)),
        observe(
            [
                *cluster(on_demand=0),
                node("od-0", CapacityType.ON_DEMAND, signal=Reason.REBALANCE_RECOMMENDATION),
            ],
            [*RUNNING4, store("od-0")],
        ),
        creates=[],
        drains=[],
        phase=Phase.RUNNING,
        check=lambda p: (not p.create_rendezvous) or pytest.fail("the store moved"),
    ),
    Case(
        "a lost store's pod stuck Terminating on a deleted node is removed and a fresh store created",
        job(st=started(4)),
        observe(
            cluster(),
            [*RUNNING4, store("od-9", name="train-rdzv-3", terminating=True)],
            deleted_nodes={"od-9": NOW},
        ),
        creates=[],
        drains=[("train-rdzv-3", Reason.NODE_DELETED)],
        phase=Phase.RUNNING,
        check=lambda p: _new_store(p, 4, force=True),
    ),
    Case(
        "a store pod terminating on a live node is left to finish; its replacement does not wait",
        job(st=started(4)),
        observe(cluster(), [*RUNNING4, store("od-0", name="train-rdzv-0", terminating=True)]),
        creates=[],
        drains=[],
        phase=Phase.RUNNING,
        check=lambda p: _new_store(p, 1, force=False),
    ),
    Case(
        "a running store is kept and no second one is made",
        job(st=started(4)),
        observe(cluster(), [*RUNNING4, store("od-0", name="train-rdzv-0", terminating=True), store()]),
        creates=[],
        drains=[],
        phase=Phase.RUNNING,
        check=lambda p: (not p.create_rendezvous) or pytest.fail("a second store"),
    ),
    Case(
        "ttl after finish deletes the job",
        job(
            spec(ttlSecondsAfterFinished=60),
            status(phase="Succeeded", completionTime=(NOW - timedelta(minutes=5)).isoformat()),
        ),
        observe(cluster(), []),
        creates=[],
        drains=[],
        phase=Phase.SUCCEEDED,
        check=lambda p: p.delete_job or pytest.fail("not deleted"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plan(case: Case) -> None:
    result = plan(case.job, case.obs)
    assert result.create_workers == case.creates
    assert [(d.pod, d.reason) for d in result.drains] == case.drains
    assert result.status.phase == case.phase
    if case.requeue is None:
        assert result.requeue_after is None
    else:
        assert result.requeue_after == pytest.approx(case.requeue, abs=1)
    case.check(result)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plan_is_deterministic(case: Case) -> None:
    assert plan(case.job, case.obs).status.to_patch() == plan(case.job, case.obs).status.to_patch()


def test_every_status_write_carries_the_full_conditions_list() -> None:
    result = plan(job(st=started(4)), observe(cluster(), [*RUNNING4, store()]))
    types = [c.type for c in result.status.conditions]
    assert types == [
        "Ready",
        "Resizing",
        "Suspended",
        "Succeeded",
        "Failed",
        "CapacityAvailable",
        "ReplicaFailure",
        "Progressing",
        "CheckpointVolatile",
        "CrashLooping",
        "PodsBlocked",
        "CheckpointDurable",
    ]
    assert result.status.to_patch()["conditions"][0]["status"] == "True"


def test_applying_the_plan_converges_to_a_no_op() -> None:
    """Level-based: feed the plan's own status and pods back in; the second plan changes nothing."""
    first = plan(job(), observe(cluster(), []))
    pods = [worker(s, f"spot-{s}") for s in first.create_workers] + [store()]
    second = plan(job(st=first.status), observe(cluster(), pods, now=NOW + timedelta(seconds=5)))
    assert second.status.phase == Phase.RUNNING
    third = plan(job(st=second.status), observe(cluster(), pods, now=NOW + timedelta(seconds=9)))
    assert (third.create_workers, third.drains, third.events) == ([], [], [])
    assert third.status.to_patch() == second.status.to_patch()


def test_restart_with_lagging_status_never_duplicates_workers() -> None:
    """A fresh operator whose status is empty still sees every existing pod and creates only the gaps."""
    pods = [worker(0, "spot-0"), worker(2, "spot-2"), store()]
    result = plan(job(st=ElasticTrainingJobStatus()), observe(cluster(), pods))
    assert result.create_workers == [1, 3]


def test_a_refused_pod_create_is_one_warning_per_distinct_refusal_and_status_goes_on() -> None:
    refused = 'pods "train-worker-3" is forbidden: exceeded quota: gpus'
    first = plan(
        job(st=started(3, **OLD_RESIZE)),
        observe(cluster(), [*RUNNING4[:3], store()], create_rejection=refused),
    )
    cond = next(c for c in first.status.conditions if c.type == "ReplicaFailure")
    assert (cond.status, cond.reason, cond.message) == ("True", "FailedCreate", refused)
    assert [e.reason for e in first.events if e.type == "Warning"] == ["FailedCreate"]
    assert first.status.workers == "3/4" and first.create_workers == [3]  # it keeps trying
    again = plan(job(st=first.status), observe(cluster(), [*RUNNING4[:3], store()], create_rejection=refused))
    assert not [e for e in again.events if e.reason == "FailedCreate"]
    cleared = plan(job(st=again.status), observe(cluster(), [*RUNNING4, store()]))
    cond = next(c for c in cleared.status.conditions if c.type == "ReplicaFailure")
    assert (cond.status, cond.reason) == ("False", "PodsCreated")


def test_a_failed_workers_last_log_line_names_the_cause_in_its_warning() -> None:
    from etj_operator.observe.pods import pod_info

    body = {
        "metadata": {"name": "train-worker-3", "labels": {"etj.dev/job": "train", "etj.dev/role": "worker"}},
        "spec": {"nodeName": "spot-3"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "state": {
                        "terminated": {
                            "exitCode": 1,
                            "message": "Traceback (most recent call last):\n  ...\n"
                            "FileNotFoundError: /data/imagenet/train\n",
                        }
                    }
                }
            ],
        },
    }
    failed = pod_info(body)
    out = plan(job(st=started(4)), observe(cluster(), [*RUNNING4[:3], failed, store()]))
    warning = next(e for e in out.events if e.type == "Warning" and e.reason == "WorkerFailed")
    assert "FileNotFoundError: /data/imagenet/train" in warning.message, warning


def test_an_oom_killed_worker_is_named_so_in_its_warning() -> None:
    # A real kubelet's OOM kill: exit code 137, reason OOMKilled, no message (the process bed never OOMs).
    from etj_operator.observe.pods import pod_info

    body = {
        "metadata": {"name": "train-worker-3", "labels": {"etj.dev/job": "train", "etj.dev/role": "worker"}},
        "spec": {"nodeName": "spot-3"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
        },
    }
    out = plan(job(st=started(4)), observe(cluster(), [*RUNNING4[:3], pod_info(body), store()]))
    warning = next(e for e in out.events if e.type == "Warning" and e.reason == "WorkerFailed")
    assert "worker train-worker-3 failed (OOMKilled, exit code 137)" in warning.message, warning
    assert out.status.failures == 1


LOST_WITH_ITS_NODE = [
    # (name, terminated state): what a kubelet reports, back up, for a container that died with its machine
    ("containerd after a killed node came back", {"exitCode": 255, "reason": "Unknown"}),
    (
        "the kubelet for a container it can no longer find",
        {"exitCode": 137, "reason": "ContainerStatusUnknown"},
    ),
]


@pytest.mark.parametrize(
    "terminated", [c[1] for c in LOST_WITH_ITS_NODE], ids=[c[0] for c in LOST_WITH_ITS_NODE]
)
def test_a_worker_lost_with_its_node_is_an_interruption_not_a_failure(terminated: dict[str, Any]) -> None:
    # Seen on kind: `docker kill` of a worker node, then `docker start`; the node is Ready again when the
    # pod shows Failed, so no node signal explains it. The trainer did not fail: its machine did.
    from etj_operator.observe.pods import pod_info

    body = {
        "metadata": {"name": "train-worker-3", "labels": {"etj.dev/job": "train", "etj.dev/role": "worker"}},
        "spec": {"nodeName": "spot-3"},
        "status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": terminated}}]},
    }
    out = plan(job(st=started(4)), observe(cluster(), [*RUNNING4[:3], pod_info(body), store()]))
    assert not out.status.failures, out.status
    assert not [e for e in out.events if e.type == "Warning" and e.reason == "WorkerFailed"]
    assert [d.reason for d in out.drains] == ["NodeLost"], out.drains


STARTUP_CASES = [
    # (name, job, observed, creates, startup_workers): what new agents wait for before the first rendezvous
    ("fresh job with room for all: the first world waits for all four", job(), observe(cluster(), []), 4, 4),
    (
        "fresh job with room for two: the two pods left for the autoscaler do not hold the world back",
        job(),
        observe(cluster(spot=2), []),
        4,
        2,
    ),
    (
        "a replacement counts the survivors (their count is long reached: it joins at once)",
        job(st=started(4)),
        observe(cluster(), [*RUNNING4[:3], store()]),
        1,
        4,
    ),
    (
        "nothing to create: nothing to wait for",
        job(st=started(4)),
        observe(cluster(), [*RUNNING4, store()]),
        0,
        0,
    ),
]


@pytest.mark.parametrize(
    ("name", "j", "obs", "creates", "startup"), STARTUP_CASES, ids=[c[0] for c in STARTUP_CASES]
)
def test_startup_workers(name: str, j: JobView, obs: Observed, creates: int, startup: int) -> None:
    result = plan(j, obs)
    assert (len(result.create_workers), result.startup_workers) == (creates, startup)

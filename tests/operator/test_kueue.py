"""Kueue admission of etj jobs (docs/kueue.md; decide/kueue, decide/plan/kueue_steps.py): named tables of
cases, each run through the pure functions or the whole planner. No Kubernetes API.

A job in a Kueue queue has a base Workload (replicas.min workers) and one Workload per extra worker. It runs
no worker before its base is admitted, a worker per admitted seat on its flavor's nodes, drains the worker
of an evicted extra seat in place (KueuePreempted, no failure), and stops like a suspend when its base is
evicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from etj_operator.api.models import ConditionType
from etj_operator.constants import LABEL_KUEUE_SEAT
from etj_operator.decide.kueue.admission import (
    KueueJob,
    Seats,
    gate,
    open_seats,
    unseated,
    workload_changes,
)
from etj_operator.decide.objects.manifests import worker_pod
from etj_operator.decide.objects.placement import SeatPlacement
from etj_operator.decide.objects.workloads import workload
from etj_operator.decide.plan.planner import JobView, plan
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason
from etj_operator.observe.workloads import FlavorInfo, WorkloadInfo, flavor_info, workload_info
from tests.operator.factories import cluster, job, observe, spec, started, status, store, worker

BASE, X0, X1, X2, X3 = (f"train-kueue-{s}" for s in ("base", "x0", "x1", "x2", "x3"))
SPOT = FlavorInfo("spot", {"karpenter.sh/capacity-type": "spot"}, ({"key": "t", "operator": "Exists"},))
FLAVORS = {"spot": SPOT}
QUEUE = KueueJob("lq", 0)


def wl(
    name: str, *, count: int = 1, admitted: bool = True, evicted: str | None = None, **kw: Any
) -> WorkloadInfo:
    flavors = ("spot",) if admitted else ()
    return WorkloadInfo(
        name, job="train", count=count, admitted=admitted, evicted=evicted, flavors=flavors, **kw
    )


def seated(slot: int, seat: str, node: str | None = None, **kw: Any) -> PodInfo:
    return worker(slot, node or f"spot-{slot}", seat=seat, **kw)


def seats(*workloads: WorkloadInfo) -> Seats:
    return Seats.of("train", workloads)


# ---- parsing Kueue's objects ---------------------------------------------------------------------------


def test_a_workload_body_is_parsed_as_the_planner_reads_it() -> None:
    body = {
        "metadata": {"name": X0, "labels": {"etj.dev/job": "train"}, "uid": "w"},
        "spec": {"podSets": [{"name": "main", "count": 1}]},
        "status": {
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [{"name": "main", "flavors": {"gpu": "spot"}}],
            },
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
                {
                    "type": "Evicted",
                    "status": "True",
                    "reason": "Preempted",
                    "message": "Preempted to make room",
                },
            ],
        },
    }
    info = workload_info(body)
    assert (info.job, info.admitted, info.flavors, info.cluster_queue) == ("train", True, ("spot",), "cq")
    assert info.evicted == "Preempted: Preempted to make room"
    pending = workload_info(
        {
            "metadata": {"name": BASE, "labels": {"etj.dev/job": "train"}},
            "spec": {"podSets": [{"name": "main", "count": 2}]},
            "status": {
                "conditions": [
                    {
                        "type": "QuotaReserved",
                        "status": "False",
                        "reason": "Pending",
                        "message": "insufficient quota",
                    }
                ]
            },
        }
    )
    assert (pending.count, pending.admitted, pending.evicted, pending.pending) == (
        2,
        False,
        None,
        "insufficient quota",
    )
    flavor = flavor_info(
        {"metadata": {"name": "spot"}, "spec": {"nodeLabels": {"a": "b"}, "tolerations": [{"key": "t"}]}}
    )
    assert flavor == FlavorInfo("spot", {"a": "b"}, ({"key": "t"},))


# ---- the pure decisions (decide/kueue/admission.py) ------------------------------------------------------


@dataclass(frozen=True)
class GateCase:
    workloads: tuple[WorkloadInfo, ...]
    reason: Reason | None


GATE = {
    "no Workload yet: queued": GateCase((), Reason.KUEUE_QUEUED),
    "base pending: queued": GateCase((wl(BASE, admitted=False),), Reason.KUEUE_QUEUED),
    "base admitted: runs": GateCase((wl(BASE),), None),
    "base evicted: stops": GateCase((wl(BASE, evicted="Preempted: x"),), Reason.KUEUE_EVICTED),
    "base being deleted: queued": GateCase((wl(BASE, deleting=True),), Reason.KUEUE_QUEUED),
    "an admitted extra alone does not run the job": GateCase(
        (wl(BASE, admitted=False), wl(X0)), Reason.KUEUE_QUEUED
    ),
}


@pytest.mark.parametrize("case", GATE)
def test_gate(case: str) -> None:
    c = GATE[case]
    got = gate(seats(*c.workloads))
    assert (got[0] if got else None) == c.reason


@dataclass(frozen=True)
class SeatCase:
    workloads: tuple[WorkloadInfo, ...]
    pods: tuple[PodInfo, ...]
    open: list[str]  # seats to create a worker for, in order
    unseated: list[str] = field(default_factory=list)  # pods drained


SEATS = {
    "base of 2 admitted, no pod: two workers on it": SeatCase((wl(BASE, count=2),), (), [BASE, BASE]),
    "base full, two extras admitted, one pending": SeatCase(
        (wl(BASE, count=2), wl(X0), wl(X1), wl(X2, admitted=False)),
        (seated(0, BASE), seated(1, BASE), seated(2, X0)),
        [X1],
    ),
    "base not admitted: no worker, even on admitted extras": SeatCase(
        (wl(BASE, admitted=False), wl(X0)), (), []
    ),
    "an evicted extra's worker leaves; no new worker on it": SeatCase(
        (wl(BASE), wl(X0, evicted="Preempted: to make room")),
        (seated(0, BASE), seated(1, X0)),
        [],
        ["train-worker-1"],
    ),
    "a worker without a seat, or on an unknown one, leaves": SeatCase(
        (wl(BASE),),
        (seated(0, BASE), worker(1, "spot-1"), seated(2, X1)),
        [],
        ["train-worker-1", "train-worker-2"],
    ),
}


@pytest.mark.parametrize("case", SEATS)
def test_seats(case: str) -> None:
    c = SEATS[case]
    s = seats(*c.workloads)
    assert [p.seat for p in open_seats(s, c.pods, FLAVORS)] == c.open
    assert [p.name for p, _ in unseated(s, c.pods)] == c.unseated


def test_a_seat_runs_on_its_flavors_node_labels_and_tolerations() -> None:
    (placed,) = open_seats(seats(wl(BASE)), (), FLAVORS)
    assert placed == SeatPlacement(BASE, SPOT.node_labels, SPOT.tolerations)


@dataclass(frozen=True)
class ChangeCase:
    workloads: tuple[WorkloadInfo, ...]
    pods: tuple[PodInfo, ...]
    create: list[tuple[str, int, int]]  # name, count, priority
    delete: list[str]
    replicas: tuple[int, int] = (2, 4)
    released: bool = False
    kueue: KueueJob = QUEUE


CHANGES = {
    "a new job queues its base of min pods at its class's value": ChangeCase(
        (), (), [(BASE, 2, 100)], [], kueue=KueueJob("lq", 100, "high")
    ),
    "a named WorkloadPriorityClass not found: nothing queued": ChangeCase(
        (), (), [], [], kueue=KueueJob("lq", None, "x")
    ),
    "no extra while the base waits (no gang deadlock)": ChangeCase(
        (wl(BASE, count=2, admitted=False),), (), [], []
    ),
    "base admitted: an extra seat per worker beyond min, one priority lower": ChangeCase(
        (wl(BASE, count=2),), (), [(X0, 1, -1), (X1, 1, -1)], []
    ),
    "an evicted extra stays while its worker holds the GPU": ChangeCase(
        (wl(BASE, count=2), wl(X0, evicted="Preempted"), wl(X1)),
        (seated(0, BASE), seated(1, BASE), seated(2, X0, terminating=True), seated(3, X1)),
        [],
        [],
    ),
    "the worker gone, the evicted extra goes and its seat queues again under a new name": ChangeCase(
        (wl(BASE, count=2), wl(X0, evicted="Preempted"), wl(X1)),
        (seated(0, BASE), seated(1, BASE), seated(3, X1)),
        [(X2, 1, -1)],
        [X0],
    ),
    "a finished worker holds nothing": ChangeCase(
        (wl(BASE, count=2), wl(X0, evicted="Preempted"), wl(X1)),
        (seated(0, BASE), seated(1, BASE), seated(2, X0, phase="Failed"), seated(3, X1)),
        [(X2, 1, -1)],
        [X0],
    ),
    "max lowered: the pending extra goes first": ChangeCase(
        (wl(BASE, count=2), wl(X0), wl(X1, admitted=False)),
        (seated(0, BASE), seated(1, BASE), seated(2, X0)),
        [],
        [X1],
        (2, 3),
    ),
    "released (evicted base, finished, suspended): every Workload goes once no worker is left": ChangeCase(
        (wl(BASE, count=2, evicted="Preempted"), wl(X0)), (), [], [BASE, X0], released=True
    ),
    "released, workers still leaving: nothing yet": ChangeCase(
        (wl(BASE, count=2, evicted="Preempted"), wl(X0)),
        (seated(0, BASE, terminating=True),),
        [],
        [],
        released=True,
    ),
    "no base and a worker left of an earlier admission: wait for it": ChangeCase(
        (), (seated(0, BASE, terminating=True),), [], []
    ),
}


@pytest.mark.parametrize("case", CHANGES)
def test_workload_changes(case: str) -> None:
    c = CHANGES[case]
    got = workload_changes(
        "train", c.kueue, seats(*c.workloads), c.pods, replicas=c.replicas, released=c.released
    )
    assert [(w.name, w.count, w.priority) for w in got.create] == c.create
    assert sorted(got.delete) == sorted(c.delete)


# ---- what the operator creates -----------------------------------------------------------------------


def test_a_workloads_pod_set_requests_what_the_worker_pod_requests() -> None:
    s = spec(trainer={"image": "t:1", "resources": {"gpu": 1, "cpu": "4", "memory": "16Gi"}})
    body = workload(s, job="train", namespace="ns", uid="u", name=BASE, count=2, priority=5, queue="lq")
    pod = worker_pod(s, job="train", namespace="ns", uid="u", slot=0, token_secret="tok")
    (pod_set,) = body["spec"]["podSets"]
    assert (
        pod_set["count"] == 2
        and pod_set["template"]["spec"]["containers"][0]["resources"]
        == pod["spec"]["containers"][0]["resources"]
    )
    assert body["spec"]["queueName"] == "lq" and body["spec"]["priority"] == 5
    assert body["metadata"]["labels"]["etj.dev/job"] == "train"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u"


def test_a_seated_worker_pod_carries_its_seat_and_its_flavors_placement() -> None:
    seat = SeatPlacement(X0, {"karpenter.sh/capacity-type": "spot"}, ({"key": "t", "operator": "Exists"},))
    s = spec(placement={"nodeSelector": {"pool": "gpu"}})
    pod = worker_pod(s, job="train", namespace="ns", uid="u", slot=3, token_secret="tok", seat=seat)
    assert pod["metadata"]["labels"][LABEL_KUEUE_SEAT] == X0
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu", "karpenter.sh/capacity-type": "spot"}
    assert {"key": "t", "operator": "Exists"} in pod["spec"]["tolerations"]
    plain = worker_pod(s, job="train", namespace="ns", uid="u", slot=3, token_secret="tok")
    assert LABEL_KUEUE_SEAT not in plain["metadata"]["labels"] and plain["spec"]["nodeSelector"] == {
        "pool": "gpu"
    }


# ---- the planner -----------------------------------------------------------------------------------------


def kueue_job(st: Any = None, *, kueue: KueueJob = QUEUE, **overrides: Any) -> JobView:
    body = {"replicas": {"min": 2, "max": 4}, "failurePolicy": {"maxFailures": 0, "countInterruptions": True}}
    return replace(job(spec(**{**body, **overrides}), st), kueue=kueue)


def kueue_plan(j: JobView, pods: list[PodInfo], *workloads: WorkloadInfo) -> Any:
    return plan(j, observe(cluster(spot=4), pods, workloads=workloads, flavors=FLAVORS))


def condition(result: Any) -> tuple[str, str]:
    cond = next(c for c in result.status.conditions if c.type == ConditionType.KUEUE_ADMITTED)
    return str(cond.status), cond.reason


def test_a_queued_job_creates_no_pod_and_queues_its_base() -> None:
    result = kueue_plan(kueue_job(), [])
    assert result.create_workers == [] and not result.create_rendezvous
    assert [(w.name, w.count) for w in result.create_workloads] == [(BASE, 2)]
    assert condition(result) == ("False", "Pending")
    pending = kueue_plan(kueue_job(), [], wl(BASE, count=2, admitted=False, pending="insufficient quota"))
    assert pending.create_workers == [] and pending.create_workloads == [] and not pending.create_rendezvous
    assert condition(pending) == ("False", "Pending")
    assert "insufficient quota" in next(
        c.message for c in pending.status.conditions if c.type == "KueueAdmitted"
    )


def test_the_admitted_base_runs_min_workers_on_its_flavor_and_queues_the_extras() -> None:
    result = kueue_plan(kueue_job(), [store()], wl(BASE, count=2))
    assert result.create_workers == [0, 1]
    assert {s.seat for s in result.worker_seats.values()} == {BASE}
    assert result.worker_seats[0].node_selector == SPOT.node_labels
    assert [(w.name, w.priority) for w in result.create_workloads] == [(X0, -1), (X1, -1)]
    assert condition(result) == ("True", "Admitted")
    assert [e.reason for e in result.events if e.reason == "KueueAdmitted"] == ["KueueAdmitted"]


def test_the_quota_decides_how_many_workers_run_between_min_and_max() -> None:
    pods = [store(), seated(0, BASE), seated(1, BASE)]
    result = kueue_plan(kueue_job(started(2)), pods, wl(BASE, count=2), wl(X0), wl(X1, admitted=False))
    assert result.create_workers == [2] and result.worker_seats[2].seat == X0
    assert result.create_workloads == []


def test_a_preempted_extra_is_drained_in_place_and_counted_as_no_failure() -> None:
    pods = [store(), seated(0, BASE), seated(1, BASE), seated(2, X0), seated(3, X1)]
    workloads = (wl(BASE, count=2), wl(X0), wl(X1, evicted="Preempted: to make room for ns/job"))
    result = kueue_plan(kueue_job(started(4)), pods, *workloads)
    assert [(d.pod, d.reason) for d in result.drains] == [("train-worker-3", Reason.KUEUE_PREEMPTED)]
    assert result.new_failures == 0 and (result.status.failures or 0) == 0
    assert result.status.phase == "Resizing"
    assert result.status.resize_history[-1].reason == "KueuePreempted"
    assert result.create_workers == [] and result.delete_workloads == []  # its worker still holds the GPU
    gone = kueue_plan(kueue_job(started(3)), pods[:4], *workloads)
    assert gone.delete_workloads == [X1] and [w.name for w in gone.create_workloads] == [X2]


def test_an_evicted_base_stops_the_job_like_a_suspend_and_queues_it_again() -> None:
    pods = [store(), seated(0, BASE), seated(1, BASE), seated(2, X0)]
    evicted = wl(BASE, count=2, evicted="Preempted: to make room for ns/big")
    result = kueue_plan(kueue_job(started(3)), pods, evicted, wl(X0))
    workers = {d.pod: d.reason for d in result.drains if d.role == "worker"}
    assert workers == dict.fromkeys(
        ["train-worker-0", "train-worker-1", "train-worker-2"], Reason.KUEUE_EVICTED
    )
    assert [d.pod for d in result.drains if d.role == "rendezvous"] == ["train-rdzv"]  # the store too
    assert result.new_failures == 0 and result.create_workers == [] and result.delete_workloads == []
    assert condition(result) == ("False", "Evicted")
    # One Warning with Kueue's words (besides the resize's own Event, workers 3 -> 0).
    warned = [e.message for e in result.events if e.type == "Warning"]
    assert len(warned) == 1 and "to make room for ns/big" in warned[0]
    # Said once: the next round (status says Evicted already) posts no second one.
    again = kueue_plan(kueue_job(result.status), [], evicted, wl(X0))
    assert not [e for e in again.events if e.type == "Warning"]
    assert sorted(again.delete_workloads) == [BASE, X0]  # nobody left: released, then queued anew
    requeued = kueue_plan(kueue_job(again.status), [])
    assert [w.name for w in requeued.create_workloads] == [BASE] and requeued.create_workers == []


def test_a_finished_job_releases_its_workloads() -> None:
    done = status(phase="Succeeded", completionTime="2026-01-01T12:00:00Z", startTime="2026-01-01T11:00:00Z")
    result = kueue_plan(kueue_job(done), [], wl(BASE, count=2), wl(X0))
    assert sorted(result.delete_workloads) == [BASE, X0] and result.create_workloads == []
    assert condition(result) == ("False", "Released")


def test_a_missing_priority_class_queues_nothing_and_says_so() -> None:
    result = kueue_plan(kueue_job(kueue=KueueJob("lq", None, "nope")), [])
    assert result.create_workloads == [] and condition(result) == ("False", "PriorityClassNotFound")


def test_a_job_outside_kueue_is_planned_as_before() -> None:
    result = plan(job(spec(replicas={"min": 2, "max": 4})), observe(cluster(spot=4), [store()]))
    assert (
        result.create_workers == [0, 1, 2, 3] and result.create_workloads == [] and result.worker_seats == {}
    )
    assert all(c.type != ConditionType.KUEUE_ADMITTED for c in result.status.conditions)


# ---- the operator's Kueue index (k8s/kueue_watch.py): what a job's labels and the watched objects say ---


def test_the_index_reads_a_jobs_queue_and_priority_from_its_labels() -> None:
    from etj_operator.k8s.kueue_watch import KueueIndex

    index = KueueIndex()
    index.priorities["high"] = 100
    assert index.job({}) is None  # no queue label: not a Kueue job
    assert index.job({"kueue.x-k8s.io/queue-name": "lq"}) == KueueJob("lq", 0, None)
    labels = {"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": "high"}
    assert index.job(labels) == KueueJob("lq", 100, "high")
    assert index.job({**labels, "kueue.x-k8s.io/priority-class": "gone"}) == KueueJob("lq", None, "gone")
    body = {
        "metadata": {"name": BASE, "labels": {"etj.dev/job": "train"}},
        "spec": {"podSets": [{"count": 2}]},
    }
    assert index.put_workload("ns", body) == ("ns", "train")
    assert [w.name for w in index.workloads("ns", "train")] == [BASE]
    assert index.drop_workload("ns", body) == ("ns", "train") and index.workloads("ns", "train") == []


def test_a_job_taken_out_of_its_queue_gives_its_workloads_back() -> None:
    pods = [store(), seated(0, BASE), seated(1, BASE)]
    result = plan(
        job(spec(replicas={"min": 2, "max": 2}), started(2)), observe(cluster(), pods, workloads=(wl(BASE),))
    )
    assert result.delete_workloads == [BASE] and result.drains == []  # its workers run on, as any job's


def test_a_suspended_job_releases_its_workloads_once_its_workers_are_gone() -> None:
    pods = [store(), seated(0, BASE), seated(1, BASE)]
    suspended = kueue_job(started(2), suspend=True)
    leaving = kueue_plan(suspended, pods, wl(BASE, count=2))
    assert {d.reason for d in leaving.drains} == {Reason.SUSPENDED} and leaving.delete_workloads == []
    gone = kueue_plan(replace(suspended, status=leaving.status), [], wl(BASE, count=2))
    assert gone.delete_workloads == [BASE] and gone.create_workloads == []
    assert condition(gone) == ("False", "Released")

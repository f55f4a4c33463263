"""The deadline policy under Kueue (docs/kueue.md, "The deadline policy asks Kueue"; issue 39 item 4): a named
table of cases, each run through the whole planner. No Kubernetes API.

A Kueue job whose deadline policy buys on-demand workers holds that many extra seats pinned to on-demand
flavors (``etj.dev/capacity: on-demand`` and the flavor's capacity label in the podSet's nodeSelector), its
other new extra seats pinned to spot; an on-demand seat Kueue cannot admit (QuotaReserved=False) sets
OnDemandQuota=False, reason QuotaExhausted, naming the LocalQueue and the ClusterQueue. The job is the
deadline planner's (tests/operator/test_planner_deadline.py): 250 samples/s per worker, an hour in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from etj_operator.api.models import CapacityType, ConditionType
from etj_operator.decide.kueue.admission import capacity_pin
from etj_operator.decide.objects.workloads import workload
from etj_operator.decide.plan.planner import JobView, plan
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason
from etj_operator.observe.workloads import FlavorInfo, WorkloadInfo
from tests.operator.factories import cluster, job, node, observe, spec, started, store
from tests.operator.test_kueue import BASE, QUEUE, SPOT, X0, X1, X2, X3, seated, wl
from tests.operator.test_planner_deadline import ONE_HOUR_IN_THIRD_DONE, progress

OD_FLAVOR = FlavorInfo("on-demand", {"karpenter.sh/capacity-type": "on-demand", "pool": "gpu"})
FLAVORS = {"spot": SPOT, "on-demand": OD_FLAVOR}
OD, SP = "on-demand", "spot"
QUOTA = "insufficient unused quota for nvidia.com/gpu in flavor on-demand, 1 more needed"


def od_seat(name: str, *, admitted: bool = True, **kw: Any) -> WorkloadInfo:
    seat = wl(name, admitted=admitted, capacity=OD, **kw)
    return replace(seat, flavors=("on-demand",)) if admitted else seat


def base() -> WorkloadInfo:
    return wl(BASE, count=2, cluster_queue="cq")


def on_od(slot: int, seat: str) -> PodInfo:
    return seated(slot, seat, f"od-gpu-{slot}")


ON_BASE = [store(), seated(0, BASE), seated(1, BASE)]


@dataclass(frozen=True)
class Case:
    workloads: tuple[WorkloadInfo, ...]
    pods: list[PodInfo]
    create: list[tuple[str, str | None]]  # Workloads created: name, etj.dev/capacity
    delete: list[str] = field(default_factory=list)
    drains: list[tuple[str, Reason]] = field(default_factory=list)
    quota: tuple[str, str] | None = None  # OnDemandQuota (status, reason); None: not set
    workers: list[tuple[int, str]] = field(default_factory=list)  # new workers: slot, seat
    max_workers: int = 4
    done: int | None = ONE_HOUR_IN_THIRD_DONE  # samples trained (None: no report yet)
    within: int = 6600
    deadline: bool = True
    od_nodes: int = 0
    spot_nodes: int = 2


CASES = {
    # 2 spot workers (500/s) for 2,600,000 samples in ~2,760 s usable: 2 on-demand more.
    "behind, spot full: two on-demand seats queued, pinned to the on-demand flavor": Case(
        (base(),), ON_BASE, [(X0, OD), (X1, OD)], quota=("True", "QuotaAvailable")
    ),
    "the on-demand seats wait for quota: QuotaExhausted, not pods that wait forever": Case(
        (base(), od_seat(X0, admitted=False, pending=QUOTA), od_seat(X1, admitted=False, pending=QUOTA)),
        ON_BASE,
        [],
        quota=("False", "QuotaExhausted"),
    ),
    "a seat Kueue has not looked at yet is no exhaustion": Case(
        (base(), od_seat(X0, admitted=False), od_seat(X1, admitted=False)),
        ON_BASE,
        [],
        quota=("True", "QuotaAvailable"),
    ),
    "one admitted, one short of quota: a worker on the first, the second reported": Case(
        (base(), od_seat(X0), od_seat(X1, admitted=False, pending=QUOTA)),
        ON_BASE,
        [],
        quota=("False", "QuotaExhausted"),
        workers=[(2, X0)],
    ),
    "both admitted: workers on them, the quota condition clears": Case(
        (base(), od_seat(X0), od_seat(X1)),
        ON_BASE,
        [],
        quota=("True", "QuotaAvailable"),
        workers=[(2, X0), (3, X1)],
    ),
    # max 3: one extra seat; the pending spot seat (no spot quota) makes room for the on-demand one.
    "a pending spot seat gives way to an on-demand seat": Case(
        (base(), wl(X0, admitted=False, capacity=SP)),
        ON_BASE,
        [(X1, OD)],
        [X0],
        quota=("True", "QuotaAvailable"),
        max_workers=3,
    ),
    "a spot seat with a worker never gives way": Case(
        (base(), wl(X0, capacity=SP)),
        [*ON_BASE, seated(2, X0)],
        [],
        quota=("True", "QuotaAvailable"),
        max_workers=3,
        spot_nodes=3,
    ),
    # 2,000,000 done an hour into a 3-hour deadline with spot nodes free: ahead, on-demand leaves first.
    "ahead: the on-demand workers leave first, in place; their seats stay while they hold the GPU": Case(
        (base(), od_seat(X0), od_seat(X1)),
        [*ON_BASE, on_od(2, X0), on_od(3, X1)],
        [],
        drains=[("train-worker-2", Reason.ON_DEMAND_RELEASED), ("train-worker-3", Reason.ON_DEMAND_RELEASED)],
        quota=("True", "QuotaAvailable"),
        done=2_000_000,
        within=10_800,
        od_nodes=4,
    ),
    "ahead, the workers gone: the on-demand seats go back to Kueue and spot seats queue": Case(
        (base(), od_seat(X0), od_seat(X1)),
        ON_BASE,
        [(X2, SP), (X3, SP)],
        [X0, X1],
        quota=("True", "QuotaAvailable"),
        done=2_000_000,
        within=10_800,
    ),
    "no report yet: the on-demand seats the job has stay, the rest queue on spot": Case(
        (base(), od_seat(X0)),
        [*ON_BASE, on_od(2, X0)],
        [(X1, SP)],
        quota=("True", "QuotaAvailable"),
        done=None,
        od_nodes=4,
    ),
    "no deadline: extra seats are not pinned and no quota condition is set": Case(
        (base(),), ON_BASE, [(X0, None), (X1, None)], deadline=False
    ),
}


def deadline_job(c: Case) -> JobView:
    body: dict[str, Any] = {"replicas": {"min": 2, "max": c.max_workers}}
    if c.deadline:
        body["deadline"] = {"withinSeconds": c.within}
    st = progress(c.done, 2) if c.done is not None else started(2)
    return replace(job(spec(**body), st), kueue=QUEUE)


@pytest.mark.parametrize("case", CASES)
def test_the_deadline_policy_under_kueue(case: str) -> None:
    c = CASES[case]
    nodes = [
        *cluster(spot=c.spot_nodes),
        *(node(f"od-gpu-{i}", CapacityType.ON_DEMAND) for i in range(c.od_nodes)),
    ]
    result = plan(deadline_job(c), observe(nodes, c.pods, workloads=c.workloads, flavors=FLAVORS))
    made = [(w.name, w.capacity.value if w.capacity else None) for w in result.create_workloads]
    assert made == c.create
    assert all(w.pin == capacity_pin(FLAVORS, w.capacity) for w in result.create_workloads if w.capacity)
    assert sorted(result.delete_workloads) == sorted(c.delete)
    assert [(d.pod, d.reason) for d in result.drains] == c.drains
    assert [(s, p.seat) for s, p in sorted(result.worker_seats.items())] == c.workers
    cond = next((x for x in result.status.conditions if x.type == ConditionType.ON_DEMAND_QUOTA), None)
    assert ((str(cond.status), cond.reason) if cond else None) == c.quota
    if c.quota == ("False", "QuotaExhausted"):
        assert (
            cond is not None and "LocalQueue lq (ClusterQueue cq)" in cond.message and QUOTA in cond.message
        )
        (warning,) = [e for e in result.events if e.reason == "QuotaExhausted"]
        assert warning.type == "Warning"
        again = plan(
            replace(deadline_job(c), status=result.status),
            observe(nodes, c.pods, workloads=c.workloads, flavors=FLAVORS),
        )
        assert not [e for e in again.events if e.reason == "QuotaExhausted"]  # said once


def test_an_on_demand_seats_worker_runs_on_the_on_demand_flavors_nodes() -> None:
    c = CASES["both admitted: workers on them, the quota condition clears"]
    result = plan(deadline_job(c), observe(cluster(spot=2), c.pods, workloads=c.workloads, flavors=FLAVORS))
    assert result.worker_seats[2].node_selector == OD_FLAVOR.node_labels


PIN = {
    "the first on-demand flavor's capacity label, not its other labels": (
        FLAVORS,
        CapacityType.ON_DEMAND,
        {"karpenter.sh/capacity-type": "on-demand"},
    ),
    "EKS managed node groups' label": (
        {"od": FlavorInfo("od", {"eks.amazonaws.com/capacityType": "ON_DEMAND"})},
        CapacityType.ON_DEMAND,
        {"eks.amazonaws.com/capacityType": "ON_DEMAND"},
    ),
    "spot": (FLAVORS, CapacityType.SPOT, {"karpenter.sh/capacity-type": "spot"}),
    "no flavor of that type: Karpenter's label": (
        {},
        CapacityType.ON_DEMAND,
        {"karpenter.sh/capacity-type": "on-demand"},
    ),
}


@pytest.mark.parametrize("case", PIN)
def test_capacity_pin(case: str) -> None:
    flavors, capacity, want = PIN[case]
    assert capacity_pin(flavors, capacity) == want


def test_a_pinned_seats_workload_is_labelled_and_selects_its_flavor() -> None:
    s = spec(placement={"nodeSelector": {"pool": "gpu"}})
    body = workload(
        s,
        job="train",
        namespace="ns",
        uid="u",
        name=X0,
        count=1,
        priority=-1,
        queue="lq",
        capacity=CapacityType.ON_DEMAND,
        pin={"karpenter.sh/capacity-type": "on-demand"},
    )
    assert body["metadata"]["labels"]["etj.dev/capacity"] == "on-demand"
    template = body["spec"]["podSets"][0]["template"]["spec"]
    assert template["nodeSelector"] == {"pool": "gpu", "karpenter.sh/capacity-type": "on-demand"}

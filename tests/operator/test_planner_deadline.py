"""The planner with spec.deadline, as named tables of cases: observation in, on-demand pods and drains out.

The job: 1..4 one-GPU workers, 3,600,000 samples, started an hour before NOW; the trainer measured
250 samples/s per worker. Margin of the policy: 180 s on-demand start-up + 30 s resize + 30 s interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from etj_operator.api.models import CapacityType, ElasticTrainingJobStatus
from etj_operator.api.schedule import MAX_RELEASED_NAMES
from etj_operator.constants import LABEL_CAPACITY
from etj_operator.decide.deadline.schedule import PriceDefaults
from etj_operator.decide.objects import manifests
from etj_operator.decide.plan.planner import JobView, Observed, plan
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason
from tests.operator.factories import NOW, cluster, job, node, observe, spec, started, store, worker

TOTAL = 3_600_000


def deadline_spec(within: int = 6600, **deadline: Any) -> Any:
    return spec(deadline={"withinSeconds": within, **deadline})


def progress(done: int, running: int) -> ElasticTrainingJobStatus:
    """An hour in, ``done`` samples, ``running`` workers measured at 250 samples/s each."""
    return started(
        running,
        progress={
            "step": 100,
            "samplesSeen": done,
            "samplesTotal": TOTAL,
            "samplesPerSecond": 250.0 * running,
        },
        worldSize=running,  # the trainer's report: the world its rate was measured at
    )


def od_node(i: int) -> Any:
    return node(f"od-gpu-{i}", CapacityType.ON_DEMAND)


SPOT_PINNED = {"pinned": "spot"}
OD_PINNED = {"pinned": "on-demand"}
# Two spot workers train; two more spot pods wait for nodes that never came.
TWO_SPOT_TWO_WAITING = [
    worker(0, "spot-0", **SPOT_PINNED),
    worker(1, "spot-1", **SPOT_PINNED),
    worker(2, **SPOT_PINNED),
    worker(3, **SPOT_PINNED),
    store(),
]
# Two spot workers and two on-demand workers train.
MIXED = [
    worker(0, "spot-0", **SPOT_PINNED),
    worker(1, "spot-1", **SPOT_PINNED),
    worker(2, "od-gpu-0", **OD_PINNED),
    worker(3, "od-gpu-1", **OD_PINNED),
    store(),
]
ONE_HOUR_IN_THIRD_DONE = 1_000_000  # 600 s behind a 3-hour line; 3,000 s left with withinSeconds 6600


@dataclass(frozen=True)
class Case:
    name: str
    job: JobView
    obs: Observed
    on_demand_created: int
    drains: list[tuple[str, Reason]]
    pin_spot: bool
    reason: str | None  # status.schedule.reason (None: no schedule)


CASES = [
    # 2,600,000 samples in 2,760 s usable need 942/s: 2 spot (500/s) + 2 on-demand (1,000/s). The two
    # waiting spot pods give way to them.
    Case(
        "behind with spot gone: pending spot gives way to on-demand workers",
        job(deadline_spec(), progress(ONE_HOUR_IN_THIRD_DONE, 2)),
        observe(cluster(spot=2), TWO_SPOT_TWO_WAITING),
        on_demand_created=2,
        drains=[
            ("train-worker-3", Reason.REPLACED_BY_ON_DEMAND),
            ("train-worker-2", Reason.REPLACED_BY_ON_DEMAND),
        ],
        pin_spot=True,
        reason="BehindSchedule",
    ),
    # Every spot node has gone: no worker runs, all four spot pods wait. The rate the two spot workers
    # measured (250/s each, status.worldSize 2) still sizes the replacements: 942/s needs all four.
    Case(
        "all spot gone, nothing running: on-demand sized from the rate measured before",
        job(deadline_spec(), progress(ONE_HOUR_IN_THIRD_DONE, 2)),
        observe(cluster(spot=0), [*(worker(i, **SPOT_PINNED) for i in range(4)), store()]),
        on_demand_created=4,
        drains=[(f"train-worker-{i}", Reason.REPLACED_BY_ON_DEMAND) for i in (3, 2, 1, 0)],
        pin_spot=True,
        reason="BehindSchedule",
    ),
    # 2,000,000 done an hour into a 3-hour deadline: 2,400 s ahead; spot-2 and spot-3 are free again.
    Case(
        "spot returns and the job is ahead: on-demand workers leave first",
        job(deadline_spec(within=10_800), progress(2_000_000, 4)),
        observe([*cluster(spot=4), od_node(0), od_node(1)], MIXED),
        on_demand_created=0,
        drains=[("train-worker-3", Reason.ON_DEMAND_RELEASED), ("train-worker-2", Reason.ON_DEMAND_RELEASED)],
        pin_spot=True,
        reason="AheadOfSchedule",
    ),
    # Every sample trained (the trainer validates, reports and exits next): spot is back, but draining
    # the on-demand workers now would take the exit that finishes the job from them (seen on the bed: the
    # job stayed Pending, its replacements waiting for spot).
    Case(
        "training done with spot back: on-demand workers are not drained before they exit",
        job(deadline_spec(within=10_800), progress(TOTAL, 4)),
        observe([*cluster(spot=4), od_node(0), od_node(1)], MIXED),
        on_demand_created=0,
        drains=[],
        pin_spot=True,
        reason="Finished",
    ),
    # Ahead by 100 s only (< margin + a resize) and no spot to replace them: keep them (no thrash).
    Case(
        "ahead by less than the margin, no spot to take over: on-demand stays",
        job(deadline_spec(within=10_800), progress(1_233_334, 4)),
        observe([*cluster(spot=2), od_node(0), od_node(1)], MIXED),
        on_demand_created=0,
        drains=[],
        pin_spot=True,
        reason="HoldToAvoidThrash",
    ),
    # Spot fills the world (4 running) but only 1,000 s are left for 2,600,000 samples: the policy wants
    # every on-demand worker, but no running spot worker is drained for one that would start 180 s later.
    Case(
        "deadline out of reach with spot filling the world: running spot is not displaced",
        job(deadline_spec(within=4600), progress(ONE_HOUR_IN_THIRD_DONE, 4)),
        observe(cluster(spot=4), [*(worker(i, f"spot-{i}", **SPOT_PINNED) for i in range(4)), store()]),
        on_demand_created=0,
        drains=[],
        pin_spot=True,
        reason="DeadlineUnreachable",
    ),
    Case(
        "no deadline: today's behaviour, nothing pinned, no schedule",
        job(spec(), progress(ONE_HOUR_IN_THIRD_DONE, 2)),
        observe(cluster(spot=2), TWO_SPOT_TWO_WAITING),
        on_demand_created=0,
        drains=[],
        pin_spot=False,
        reason=None,
    ),
    Case(
        "maxOnDemandWorkers 0: the deadline is reported, nothing added",
        job(deadline_spec(maxOnDemandWorkers=0), progress(ONE_HOUR_IN_THIRD_DONE, 2)),
        observe(cluster(spot=2), TWO_SPOT_TWO_WAITING),
        on_demand_created=0,
        drains=[],
        pin_spot=False,
        reason="OnDemandDisabled",
    ),
    Case(
        "no samplesTotal reported yet: nothing decided",
        job(deadline_spec(), started(2, progress={"step": 5, "samplesSeen": 10})),
        observe(cluster(spot=2), TWO_SPOT_TWO_WAITING),
        on_demand_created=0,
        drains=[],
        pin_spot=True,
        reason="NoProgressReported",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_plan_with_deadline(case: Case) -> None:
    p = plan(case.job, case.obs)
    assert len(p.create_on_demand) == case.on_demand_created, p.create_on_demand
    assert [(d.pod, d.reason) for d in p.drains if d.role == "worker"] == case.drains
    assert p.pin_spot == case.pin_spot
    sched = p.status.schedule
    assert (sched.reason if sched else None) == case.reason, sched
    # Slots never collide: new on-demand pods take slots no pod (even a draining one) holds.
    held = {pod.slot for pod in case.obs.pods if pod.slot is not None}
    assert not held & set(p.create_on_demand) and not set(p.create_workers) & set(p.create_on_demand)


def test_on_demand_workers_are_counted_and_reported() -> None:
    p = plan(
        job(deadline_spec(within=10_800), progress(1_233_334, 4)),
        observe([*cluster(spot=2), od_node(0), od_node(1)], MIXED),
    )
    wbc = p.status.workers_by_capacity
    assert wbc is not None and (wbc.spot, wbc.on_demand) == (2, 2)
    sched = p.status.schedule
    assert sched is not None and sched.slack_seconds == 100 and sched.projected_finish is not None
    assert sched.deadline == NOW - timedelta(hours=1) + timedelta(seconds=10_800)


def test_cost_adds_up_the_workers_since_the_last_update() -> None:
    """Two spot workers for two minutes at the default spot price; the source is named."""
    st = progress(1_233_334, 2)
    body = st.model_dump(by_alias=True, mode="json", exclude_none=True)
    body["workersByCapacity"] = {"spot": 2, "onDemand": 0}
    body["cost"] = {"usd": 1.0, "updateTime": (NOW - timedelta(seconds=120)).isoformat(), "priceSource": "x"}
    prev = ElasticTrainingJobStatus.model_validate(body)
    p = plan(job(spec(), prev), observe(cluster(spot=2), [worker(0, "spot-0"), worker(1, "spot-1"), store()]))
    cost = p.status.cost
    defaults = PriceDefaults()
    assert cost is not None and cost.usd == pytest.approx(1.0 + 2 * defaults.spot * 120 / 3600, abs=1e-4)
    assert cost.spot_worker_seconds == 240 and cost.price_source == defaults.source


def _deadline_pod(slot: int, capacity: CapacityType) -> dict[str, Any]:
    """The deadline job's worker pod of ``slot``, placed on ``capacity``."""
    ids = {"job": "train", "namespace": "ns", "uid": "u", "token_secret": "tok"}
    return manifests.worker_pod(deadline_spec(), **ids, slot=slot, capacity=capacity)


def test_on_demand_pod_is_pinned_where_autoscalers_provision() -> None:
    body = _deadline_pod(5, CapacityType.ON_DEMAND)
    assert body["metadata"]["labels"][LABEL_CAPACITY] == "on-demand"
    terms = body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    exprs = [e for t in terms for e in t["matchExpressions"] if e["operator"] == "In"]
    assert {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]} in exprs
    assert {"key": "eks.amazonaws.com/capacityType", "operator": "In", "values": ["ON_DEMAND"]} in exprs
    assert terms[0]["matchExpressions"][1]["key"] == "karpenter.sh/capacity-type"  # Karpenter's term first
    assert not any("spot" in str(t.get("key", "")) for t in body["spec"]["tolerations"])
    spot = _deadline_pod(0, CapacityType.SPOT)
    assert spot["metadata"]["labels"][LABEL_CAPACITY] == "spot"
    assert "requiredDuringSchedulingIgnoredDuringExecution" in spot["spec"]["affinity"]["nodeAffinity"]


def test_pinned_label_round_trips_through_pod_info() -> None:
    from etj_operator.observe.pods import pod_info

    body = _deadline_pod(5, CapacityType.ON_DEMAND)
    info: PodInfo = pod_info(body)
    assert info.pinned == "on-demand" and info.slot == 5


@dataclass(frozen=True)
class ReleaseCase:
    name: str
    running_before: int  # status.currentReplicas the plan reads
    resize_reason: str | None  # what status.resizeHistory says of the round (None: no running change)


# Spot is back and the job is ahead (the case above): both on-demand workers are released in the round in
# which the spot workers are seen running. What the running count does then depends on when the operator
# last saw it, a race of the watch against the trainer: the release must be on record either way (issue 36:
# a clean-clone `make test` found no OnDemandReleased in resizeHistory after a release).
SPOT_BACK = [*cluster(spot=4), od_node(0), od_node(1)]
RELEASE_RACES = [
    ReleaseCase("spot seen running with the release: no running change, no resize", 2, None),
    ReleaseCase("spot seen running before the release: a resize down, named by it", 4, "OnDemandReleased"),
    ReleaseCase("one spot worker joined since the last status: the count rises", 1, "CapacityAdded"),
]


@pytest.mark.parametrize("case", RELEASE_RACES, ids=lambda c: c.name)
def test_a_release_is_recorded_with_the_decision_whatever_the_running_count_does(case: ReleaseCase) -> None:
    prev = progress(2_000_000, 4).model_copy(update={"current_replicas": case.running_before})
    p = plan(job(deadline_spec(within=10_800), prev), observe(SPOT_BACK, MIXED))
    released = ["train-worker-3", "train-worker-2"]
    assert [d.pod for d in p.drains if d.reason == Reason.ON_DEMAND_RELEASED] == released
    sched = p.status.schedule
    assert sched is not None and sched.on_demand_released == released, sched
    named = [e.message for e in p.events if e.reason == Reason.ON_DEMAND_RELEASED]
    assert any(all(n in m for n in released) for m in named), p.events
    resizes = [r.reason for r in p.status.resize_history]
    assert resizes == ([case.resize_reason] if case.resize_reason else []), p.status.resize_history


def test_releases_accumulate_across_rounds_and_keep_the_newest() -> None:
    earlier = [f"train-worker-{i}" for i in range(40, 40 + MAX_RELEASED_NAMES)]
    body = progress(2_000_000, 4).model_dump(by_alias=True, mode="json", exclude_none=True)
    body["schedule"] = {"reason": "AheadOfSchedule", "onDemandReleased": earlier}
    prev = ElasticTrainingJobStatus.model_validate(body)
    p = plan(job(deadline_spec(within=10_800), prev), observe(SPOT_BACK, MIXED))
    sched = p.status.schedule
    assert sched is not None
    assert sched.on_demand_released == [*earlier[2:], "train-worker-3", "train-worker-2"]
    # A round without a release keeps the record as it was.
    quiet = plan(job(deadline_spec(within=10_800), p.status), observe(cluster(spot=4), [*MIXED[:2], store()]))
    assert quiet.status.schedule is not None
    assert quiet.status.schedule.on_demand_released == sched.on_demand_released


def test_a_job_that_ends_in_the_round_that_reads_its_final_report_has_finished_on_schedule() -> None:
    """The policy decides from the status the round read (here: a third done, ahead of the line); the
    final report arrives with the workers' exit, and the job ends in that round. Its schedule said
    AheadOfSchedule forever (issue 36: a loaded clean-clone `make test`)."""
    final = {"step": 180, "finished": True, "samplesSeen": TOTAL, "samplesTotal": TOTAL}
    pods = [worker(0, "spot-0", phase="Succeeded", finished_at=NOW, **SPOT_PINNED), store()]
    p = plan(
        job(deadline_spec(within=10_800), progress(2_000_000, 1)),
        observe(cluster(spot=2), pods, progress=final),
    )
    assert p.status.phase == "Succeeded"
    sched = p.status.schedule
    assert sched is not None and (sched.reason, sched.on_demand_wanted) == ("Finished", 0), sched
    assert sched.projected_finish == p.status.completion_time == NOW

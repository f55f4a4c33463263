"""Bad nodes are avoided, failures count in a window (issue 26): named tables of planner cases."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from etj_operator.api.models import CapacityType, Phase
from etj_operator.decide.objects.manifests import worker_pod
from etj_operator.decide.objects.placement import HOSTNAME_LABEL, capacity_affinity
from etj_operator.decide.plan.planner import JobView, Observed, plan
from etj_operator.observe.pods import pod_info
from etj_operator.observe.signals import Reason
from tests.operator.factories import NOW, cluster, job, node, observe, spec, started, store, worker

RUNNING3 = [worker(i, f"spot-{i}") for i in range(3)]
CRASHED = worker(3, "spot-3", phase="Failed", exit_code=1)
OOM = replace(worker(3, "spot-3", phase="Failed", exit_code=137), exit_reason="OOMKilled")


def avoided(node_name: str, until: datetime, reason: str = "earlier crash") -> dict[str, Any]:
    return {"node": node_name, "until": until.isoformat(), "reason": reason}


def ago(**kw: float) -> str:
    return (NOW - timedelta(**kw)).isoformat()


@dataclass(frozen=True)
class AvoidCase:
    name: str
    job: JobView
    obs: Observed
    avoided: list[str]  # status.avoidedNodes, oldest first
    warned: list[str]  # nodes an AvoidingNode Warning names
    creates: list[int]


AVOID_CASES = [
    AvoidCase(
        "a crashed worker's node is avoided by its replacement",
        job(st=started(4)),
        observe(cluster(), [*RUNNING3, CRASHED, store()]),
        avoided=["spot-3"],
        warned=["spot-3"],
        creates=[4],
    ),
    AvoidCase(
        "an OOM kill is a crash: its node is avoided",
        job(st=started(4)),
        observe(cluster(), [*RUNNING3, OOM, store()]),
        avoided=["spot-3"],
        warned=["spot-3"],
        creates=[4],
    ),
    AvoidCase(
        "a spot interruption says nothing about the node: nothing avoided",
        job(st=started(4)),
        observe(
            [*cluster(spot=3), node("spot-3", signal=Reason.SPOT_INTERRUPTION)],
            [*RUNNING3, worker(3, "spot-3", phase="Failed", exit_code=143), store()],
        ),
        avoided=[],
        warned=[],
        creates=[],
    ),
    AvoidCase(
        "a worker on a deleted node is an interruption: nothing avoided",
        job(st=started(4)),
        observe(cluster(spot=3), [*RUNNING3, CRASHED, store()], deleted_nodes={"spot-3": NOW}),
        avoided=[],
        warned=[],
        creates=[],
    ),
    AvoidCase(
        "avoidNodeSeconds 0 disables it",
        job(spec(failurePolicy={"maxFailures": 2, "avoidNodeSeconds": 0}), started(4)),
        observe(cluster(), [*RUNNING3, CRASHED, store()]),
        avoided=[],
        warned=[],
        creates=[4],
    ),
    AvoidCase(
        "after a restart the entry in status still keeps new workers off the node, without a new Warning",
        job(st=started(3, avoidedNodes=[avoided("spot-3", NOW + timedelta(minutes=10))])),
        observe(cluster(), [*RUNNING3, store()]),
        avoided=["spot-3"],
        warned=[],
        creates=[3],
    ),
    AvoidCase(
        "an expired entry is dropped and no longer excluded",
        job(st=started(3, avoidedNodes=[avoided("spot-3", NOW - timedelta(seconds=1))])),
        observe(cluster(), [*RUNNING3, store()]),
        avoided=[],
        warned=[],
        creates=[3],
    ),
    AvoidCase(
        "a second crash on an avoided node refreshes it; the list is capped at replicas.max, oldest dropped",
        job(
            spec(replicas={"min": 1, "max": 2}),
            started(
                2,
                desired=2,
                avoidedNodes=[
                    avoided("spot-0", NOW + timedelta(minutes=5)),
                    avoided("spot-2", NOW + timedelta(minutes=9)),
                    avoided("spot-3", NOW + timedelta(minutes=10)),
                ],
            ),
        ),
        observe(cluster(), [worker(0, "spot-1"), replace(CRASHED, slot=1, name="train-worker-1"), store()]),
        avoided=["spot-2", "spot-3"],
        warned=["spot-3"],
        creates=[2],
    ),
    AvoidCase(
        "a crash that fails the job avoids nothing (no replacement comes)",
        job(st=started(4, failures=2, failureTimes=[ago(minutes=5)] * 2)),
        observe(cluster(), [*RUNNING3, CRASHED, store()]),
        avoided=[],
        warned=[],
        creates=[],
    ),
]


def _excluded(pod: dict[str, Any]) -> list[list[str]]:
    """The nodes each required node selector term excludes by hostname."""
    node_aff = pod["spec"].get("affinity", {}).get("nodeAffinity", {})
    terms = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    return [
        [v for e in t.get("matchExpressions", []) if e["key"] == HOSTNAME_LABEL for v in e["values"]]
        for t in terms
    ]


@pytest.mark.parametrize("case", AVOID_CASES, ids=[c.name for c in AVOID_CASES])
def test_avoided_nodes(case: AvoidCase) -> None:
    result = plan(case.job, case.obs)
    assert [a.node for a in result.status.avoided_nodes] == case.avoided
    warned = [e for e in result.events if e.reason == "AvoidingNode"]
    assert [e.type for e in warned] == ["Warning"] * len(case.warned)
    assert all(n in e.message for n, e in zip(case.warned, warned, strict=True)), warned
    assert result.create_workers == case.creates
    assert result.avoid_nodes == case.avoided
    for slot in result.create_workers:
        pod = worker_pod(
            case.job.spec,
            job="train",
            namespace="ns",
            uid="u",
            token_secret="tok",
            slot=slot,
            avoid_nodes=result.avoid_nodes,
        )
        excluded = _excluded(pod)
        # Every term (they are ORed) excludes every avoided node; nothing is required when none is avoided.
        assert excluded == ([case.avoided] * len(excluded) if case.avoided else [[]] * len(excluded))
        assert excluded or not case.avoided
    # The status written is what the next reconcile reads: the same decision, no second Warning.
    again = plan(replace(case.job, status=result.status), case.obs)
    assert [a.node for a in again.status.avoided_nodes] == case.avoided


def test_the_avoided_entry_says_until_when_and_why() -> None:
    result = plan(job(st=started(4)), observe(cluster(), [*RUNNING3, OOM, store()]))
    (entry,) = result.status.avoided_nodes
    assert entry.until == NOW + timedelta(seconds=1800)
    assert "train-worker-3" in entry.reason and "OOMKilled" in entry.reason
    (event,) = [e for e in result.events if e.reason == "AvoidingNode"]
    assert "spot-3" in event.message and "OOMKilled" in event.message
    assert result.status.to_patch()["avoidedNodes"][0]["node"] == "spot-3"


def test_avoided_nodes_are_anded_into_every_required_term() -> None:
    user = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n9"]}]},
                ]
            }
        }
    }
    aff = capacity_affinity([CapacityType.SPOT], user, avoid=["bad-1", "bad-2"])
    terms = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    away = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": ["bad-1", "bad-2"]}
    assert len(terms) > 2 and all(t["matchExpressions"][-1] == away for t in terms)
    assert any("matchFields" in t for t in terms)  # the user's own term kept its fields
    # Both capacity types allowed, no user terms: nothing was required, now one term of just the exclusion.
    both = capacity_affinity([CapacityType.SPOT, CapacityType.ON_DEMAND], avoid=["bad-1"])
    assert both["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{**away, "values": ["bad-1"]}]}
    ]


@dataclass(frozen=True)
class WindowCase:
    name: str
    job: JobView
    phase: Phase
    failures: int  # status.failures: the whole life
    times: int  # status.failureTimes kept


SPREAD = [ago(days=3), ago(days=2), ago(days=1), ago(hours=12)]  # four earlier crashes, over three days
CLUSTERED = [ago(minutes=50), ago(minutes=40), ago(minutes=30), ago(minutes=20)]  # four within the hour


def window_job(times: list[str], **policy: Any) -> JobView:
    return job(
        spec(failurePolicy={"maxFailures": 4, **policy}), started(4, failures=len(times), failureTimes=times)
    )


WINDOW_CASES = [
    WindowCase(
        "five crashes spread over three days do not fail the job", window_job(SPREAD), Phase.RESIZING, 5, 1
    ),
    WindowCase(
        "five crashes within an hour fail it (maxFailures 4)", window_job(CLUSTERED), Phase.FAILED, 5, 5
    ),
    WindowCase(
        "six spread crashes with the default settings (maxFailures 5) do not fail it",
        job(
            spec(failurePolicy={"maxFailures": 5}),
            started(4, failures=5, failureTimes=[*SPREAD, ago(hours=2)]),
        ),
        Phase.RESIZING,
        6,
        1,
    ),
    WindowCase(
        "six crashes within an hour with the default settings fail it",
        job(
            spec(failurePolicy={"maxFailures": 5}),
            started(4, failures=5, failureTimes=[*CLUSTERED, ago(minutes=1)]),
        ),
        Phase.FAILED,
        6,
        6,
    ),
    WindowCase(
        "failureWindowSeconds 0 counts the whole life (status.failures), as before",
        window_job(SPREAD, failureWindowSeconds=0),
        Phase.FAILED,
        5,
        5,
    ),
    WindowCase(
        "a budget the stored times cannot hold (maxFailures >= 64) counts the whole life",
        job(spec(failurePolicy={"maxFailures": 64}), started(4, failures=64, failureTimes=SPREAD)),
        Phase.FAILED,
        65,
        1,
    ),
]


@pytest.mark.parametrize("case", WINDOW_CASES, ids=[c.name for c in WINDOW_CASES])
def test_failures_count_in_the_window(case: WindowCase) -> None:
    obs = observe(cluster(), [*RUNNING3, CRASHED, store()])
    result = plan(case.job, obs)
    assert result.status.phase == case.phase
    assert result.status.failures == case.failures
    assert len(result.status.failure_times) == case.times
    assert result.status.failure_times[-1] == NOW


@pytest.mark.parametrize(
    ("gap", "phases"),
    [(timedelta(hours=15), ["Resizing"] * 5), (timedelta(minutes=5), ["Resizing"] * 4 + ["Failed"])],
)
def test_each_crash_is_judged_from_the_status_alone(gap: timedelta, phases: list[str]) -> None:
    """Five crashes, one per reconcile, each planned from nothing but the status the last one wrote (what a
    restarted operator has): spread ones never fail the job, clustered ones do on the fifth."""
    current = job(spec(failurePolicy={"maxFailures": 4}), started(4))
    seen = []
    for i in range(5):
        obs = observe(cluster(), [*RUNNING3, CRASHED, store()], now=NOW + i * gap)
        result = plan(current, obs)
        seen.append(str(result.status.phase))
        current = replace(current, status=result.status)
    assert seen == phases
    assert current.status.failures == 5


PENDING_AVOIDER = replace(worker(3), avoids=("spot-3",))


@pytest.mark.parametrize(
    ("until", "drains", "creates"),
    [
        (NOW - timedelta(seconds=1), [("train-worker-3", Reason.AVOIDANCE_EXPIRED)], [4]),
        (NOW + timedelta(minutes=5), [], []),
    ],
    ids=["its avoided node expired: recreated at once", "its avoided node still avoided: kept"],
)
def test_a_pending_worker_is_recreated_when_a_node_it_avoids_is_allowed_again(
    until: datetime, drains: list[tuple[str, Reason]], creates: list[int]
) -> None:
    """Its affinity is fixed at creation: on a pool whose every node once crashed a worker it would wait
    for ever, off nodes the job may use again."""
    current = job(st=started(3, avoidedNodes=[avoided("spot-3", until)]))
    result = plan(current, observe(cluster(spot=3), [*RUNNING3, PENDING_AVOIDER, store()]))
    assert [(d.pod, d.reason) for d in result.drains] == drains
    assert result.create_workers == creates


def test_a_worker_pod_records_the_nodes_it_avoids() -> None:
    pod = worker_pod(
        spec(), job="train", namespace="ns", uid="u", token_secret="tok", slot=0, avoid_nodes=["a", "b"]
    )
    assert pod_info(pod).avoids == ("a", "b")
    assert (
        pod_info(worker_pod(spec(), job="train", namespace="ns", uid="u", token_secret="tok", slot=0)).avoids
        == ()
    )


@pytest.mark.parametrize(
    ("avoid", "startup"), [([], 4), (["spot-3"], 3)], ids=["none avoided", "spot-3 avoided"]
)
def test_an_avoided_node_is_no_free_room(avoid: list[str], startup: int) -> None:
    """The only free node is avoided: the replacement is still created (pending pods ask autoscalers for
    nodes), but new agents do not wait for it before their first world."""
    until = NOW + timedelta(minutes=5)
    current = job(st=started(3, avoidedNodes=[avoided(n, until) for n in avoid]))
    result = plan(current, observe(cluster(), [*RUNNING3, store()]))
    assert result.create_workers == [3]
    assert result.startup_workers == startup

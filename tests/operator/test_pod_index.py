"""The pod views the watch feeds (observe/pod_index.py, handlers.State's callbacks), with plain dicts.

Issue 29: a pod event that cannot change a plan (a status update of a pod bound where it was, any event
of a pod that is not etj's) must change no sum and wake no job loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from etj_operator.constants import LABEL_JOB
from etj_operator.k8s.handlers import State
from etj_operator.k8s.pod_watch import split_events
from etj_operator.k8s.settings import Settings
from etj_operator.observe.pod_index import Contribution, UsageLedger, pod_contribution
from tests.operator.factories import GPU


def pod(
    name: str,
    node: str | None = "n1",
    gpus: int = 0,
    cpu: str | None = None,
    phase: str = "Running",
    labels: Mapping[str, str] | None = None,
    ns: str = "other",
) -> dict[str, Any]:
    requests: dict[str, str] = {}
    if gpus:
        requests[GPU] = str(gpus)
    if cpu:
        requests["cpu"] = cpu
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": requests}}]}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "labels": dict(labels or {})},
        "spec": spec,
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (pod("a", gpus=1), ("n1", {GPU: 1})),
        (pod("a", gpus=2, cpu="500m"), ("n1", {GPU: 2, "cpu": 500})),
        (pod("a", cpu="100m"), ("n1", {"cpu": 100})),  # CPU of foreign pods still fills a node
        (pod("a", node=None, gpus=1), None),  # not bound: holds nothing yet
        (pod("a", gpus=1, phase="Succeeded"), None),  # finished pods hold no devices
        (pod("a", gpus=1, phase="Failed"), None),
        (pod("a"), None),  # requests nothing countable
    ],
)
def test_what_a_pod_contributes(body: dict[str, Any], expected: Contribution | None) -> None:
    assert pod_contribution(body) == expected


@dataclass
class LedgerCase:
    name: str
    steps: list[tuple[str, Contribution | None]]
    changed: list[bool]
    sums: dict[str, dict[str, int]] = field(default_factory=dict)


LEDGER_CASES = [
    LedgerCase("bind", [("p", ("n1", {GPU: 1}))], [True], {"n1": {GPU: 1}}),
    LedgerCase(
        "a status update changes nothing",
        [("p", ("n1", {GPU: 1})), ("p", ("n1", {GPU: 1}))],
        [True, False],
        {"n1": {GPU: 1}},
    ),
    LedgerCase(
        "two pods sum", [("p", ("n1", {GPU: 1})), ("q", ("n1", {GPU: 2}))], [True, True], {"n1": {GPU: 3}}
    ),
    LedgerCase("finish frees the node", [("p", ("n1", {GPU: 1})), ("p", None)], [True, True], {}),
    LedgerCase("delete of an unknown pod", [("p", None)], [False], {}),
    LedgerCase(
        "resize",
        [("p", ("n1", {"cpu": 100})), ("p", ("n1", {"cpu": 300}))],
        [True, True],
        {"n1": {"cpu": 300}},
    ),
    LedgerCase(
        "one of two leaves",
        [("p", ("n1", {GPU: 1, "cpu": 5})), ("q", ("n1", {GPU: 1})), ("p", None)],
        [True, True, True],
        {"n1": {GPU: 1}},
    ),
]


@pytest.mark.parametrize("case", LEDGER_CASES, ids=lambda c: c.name)
def test_usage_ledger(case: LedgerCase) -> None:
    ledger = UsageLedger()
    assert [ledger.apply(uid, c) for uid, c in case.steps] == case.changed
    assert {k: dict(v) for k, v in ledger.view.items()} == case.sums


def test_relist_replaces_everything() -> None:
    ledger = UsageLedger()
    ledger.apply("gone", ("n1", {GPU: 1}))
    ledger.replace_all({"p": ("n2", {GPU: 2})})
    assert {k: dict(v) for k, v in ledger.view.items()} == {"n2": {GPU: 2}} and len(ledger) == 1


@pytest.mark.parametrize(
    ("pending", "chunk", "n_events", "tail"),
    [
        (b"", b'{"type":"ADDED","object":{}}\n', 1, b""),
        (b"", b'{"type":"ADDED","object":{}}\n{"type":"MOD', 1, b'{"type":"MOD'),
        (b'{"type":"MOD', b'IFIED","object":{}}\n\n', 1, b""),
        (b"", b"", 0, b""),
    ],
)
def test_split_events_keeps_the_unfinished_line(
    pending: bytes, chunk: bytes, n_events: int, tail: bytes
) -> None:
    events, rest = split_events(pending, chunk)
    assert len(events) == n_events and rest == tail


class Kicks:
    """Stands in for JobRunners: records which job loops an event would wake."""

    def __init__(self) -> None:
        self.kicked: list[tuple[str, str]] = []

    def kick(self, namespace: str, name: str) -> None:
        self.kicked.append((namespace, name))


def _state() -> tuple[State, Kicks]:
    state = State(Settings())
    kicks = Kicks()
    state.runners = kicks  # type: ignore[assignment]  # only kick() is used by the pod callbacks
    state.pods_relisted("", [])
    return state, kicks


def test_foreign_pods_only_count_toward_usage_and_wake_nobody() -> None:
    state, kicks = _state()
    state.pod_events("", [("ADDED", pod("web", cpu="100m")), ("ADDED", pod("infer", gpus=1))])
    state.pod_events("", [("MODIFIED", pod("infer", gpus=1))])  # status update
    assert kicks.kicked == []
    assert dict(state.node_usage()["n1"]) == {"cpu": 100, GPU: 1}
    assert state.job_pods("other", "web") == [] and state.jobs_on_node("n1") == set()


def test_our_pods_enter_the_job_index_and_wake_their_job() -> None:
    state, kicks = _state()
    ours = pod("train-worker-0", gpus=1, labels={LABEL_JOB: "train"}, ns="ml")
    state.pod_events("", [("ADDED", ours)])
    assert kicks.kicked == [("ml", "train")]
    assert [p.name for p in state.job_pods("ml", "train")] == ["train-worker-0"]
    assert state.jobs_on_node("n1") == {("ml", "train")}
    assert dict(state.node_usage()["n1"]) == {GPU: 1}
    state.pod_events("", [("DELETED", ours)])
    assert state.job_pods("ml", "train") == [] and "n1" not in state.node_usage()


def test_a_kubelet_or_scheduler_status_write_on_our_pending_pod_wakes_its_job_with_the_blocker() -> None:
    """Issue 37: the waiting reason (or the scheduler's Unschedulable) arrives as a status-only MODIFIED of a
    pod that changes no usage; it must still reach the job's plan within a reconcile."""
    state, kicks = _state()
    ours = pod("train-worker-0", node=None, gpus=1, phase="Pending", labels={LABEL_JOB: "train"}, ns="ml")
    state.pod_events("", [("ADDED", ours)])
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3"}
    state.pod_events(
        "", [("MODIFIED", {**ours, "status": {"phase": "Pending", "conditions": [unschedulable]}})]
    )
    assert kicks.kicked == [("ml", "train")] * 2
    (info,) = state.job_pods("ml", "train")
    assert info.blocker is not None and (info.blocker.reason, info.blocker.message) == (
        "Unschedulable",
        "0/3",
    )


def test_the_first_listing_opens_the_gate_and_fills_both_views() -> None:
    state = State(Settings(namespaces=("a", "b")))
    state.pods_relisted("a", [pod("w", gpus=1, labels={LABEL_JOB: "j"}, ns="a")])
    assert not state.pods_listed.is_set()  # namespace b not listed yet: no plan may run
    state.pods_relisted("b", [pod("x", gpus=1, ns="b")])
    assert state.pods_listed.is_set()
    assert dict(state.node_usage()["n1"]) == {GPU: 2}  # both namespaces' ledgers, merged
    assert [p.name for p in state.job_pods("a", "j")] == ["w"]


def test_the_node_view_follows_the_node_index_and_node_deletions() -> None:
    """Issue 29: plans read nodes from a plain dict kept by the node index's calls (reading kopf's index
    cost ~5 µs a node per plan); it must still see new, changed and deleted nodes."""
    import asyncio

    from etj_operator.k8s.handlers import etj_nodes, node_event
    from etj_testbed.localcluster.fake_nodes import fake_gpu_node

    state, _ = _state()
    memo = {"etj": state}
    spot = fake_gpu_node(
        "s1", capacity_type="spot", gpus=2, provider="karpenter", pool="p", labels={}, taints=[]
    )
    asyncio.run(etj_nodes(name="s1", body=spot, memo=memo))
    assert list(state.nodes()) == ["s1"] and state.nodes()["s1"].signal is None
    tainted = {
        **spot,
        "spec": {"taints": [{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}]},
    }
    asyncio.run(etj_nodes(name="s1", body=tainted, memo=memo))
    signal = state.nodes()["s1"].signal
    assert signal is not None and signal.since is not None  # stamped when first seen: the drain clock
    asyncio.run(node_event(type="DELETED", name="s1", body=tainted, memo=memo))
    assert "s1" not in state.nodes() and "s1" in state.deleted_nodes()

"""Where the store runs and how it moves (decide/plan/store_move.py), as a named table: store pods and nodes
in, the store's plan out: make before break on a node being emptied, at once on a node that is gone."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta

import pytest

from etj_operator.api.models import CapacityType
from etj_operator.decide.plan.store_move import MOVE_TIMEOUT, STORE_MOVED, STORE_MOVING, plan_store
from etj_operator.observe.nodes import NodeInfo
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason
from tests.operator.factories import LONG_AGO, NOW, node, observe, store


def od(name: str, signal: Reason | None = None) -> NodeInfo:
    return node(name, CapacityType.ON_DEMAND, gpus=0, signal=signal)


def s(index: int, node_name: str = "od-0", **kw: object) -> PodInfo:
    """Store pod ``index``, labelled with it, Running and Ready unless told otherwise."""
    kw.setdefault("ready", True)
    pod = store(node_name, name=f"train-rdzv-{index}", store=str(index))
    return replace(pod, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    name: str
    nodes: list[NodeInfo]
    pods: list[PodInfo]
    drains: list[tuple[str, Reason, bool]] = field(default_factory=list)  # (pod, reason, forced)
    create: int | None = None
    serve: int | None = None
    events: list[str] = field(default_factory=list)
    requeue: float | None = None
    deleted: tuple[str, ...] = ()


CORDONED = [od("od-0", Reason.NODE_CORDONED), od("od-1")]
PENDING_10S = {"phase": "Pending", "ready": False, "created": NOW - timedelta(seconds=10)}

CASES = [
    Case("a fresh job gets store 0, which the Service selects", [od("od-0")], [], create=0, serve=0),
    Case("a running store stays and is served", [od("od-0")], [s(3)], serve=3),
    Case(
        "an older operator's store (no index label) stays, its Service untouched",
        [od("od-0")],
        [store("od-0", name="train-rdzv-2")],
    ),
    Case(
        "a cordon starts the replacement first, outside the Service; the old store stays",
        CORDONED,
        [s(0)],
        create=1,
        serve=0,
        events=[STORE_MOVING],
        requeue=MOVE_TIMEOUT.total_seconds(),
    ),
    Case(
        "while the replacement starts, nothing is deleted and nothing more created",
        CORDONED,
        [s(0), s(1, "od-1", **PENDING_10S)],
        serve=0,
        requeue=MOVE_TIMEOUT.total_seconds() - 10,
    ),
    Case(
        "a Running replacement that is not Ready yet still waits",
        CORDONED,
        [s(0), s(1, "od-1", ready=False, created=NOW - timedelta(seconds=10))],
        serve=0,
        requeue=MOVE_TIMEOUT.total_seconds() - 10,
    ),
    Case(
        "once the replacement is Ready the Service switches to it and the old store goes",
        CORDONED,
        [s(0), s(1, "od-1")],
        drains=[("train-rdzv-0", Reason.NODE_CORDONED, False)],
        serve=1,
        events=[STORE_MOVED],
    ),
    Case(
        "a replacement not Ready after the timeout no longer holds the drain back",
        CORDONED,
        [s(0), s(1, "od-1", phase="Pending", ready=False, created=NOW - MOVE_TIMEOUT)],
        drains=[("train-rdzv-0", Reason.NODE_CORDONED, False)],
        serve=1,
        events=[STORE_MOVED],
    ),
    Case(
        "an uncordon before the switch calls the move off: the replacement goes, the store stays",
        [od("od-0"), od("od-1")],
        [s(0), s(1, "od-1")],
        drains=[("train-rdzv-1", Reason.STORE_NOT_NEEDED, False)],
        serve=0,
    ),
    Case(
        "a replacement whose own node is emptied too is replaced by another",
        [od("od-0", Reason.NODE_CORDONED), od("od-1", Reason.NODE_DISRUPTED), od("od-2")],
        [s(0), s(1, "od-1")],
        drains=[("train-rdzv-1", Reason.NODE_DISRUPTED, False)],
        create=2,
        serve=0,
        events=[STORE_MOVING],
        requeue=MOVE_TIMEOUT.total_seconds(),
    ),
    Case(
        "a deleted node is no move: its store is removed (grace 0) and the new one served at once",
        [od("od-1")],
        [s(0, "od-9")],
        drains=[("train-rdzv-0", Reason.NODE_DELETED, True)],
        create=1,
        serve=1,
        deleted=("od-9",),
    ),
    Case(
        "a node lost mid-move serves the replacement at once, Ready or not",
        [od("od-1")],
        [s(0, "od-9"), s(1, "od-1", **PENDING_10S)],
        drains=[("train-rdzv-0", Reason.NODE_DELETED, True)],
        serve=1,
        deleted=("od-9",),
    ),
    Case(
        "the old store terminating (evicted, deleted by hand) lets the replacement serve",
        CORDONED,
        [s(0, terminating=True), s(1, "od-1", **PENDING_10S)],
        serve=1,
    ),
    Case(
        "a store pod that exited is replaced at once",
        [od("od-0")],
        [s(0, phase="Failed")],
        drains=[("train-rdzv-0", Reason.WORKER_FAILED, False)],
        create=1,
        serve=1,
    ),
    Case(
        "an older operator's store on a cordoned node moves as before: deleted now, replaced at once",
        CORDONED,
        [store("od-0", name="train-rdzv-0")],
        drains=[("train-rdzv-0", Reason.NODE_CORDONED, False)],
        create=1,
        serve=1,
    ),
    Case(
        "a rebalance recommendation is a hint: the store stays",
        [od("od-0", Reason.REBALANCE_RECOMMENDATION)],
        [s(0)],
        serve=0,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_store_plan(case: Case) -> None:
    deleted = {n: LONG_AGO for n in case.deleted}
    obs = observe(case.nodes, case.pods, deleted_nodes=deleted)
    next_index = 1 + max((int(p.name.rsplit("-", 1)[1]) for p in case.pods), default=-1)
    got = plan_store("train", case.pods, obs, next_index)
    assert [(d.pod, d.reason, d.force) for d in got.drains] == case.drains
    assert all(d.role == "rendezvous" for d in got.drains)
    assert (got.create, got.serve) == (case.create, case.serve)
    assert [e.reason for e in got.events] == case.events
    assert got.requeue == case.requeue


@pytest.mark.parametrize(
    "reason",
    [Reason.NODE_CORDONED, Reason.NODE_DISRUPTED, Reason.SPOT_INTERRUPTION, Reason.SCHEDULED_MAINTENANCE],
)
def test_every_notice_that_empties_the_node_moves_make_before_break(reason: Reason) -> None:
    got = plan_store("train", [s(0)], observe([od("od-0", reason)], [s(0)]), 1)
    assert (got.create, got.serve, got.drains) == (1, 0, [])

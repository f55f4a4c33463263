"""The job loop applies a store move in order: the Service selects the new store before the old one is
deleted, and an old store whose switch failed is not deleted (the agents would find no store)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from etj_operator.decide.plan.planner import Plan
from etj_operator.decide.plan.store_move import STORE_MOVING
from etj_operator.decide.types import Drain, KubeEvent
from etj_operator.k8s import reconciler
from etj_operator.k8s.client import KubeClient
from etj_operator.k8s.reconciler import JobRunner
from etj_operator.k8s.settings import Settings
from etj_operator.k8s.store_client import StoreClient, running_store
from etj_operator.observe.signals import Reason
from tests.operator.factories import NOW, job, observe, store
from tests.operator.test_reconciler import StaticWorld


class OrderKube(KubeClient):
    """The real client class with its writes recorded in order; ``fail_select``: the patch raises."""

    def __init__(self, fail_select: bool = False) -> None:
        super().__init__(client.ApiClient())
        self.calls: list[tuple[str, Any]] = []
        self.fail_select = fail_select

    async def select_store(self, namespace: str, service: str, selector: dict[str, str]) -> bool:
        if self.fail_select:
            raise RuntimeError("apiserver unavailable")
        self.calls.append(("select", (service, selector.get("etj.dev/store"))))
        return True

    async def delete_pod(self, namespace: str, name: str, *, uid: str | None, grace: int | None) -> bool:
        self.calls.append(("delete", name))
        return True

    async def ensure(self, body: dict[str, Any]) -> None:
        self.calls.append(("ensure", body["kind"]))


OLD = store("od-0", name="train-rdzv-0", store="0")
NEW = store("od-1", name="train-rdzv-1", store="1", ready=True)


def _apply(kube: OrderKube, drains: list[Drain], serve: int) -> JobRunner:
    runner = JobRunner("ns", "train", StaticWorld([OLD, NEW]), kube, Settings(), StoreClient())
    result = Plan(drains=drains, serve_rendezvous=serve)
    asyncio.run(
        runner.apply(job(), result, {p.name: p for p in (OLD, NEW)}, observe([], [OLD, NEW], now=NOW))
    )
    return runner


def test_the_service_selects_the_new_store_before_the_old_one_is_deleted() -> None:
    kube = OrderKube()
    moved = Drain(OLD.name, Reason.NODE_CORDONED, "store moved", "od-0", role="rendezvous")
    runner = _apply(kube, [moved], 1)
    assert kube.calls == [("select", ("train-rdzv", "1")), ("delete", "train-rdzv-0")]
    assert runner.serving == 1
    kube.calls.clear()
    asyncio.run(runner._serve(job(), 1))
    assert kube.calls == []  # already selected: no patch per reconcile


def test_a_failed_switch_keeps_the_old_store_but_not_one_on_a_lost_node() -> None:
    kube = OrderKube(fail_select=True)
    moved = Drain(OLD.name, Reason.NODE_CORDONED, "store moved", "od-0", role="rendezvous")
    lost = Drain("train-rdzv-9", Reason.NODE_DELETED, "node gone", "od-9", role="rendezvous", force=True)
    worker = Drain("train-worker-0", Reason.NODE_CORDONED, "node cordoned", "od-0")
    runner = _apply(kube, [moved, lost, worker], 1)
    assert kube.calls == [("delete", "train-rdzv-9"), ("delete", "train-worker-0")]
    assert runner.serving is None and runner.kick.is_set()  # tried again next round


def test_a_plans_events_are_posted_even_when_its_status_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    # regression: a store move changes no status, and its StoreMoving/StoreMoved Events were dropped with
    # the status write that was not needed (seen against the real apiserver: no Event at all)
    posted: list[str] = []
    monkeypatch.setattr(
        reconciler, "post_events", lambda body, plan: posted.extend(e.reason for e in plan.events)
    )
    runner = JobRunner("ns", "train", StaticWorld([OLD]), OrderKube(), Settings(), StoreClient())
    runner.body = {"metadata": {"name": "train", "namespace": "ns"}}
    result = Plan(events=[KubeEvent("Normal", STORE_MOVING, "store train-rdzv-0 is moving")])
    asyncio.run(runner.apply(job(), result, {OLD.name: OLD}, observe([], [OLD], now=NOW)))
    assert posted == [STORE_MOVING]


def test_progress_is_read_from_the_serving_store_while_its_replacement_runs() -> None:
    # a replacement running beside the old store holds no progress until the agents move to it; whichever
    # came first in the index was read, so status could lose its progress for the move
    new, old = replace(NEW, ip="10.0.0.2"), replace(OLD, ip="10.0.0.1")
    assert running_store([new, old]) is old
    assert running_store([replace(old, terminating=True), new]) is new

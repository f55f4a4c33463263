"""The job loop's bookkeeping with plain objects: expectations over a lagging index, progress fetch."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import pytest
from kubernetes import client

from etj_operator.k8s.client import KubeClient, StatusConflict
from etj_operator.k8s.reconciler import JobRunner
from etj_operator.k8s.settings import Settings
from etj_operator.k8s.store_client import StoreClient
from etj_operator.observe.nodes import NodeInfo
from etj_operator.observe.pods import PodInfo
from tests.operator.factories import worker


class StaticWorld:
    """A World whose indices are whatever the test puts in them (an index that lags our writes)."""

    def __init__(self, pods: list[PodInfo], nodes: Mapping[str, NodeInfo] | None = None) -> None:
        self.pods = pods
        self._nodes = dict(nodes or {})

    def nodes(self) -> Mapping[str, NodeInfo]:
        return self._nodes

    def node_usage(self) -> Mapping[str, Mapping[str, int]]:
        return {}

    def deleted_nodes(self) -> Mapping[str, datetime]:
        return {}

    def job_pods(self, namespace: str, job: str) -> list[PodInfo]:
        return list(self.pods)


def _runner(world: StaticWorld) -> JobRunner:
    return JobRunner("ns", "train", world, KubeClient(client.ApiClient()), Settings(), StoreClient())


def test_created_pods_count_before_the_index_shows_them() -> None:
    world = StaticWorld([worker(0, "n0")])
    runner = _runner(world)
    runner.expect_create["train-worker-1"] = (
        PodInfo("train-worker-1", "train", "worker", 1),
        time.monotonic() + 30,
    )
    assert sorted(p.name for p in runner._pods()) == ["train-worker-0", "train-worker-1"]
    world.pods.append(worker(1, "n1"))  # the index caught up: the expectation is dropped
    assert len(runner._pods()) == 2 and not runner.expect_create


def test_deleted_pods_count_as_terminating_until_the_index_agrees() -> None:
    world = StaticWorld([worker(0, "n0"), worker(1, "n1")])
    runner = _runner(world)
    runner.expect_delete["train-worker-1"] = ("u1", time.monotonic() + 30)
    assert [p.terminating for p in runner._pods()] == [False, True]
    world.pods = [worker(0, "n0")]
    runner._pods()
    assert not runner.expect_delete


def test_expectations_expire() -> None:
    runner = _runner(StaticWorld([]))
    runner.expect_create["train-worker-5"] = (PodInfo("train-worker-5"), time.monotonic() - 1)
    assert runner._pods() == []


def test_fetch_progress_reads_the_store_endpoint() -> None:
    payload = {"step": 12, "worldSize": 2}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(payload).encode() if self.path == "/progress" else b"{}"
            self.send_response(200 if self.path == "/progress" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    store = StoreClient()

    async def go() -> tuple[Any, Any]:
        try:
            got = await store.fetch_progress("127.0.0.1", port=server.server_address[1])
            missing = await store.fetch_progress("127.0.0.1", port=1, timeout=0.5)
            return got, missing
        finally:
            await store.close()

    try:
        assert asyncio.run(go()) == (payload, None)
    finally:
        server.shutdown()


def test_pods_of_an_earlier_job_with_the_same_name_are_ignored() -> None:
    world = StaticWorld(
        [replace(worker(0, "n0"), owner_uid="old-uid"), replace(worker(1, "n1"), owner_uid="new")]
    )
    assert [p.name for p in _runner(world)._owned("new")] == ["train-worker-1"]


def _run_then_close(
    store: StoreClient, httpd: ThreadingHTTPServer, work: Callable[[], Awaitable[None]]
) -> None:
    """Run the loop's ``work`` against a real store server, then close the client and the server."""

    async def go() -> None:
        try:
            await work()
        finally:
            await store.close()

    try:
        asyncio.run(go())
    finally:
        httpd.shutdown()


class RecordingKube(KubeClient):
    """The real client class with the loop's writes recorded instead of sent: this test is about *when*
    the loop reads the store (the end-to-end test checks the same against the real apiserver)."""

    def __init__(self) -> None:
        super().__init__(client.ApiClient())
        self.patches: list[dict[str, Any]] = []
        self.versions: list[str | None] = []  # the resourceVersion each status write was based on
        self.conflicts = 0  # answer this many writes as the apiserver does a stale one (409)
        self.current: dict[str, Any] | None = None  # the job as the apiserver has it (get_job)
        self.gone: set[str] = set()  # pods someone else deleted first (their delete won)

    async def patch_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str | None = None
    ) -> dict[str, Any] | None:
        self.versions.append(resource_version)
        if self.conflicts:
            self.conflicts -= 1
            raise StatusConflict(f"{name} changed since {resource_version}")
        self.patches.append(status)
        return {"status": status, "metadata": {"resourceVersion": f"{resource_version}+1"}}

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.current

    async def delete_pod(self, namespace: str, name: str, **kwargs: Any) -> bool:
        return name not in self.gone  # False: already deleted, by someone else

    async def create_pod(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def ensure(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def select_store(self, *args: Any, **kwargs: Any) -> bool:
        return True


def test_workers_that_exited_0_make_the_loop_read_the_final_report_at_once() -> None:
    # regression (issue 12): the job was marked Succeeded and its store stopped from the last *polled*
    # report, so the final one (accuracy) never reached status when the poll had not come round yet
    from etj_trainer.core.progress import post_json
    from etj_trainer.service.store_http import ProgressState, make_http_server
    from tests.operator.factories import spec, started, store

    ip = "127.0.0.1"
    httpd = make_http_server(ip, 0, ProgressState())
    port = httpd.server_address[1]
    Thread(target=httpd.serve_forever, daemon=True).start()
    final = {"step": 180, "worldSize": 4, "resizes": [], "finished": True, "accuracy": 0.98}
    post_json(f"http://{ip}:{port}/progress", final)
    from etj_operator.timeutil import utcnow

    exited = [replace(worker(i, f"n{i}", phase="Succeeded"), finished_at=utcnow()) for i in range(4)]
    world = StaticWorld([*exited, replace(store("od-0"), ip=ip)])
    kube = RecordingKube()
    # The poll is an hour away: only the loop's own re-read can bring the final report in.
    http = StoreClient()
    runner = JobRunner("ns", "train", world, kube, Settings(progress_seconds=3600, progress_port=port), http)
    runner.body = {
        "metadata": {"name": "train", "namespace": "ns", "uid": "", "generation": 1},
        "spec": spec().model_dump(mode="json", by_alias=True, exclude_none=True),
        "status": started(0).to_patch(),
    }
    runner.store.progress = {"step": 170, "worldSize": 4, "resizes": [], "finished": False}

    _run_then_close(http, httpd, runner.reconcile)
    assert kube.patches, "no status written"
    assert kube.patches[-1]["phase"] == "Succeeded"
    assert kube.patches[-1]["progress"]["accuracy"] == 0.98


def _nodes(count: int) -> dict[str, NodeInfo]:
    from tests.operator.factories import node

    return {f"n{i}": node(f"n{i}") for i in range(count)}


def _job_body(version: str, st: Any) -> dict[str, Any]:
    from tests.operator.factories import spec

    return {
        "apiVersion": "etj.dev/v1alpha1",
        "kind": "ElasticTrainingJob",
        "metadata": {
            "name": "train",
            "namespace": "ns",
            "uid": "",
            "generation": 1,
            "resourceVersion": version,
        },
        "spec": spec().model_dump(mode="json", by_alias=True, exclude_none=True),
        "status": st.to_patch(),
    }


def test_status_writes_carry_the_version_they_were_computed_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """Optimistic concurrency (issue 26): each status write names the job's resourceVersion its plan read;
    after a conflict the status is planned again on the job as the apiserver has it, and written on its
    version."""
    import kopf

    from tests.operator.factories import started

    monkeypatch.setattr(kopf, "event", lambda *a, **kw: None)  # Events need kopf's running context

    world = StaticWorld([worker(0, "n0"), worker(1, "n1")])
    kube = RecordingKube()
    runner = JobRunner("ns", "train", world, kube, Settings(progress_seconds=0), StoreClient())

    async def rounds() -> None:
        runner.body = _job_body("41", started(4))  # the status says 4 workers, 2 run: a new status
        await runner.reconcile()
        assert kube.versions == ["41"] and runner.status_version == "41+1"
        kube.conflicts = 1  # someone else wrote meanwhile
        kube.current = _job_body("57", started(3))
        runner.status = runner.status.model_copy(update={"current_replicas": 3}) if runner.status else None
        await runner.reconcile()
        assert kube.versions[-2:] == ["41+1", "57"] and runner.status_version == "57+1"

    asyncio.run(rounds())


def _runner_with_a_crashed_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[JobRunner, RecordingKube, list[str]]:
    """A job of 4 workers, one of them crashed; the reasons of the Events it posts are collected."""
    import kopf

    posted: list[str] = []
    monkeypatch.setattr(kopf, "event", lambda *a, **kw: posted.append(kw["reason"]))
    crashed = worker(3, "n3", phase="Failed", exit_code=1)
    world = StaticWorld([worker(0, "n0"), worker(1, "n1"), worker(2, "n2"), crashed], _nodes(4))
    kube = RecordingKube()
    return JobRunner("ns", "train", world, kube, Settings(progress_seconds=0), StoreClient()), kube, posted


def test_a_conflicting_status_write_is_planned_again_and_its_events_are_posted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 26: a 409 used to drop the plan's status and Events after its drains were done, so a crashed
    worker's failure (and its WorkerFailed Warning) was lost: the drained pod is gone from the next plan.
    Now the plan is computed again on the newer job with the same observation and written on its version:
    the failure counts once, on top of what the other writer wrote, and the Events are posted."""
    from tests.operator.factories import started

    runner, kube, posted = _runner_with_a_crashed_worker(monkeypatch)
    runner.body = _job_body("41", started(4, failures=1))
    kube.conflicts = 1
    kube.current = _job_body("57", started(4, failures=2))  # another writer counted a failure meanwhile

    asyncio.run(runner.reconcile())
    assert kube.versions == ["41", "57"]
    assert [p["failures"] for p in kube.patches] == [3]  # 2 + this crash: not lost, not counted twice
    assert "WorkerFailed" in posted and "AvoidingNode" in posted, posted


def test_a_crash_another_leader_counted_and_drained_is_not_counted_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 37 item 5, a leader handoff: the new leader saw the crashed worker, drained it and counted it
    (failures 1 -> 2) while the old one, on the same observation, tried to drain it too. The old one's
    delete finds the pod gone, its status write conflicts, and re-planning on the same observation counted
    the crash a second time (3). A drain whose delete another writer won is theirs to count."""
    from tests.operator.factories import started

    runner, kube, posted = _runner_with_a_crashed_worker(monkeypatch)
    runner.body = _job_body("41", started(4, failures=1))
    kube.conflicts = 1
    kube.current = _job_body("57", started(4, failures=2))  # the new leader counted this very crash
    kube.gone = {"train-worker-3"}  # ... and its delete won

    asyncio.run(runner.reconcile())
    assert kube.versions == ["41", "57"]
    assert [p["failures"] for p in kube.patches] == [2]  # counted once, by the writer whose delete won
    assert "WorkerFailed" not in posted, posted  # the other writer said it


def test_a_crash_whose_drain_another_writer_won_is_not_counted_even_without_a_conflict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same handoff the other way round: this writer's status goes first, but the pod it counted was
    deleted by the other (whose write, conflicting, counts it then): only the delete's winner counts."""
    from tests.operator.factories import started

    runner, kube, _ = _runner_with_a_crashed_worker(monkeypatch)
    runner.body = _job_body("41", started(4, failures=1))
    kube.gone = {"train-worker-3"}

    asyncio.run(runner.reconcile())
    assert [p["failures"] for p in kube.patches] == [1]


def test_conflicts_in_a_row_fail_the_round_but_its_events_are_posted(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.operator.factories import started

    runner, kube, posted = _runner_with_a_crashed_worker(monkeypatch)
    runner.body = kube.current = _job_body("41", started(4))
    kube.conflicts = 10
    with pytest.raises(StatusConflict):
        asyncio.run(runner.reconcile())  # the loop's backoff retries, from the job as it is then
    assert len(kube.versions) == 3 and not kube.patches and runner.status is None
    assert "WorkerFailed" in posted, posted


def test_a_replacement_store_pod_with_the_old_name_is_told_the_bounds_again() -> None:
    # regression: the bounds told were keyed by the store pod's name, and a store pod force-deleted before
    # the operator saw it fail is gone from the API, so its replacement may get the same name (seen in a
    # clean-clone run of the store-loss demo); that fresh store never heard of a `kubectl scale` before it
    from etj_contract.replicas import Replicas
    from etj_trainer.service.store_http import ProgressState, make_http_server
    from tests.operator.factories import job, spec, store

    told: list[Replicas] = []
    ip = "127.0.0.1"
    httpd = make_http_server(ip, 0, ProgressState(), set_replicas=told.append)
    Thread(target=httpd.serve_forever, daemon=True).start()
    kube, http = KubeClient(client.ApiClient()), StoreClient()
    settings = Settings(progress_port=httpd.server_address[1])
    runner = JobRunner("ns", "train", StaticWorld([]), kube, settings, http)
    view = job(spec(replicas={"min": 1, "max": 4}))
    first = replace(store("od-0", name="train-rdzv-0"), uid="r1", ip=ip)
    replacement = replace(first, uid="r2", node="od-1")

    async def tell() -> None:
        await runner._tell_bounds(view, [first])
        await runner._tell_bounds(view, [first])  # the same store: told once
        await runner._tell_bounds(view, [replacement])

    _run_then_close(http, httpd, tell)
    assert told == [Replicas(1, 4), Replicas(1, 4)]


def test_a_drain_records_its_stages_and_they_add_up_to_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: the drain-latency histogram alone could not say where a slow drain spent its time (at 1,000
    nodes the operator's p50 was 1-2 s); the three stages split it at the round's start and the delete."""
    from datetime import timedelta

    from etj_operator.k8s.metrics import METRICS
    from etj_operator.timeutil import utcnow

    def total(name: str, labels: dict[str, str] | None = None) -> float:
        return METRICS.registry.get_sample_value(name, labels or {}) or 0.0

    def count(stage: str) -> float:
        return total("etj_operator_drain_stage_seconds_count", {"stage": stage})

    async def slow_delete(*_: Any, **__: Any) -> bool:
        await asyncio.sleep(0.05)  # the apiserver's part
        return True

    runner = _runner(StaticWorld([worker(0, "n0")]))
    monkeypatch.setattr(runner.kube, "delete_pod", slow_delete)
    before = {s: count(s) for s in ("queued", "plan", "api")}
    sums = {s: total("etj_operator_drain_stage_seconds_sum", {"stage": s}) for s in before}
    whole = total("etj_operator_interruption_to_drain_seconds_sum")
    runner.round_started = utcnow()
    seen = runner.round_started - timedelta(seconds=2)  # the signal waited 2 s for this round
    job: Any = type("Job", (), {"namespace": "ns"})()
    asyncio.run(runner._drain(job, "train-worker-0", worker(0, "n0"), seen, "SpotInterruption"))

    assert {s: count(s) - n for s, n in before.items()} == {"queued": 1, "plan": 1, "api": 1}
    spent = {s: total("etj_operator_drain_stage_seconds_sum", {"stage": s}) - v for s, v in sums.items()}
    assert 1.99 <= spent["queued"] <= 2.01 and spent["api"] >= 0.05, spent
    assert sum(spent.values()) == pytest.approx(
        total("etj_operator_interruption_to_drain_seconds_sum") - whole
    )

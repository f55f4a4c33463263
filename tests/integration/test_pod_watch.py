"""The operator's pod watch against the real apiserver (issue 29): every pod counts toward its node's
usage, only etj's pods enter the job index and wake a job loop, and deletes are seen."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from kubernetes import client

from etj_operator.constants import LABEL_JOB
from etj_operator.k8s.handlers import State
from etj_operator.k8s.pod_watch import PodWatch
from etj_operator.k8s.settings import Settings
from tests.integration.opbed import Bed

GPU = "nvidia.com/gpu"


class Kicks:
    """Stands in for JobRunners: records which job loops the watch woke."""

    def __init__(self) -> None:
        self.kicked: set[tuple[str, str]] = set()

    def kick(self, namespace: str, name: str) -> None:
        self.kicked.add((namespace, name))


def _pod(name: str, node: str, gpus: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    requests = {GPU: str(gpus)} if gpus else {"cpu": "10m"}
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeName": node,  # bound directly: the scheduler plays no part in what is tested
            "containers": [
                {"name": "c", "image": "x", "resources": {"requests": requests, "limits": requests}}
            ],
        },
    }


async def _until(what: str, predicate: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def test_foreign_pods_count_toward_usage_only_and_ours_enter_the_job_index(bed: Bed) -> None:
    node = bed.node("gpu", "on-demand", gpus=4)
    ns = bed.ns

    async def scenario() -> None:
        state, kicks = State(Settings()), Kicks()
        state.runners = kicks  # type: ignore[assignment]  # only kick() is used by the pod callbacks
        watch = PodWatch(
            bed.cluster.api_client(),
            None,
            asyncio.get_running_loop(),
            listed=partial(state.pods_relisted, ""),
            events=partial(state.pod_events, ""),
        )
        watch.start()
        try:
            await asyncio.wait_for(state.pods_listed.wait(), 30)
            create = partial(asyncio.to_thread, bed.core.create_namespaced_pod, ns)
            await create(_pod("web", node, 0))
            await create(_pod("inference", node, 1))
            await create(_pod("train-worker-0", node, 2, {LABEL_JOB: "train"}))
            await _until(
                "3 GPUs used on the node",
                lambda: state.node_usage().get(node, {}).get(GPU) == 3,
            )
            await _until("our worker in the job index", lambda: bool(state.job_pods(ns, "train")))
            assert state.node_usage()[node].get("cpu") == 10  # the foreign CPU pod counts too
            assert {p.name for p in state.job_pods(ns, "train")} == {"train-worker-0"}
            assert state.job_pods(ns, "web") == [] and state.job_pods(ns, "inference") == []
            # Foreign pods woke no job loop. The watch is cluster-wide and the cluster shared: other tests'
            # etj pods (ending as their tests clean up) rightly wake their own jobs, so look at this one's.
            assert {k for k in kicks.kicked if k[0] == ns} == {(ns, "train")}
            assert state.jobs_on_node(node) == {(ns, "train")}

            await asyncio.to_thread(bed.core.delete_namespaced_pod, "inference", ns, grace_period_seconds=0)
            await asyncio.to_thread(
                bed.core.delete_namespaced_pod, "train-worker-0", ns, grace_period_seconds=0
            )
            await _until("the deleted pods' GPUs freed", lambda: GPU not in state.node_usage().get(node, {}))
            await _until("the worker gone from the job index", lambda: not state.job_pods(ns, "train"))
        finally:
            watch.stop()

    try:
        asyncio.run(scenario())
    finally:
        for name in ("web", "inference", "train-worker-0"):
            with contextlib.suppress(client.ApiException):
                bed.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)

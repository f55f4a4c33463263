"""The operator's job loops, one per ElasticTrainingJob, keyed by (namespace, name): started when a job is
seen, replaced when a job of the same name comes back with a new uid, kicked by events, stopped on delete.
Each loop is a reconciler.JobRunner; they share one HTTP session to the jobs' stores."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

from etj_operator.k8s.client import KubeClient
from etj_operator.k8s.kueue_watch import KueueIndex
from etj_operator.k8s.metrics import METRICS
from etj_operator.k8s.reconciler import JobRunner
from etj_operator.k8s.settings import Settings, World
from etj_operator.k8s.store_client import StoreClient


class JobRunners:
    """The job runners, keyed by (namespace, name)."""

    def __init__(
        self, world: World, kube: KubeClient, settings: Settings, kueue: KueueIndex | None = None
    ) -> None:
        self.world, self.kube, self.settings = world, kube, settings
        self.kueue = kueue  # Kueue's objects (--kueue), else None
        self.store = StoreClient()  # one session for every job's store; closed by handlers.cleanup
        self.runners: dict[tuple[str, str], JobRunner] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def upsert(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        runner = self.runners.get(key)
        if runner is None or (runner.body or {}).get("metadata", {}).get("uid") != meta.get("uid"):
            if runner is not None:
                # A new job with the same name: start fresh (keep a reference so the task is not GC'd).
                task = asyncio.create_task(runner.stop())
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
            runner = JobRunner(
                key[0], key[1], self.world, self.kube, self.settings, self.store, kueue=self.kueue
            )
            self.runners[key] = runner
            runner.body = body
            runner.start()
        runner.body = body
        runner.kick.set()

    async def remove(self, namespace: str, name: str) -> None:
        runner = self.runners.pop((namespace, name), None)
        if runner is not None:
            await runner.stop()
            METRICS.forget_job(namespace, name)

    def kick(self, namespace: str, name: str) -> None:
        runner = self.runners.get((namespace, name))
        if runner is not None:
            runner.kick.set()

    def __iter__(self) -> Iterator[JobRunner]:
        return iter(list(self.runners.values()))

    async def stop_all(self) -> None:
        await asyncio.gather(*(r.stop() for r in list(self.runners.values())))
        self.runners.clear()

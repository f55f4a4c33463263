"""Kueue's objects the job loops read (docs/kueue.md), watched only when the operator runs with ``--kueue``:
the jobs' own Workloads (by job), ResourceFlavors and WorkloadPriorityClasses.

Registered as kopf indices: kopf holds every other handler until each index has listed its objects once, so
a restarted operator never plans from a view missing a job's Workloads (it would drain every worker as
seatless). Deletions come through the event handlers. A Workload event wakes its job's loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import kopf

from etj_operator.constants import LABEL_JOB
from etj_operator.decide.kueue.admission import KueueJob
from etj_operator.observe.workloads import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    FlavorInfo,
    WorkloadInfo,
    flavor_info,
    priority_value,
    workload_info,
)

# Wakes the loop of the job (namespace, name) given kopf's memo.
Kick = Callable[[Any, str, str], None]
_REGISTERED: set[int] = set()  # registries already given the handlers (an operator run twice in one process)


class KueueIndex:
    """The parsed Kueue objects, kept by the handlers below, read by the job loops."""

    def __init__(self) -> None:
        self.by_job: dict[tuple[str, str], dict[str, WorkloadInfo]] = {}
        self.flavors: dict[str, FlavorInfo] = {}
        self.priorities: dict[str, int] = {}

    def workloads(self, namespace: str, job: str) -> list[WorkloadInfo]:
        return list(self.by_job.get((namespace, job), {}).values())

    def job(self, labels: Mapping[str, str]) -> KueueJob | None:
        """What a job's labels say about Kueue; None for a job in no queue."""
        queue = labels.get(QUEUE_LABEL)
        if not queue:
            return None
        name = labels.get(PRIORITY_CLASS_LABEL)
        return KueueJob(queue, self.priorities.get(name) if name else 0, name)

    def put_workload(self, namespace: str, body: Mapping[str, Any]) -> tuple[str, str] | None:
        info = workload_info(body)
        if not info.job:
            return None
        self.by_job.setdefault((namespace, info.job), {})[info.name] = info
        return namespace, info.job

    def drop_workload(self, namespace: str, body: Mapping[str, Any]) -> tuple[str, str] | None:
        info = workload_info(body)
        book = self.by_job.get((namespace, info.job))
        if book is None:
            return None
        book.pop(info.name, None)
        if not book:
            del self.by_job[(namespace, info.job)]
        return namespace, info.job


def register(registry: kopf.OperatorRegistry, index_of: Callable[[Any], KueueIndex], kick: Kick) -> None:
    """Add the Kueue handlers to ``registry`` (before kopf starts). ``index_of``: the memo's KueueIndex;
    ``kick``: wakes a job's loop."""
    if id(registry) in _REGISTERED:
        return
    _REGISTERED.add(id(registry))
    ours = {LABEL_JOB: kopf.PRESENT}

    @kopf.index(KUEUE_GROUP, KUEUE_VERSION, "workloads", labels=ours, registry=registry)
    async def etj_workloads(namespace: str | None, body: kopf.Body, memo: Any, **_: Any) -> dict[str, bool]:
        key = index_of(memo).put_workload(namespace or "", body)
        if key is not None:
            kick(memo, *key)
        return {}

    @kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, "workloads", labels=ours, registry=registry)
    async def workload_event(
        type: str | None, namespace: str | None, body: kopf.Body, memo: Any, **_: Any
    ) -> None:
        if type == "DELETED" and (key := index_of(memo).drop_workload(namespace or "", body)) is not None:
            kick(memo, *key)

    @kopf.index(KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", registry=registry)
    async def etj_flavors(name: str, body: kopf.Body, memo: Any, **_: Any) -> dict[str, bool]:
        index_of(memo).flavors[name] = flavor_info(body)
        return {}

    @kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", registry=registry)
    async def flavor_event(type: str | None, name: str, memo: Any, **_: Any) -> None:
        if type == "DELETED":
            index_of(memo).flavors.pop(name, None)

    @kopf.index(KUEUE_GROUP, KUEUE_VERSION, "workloadpriorityclasses", registry=registry)
    async def etj_priorities(name: str, body: kopf.Body, memo: Any, **_: Any) -> dict[str, bool]:
        index_of(memo).priorities[name] = priority_value(body)
        return {}

    @kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, "workloadpriorityclasses", registry=registry)
    async def priority_event(type: str | None, name: str, memo: Any, **_: Any) -> None:
        if type == "DELETED":
            index_of(memo).priorities.pop(name, None)

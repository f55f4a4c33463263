"""A plan's Kueue Workloads applied (docs/kueue.md): deletes first (a preempted seat's quota goes back to
Kueue once its worker is gone), then creates. Both are idempotent: names are deterministic, so a Workload
created by an earlier round (the index may lag) answers 409, and one deleted already 404."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from etj_operator.decide.objects.workloads import workload
from etj_operator.decide.plan.planner import JobView, Plan
from etj_operator.k8s.client import KubeClient
from etj_operator.k8s.kueue_watch import KueueIndex

log = logging.getLogger(__name__)


def kueue_seen(index: KueueIndex | None, job: JobView) -> dict[str, Any]:
    """The Observed fields of a job under an operator run with --kueue: its Workloads (a job whose queue
    label was removed may still have some, to delete) and the ResourceFlavors."""
    if index is None:
        return {}
    return {"workloads": index.workloads(job.namespace, job.name), "flavors": index.flavors}


async def apply_workloads(kube: KubeClient, job: JobView, result: Plan) -> None:
    """Failures are logged, not raised: the job's status is still written this round, and the next round
    (level-based) asks again for what is still missing."""
    deletes = (kube.delete_workload(job.namespace, name) for name in result.delete_workloads)
    _log(job, "delete", await asyncio.gather(*deletes, return_exceptions=True))
    if job.kueue is None:
        return
    bodies = [
        workload(
            job.spec,
            job=job.name,
            namespace=job.namespace,
            uid=job.uid,
            name=want.name,
            count=want.count,
            priority=want.priority,
            queue=job.kueue.queue,
            capacity=want.capacity,
            pin=want.pin,
        )
        for want in result.create_workloads
    ]
    _log(
        job,
        "create",
        await asyncio.gather(*(kube.create_workload(b) for b in bodies), return_exceptions=True),
    )


def _log(job: JobView, verb: str, outcomes: list[Any]) -> None:
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            log.warning("%s/%s: could not %s a Workload: %s", job.namespace, job.name, verb, outcome)

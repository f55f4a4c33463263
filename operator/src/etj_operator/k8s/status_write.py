"""What follows a status write: the job's gauges and resize counter, and the plan's Events."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from etj_operator.decide.plan.planner import JobView, Plan
from etj_operator.decide.status.invalid_spec import invalid_spec_status
from etj_operator.k8s.client import KubeClient
from etj_operator.k8s.metrics import METRICS
from etj_operator.timeutil import utcnow

# Writes of one reconcile's status before giving up for this round: each conflict means another writer
# changed the job between our read and our write; three in a row is a fight the loop's backoff should calm.
STATUS_WRITE_ATTEMPTS = 3


def record_written(job: JobView, result: Plan) -> None:
    """The gauges of the status just written, and a resize it records (``job`` is what it was planned on)."""
    spec_max, current = result.status.desired_replicas or 0, result.status.current_replicas or 0
    METRICS.desired_workers.labels(job.namespace, job.name).set(spec_max)
    METRICS.current_workers.labels(job.namespace, job.name).set(current)
    before, after = job.status.resize_history, result.status.resize_history
    if current != (job.status.current_replicas or 0) and after and (not before or after[-1] != before[-1]):
        METRICS.resizes.labels(job.namespace, job.name, after[-1].reason).inc()


def post_events(body: Mapping[str, Any] | None, result: Plan) -> None:
    """The plan's Events on the job (``body``: the job object they refer to)."""
    if body is None:
        return
    for event in result.events:
        kopf.event(cast(kopf.Body, body), type=event.type, reason=event.reason, message=event.message[:1000])


async def report_invalid_spec(
    kube: KubeClient, body: Mapping[str, Any], message: str, said: str | None
) -> str | None:
    """Ready False, reason InvalidSpec, and one Warning Event per distinct error
    (decide/status/invalid_spec.py):
    the conditions are patched as they are, without the models that just refused the job. ``said``: the
    error this operator last said for the job (None: none); returns the one said now (the caller's memo)."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    found = invalid_spec_status(
        status.get("conditions") or [], message, meta.get("generation"), utcnow(), said=said
    )
    if found is None:
        return message  # said already
    conditions, event = found
    if await kube.patch_status(meta["namespace"], meta["name"], {"conditions": conditions}) is None:
        return said  # gone
    kopf.event(cast(kopf.Body, body), type=event.type, reason=event.reason, message=event.message)
    return message

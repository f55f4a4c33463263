"""What follows a status write: the job's gauges and resize counter, and the plan's Events."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from etj_operator.decide.planner import JobView, Plan
from etj_operator.k8s.metrics import METRICS

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

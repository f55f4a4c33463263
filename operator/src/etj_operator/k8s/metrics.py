"""Prometheus metrics of the operator (prometheus_client; kopf has none built in).

Names follow <namespace>_<subsystem>_<name>_<unit>; labels are job-level, never pod names, so the
series count stays bounded by the number of jobs.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

NS = "etj"
SUB = "operator"


class Metrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        """Long because: one declaration per metric, each with its help text and buckets."""
        self.registry = registry
        common: dict[str, Any] = {"namespace": NS, "subsystem": SUB, "registry": registry}
        self.desired_workers = Gauge(
            "desired_workers",
            "Workers the operator wants for the job.",
            ["namespace", "job"],
            **common,
        )
        self.current_workers = Gauge(
            "current_workers",
            "Worker pods of the job that are running.",
            ["namespace", "job"],
            **common,
        )
        self.resizes = Counter(
            "resizes",
            "Changes of the running worker count, by reason.",
            ["namespace", "job", "reason"],
            **common,
        )
        self.drains = Counter(
            "drains",
            "Pods drained (deleted gracefully) by the operator, by reason.",
            ["reason"],
            **common,
        )
        # Buckets around the 1 s goal: the interesting part is 50 ms .. 5 s.
        self.interruption_to_drain = Histogram(
            "interruption_to_drain_seconds",
            "From the operator first seeing an interruption signal to the drain request being accepted.",
            buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0),
            **common,
        )
        # The same path in three parts, to say where a slow drain spent its time: "queued" from the
        # signal first seen to the start of the job's reconcile round that drains (the job's loop busy
        # with an earlier round, or the event loop busy), "plan" from there to the delete being sent,
        # "api" the delete request itself (a thread, then the apiserver).
        self.drain_stage = Histogram(
            "drain_stage_seconds",
            "The interruption-to-drain path by stage: queued, plan, api.",
            ["stage"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0),
            **common,
        )
        self.reconcile_errors = Counter(
            "reconcile_errors",
            "Reconciles that raised (they are retried).",
            ["namespace", "job"],
            **common,
        )
        self.reconcile_seconds = Histogram(
            "reconcile_duration_seconds",
            "Wall time of one job reconcile (plan + apply + status).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            **common,
        )
        self.api_requests = Counter(
            "api_requests",
            "Kubernetes API requests made by the reconciler, by verb and resource.",
            ["verb", "resource"],
            **common,
        )

        self.watch_events = Counter(
            "watch_events",
            "Watch events handled, by resource (the operator's load at scale).",
            ["resource"],
            **common,
        )

    def forget_job(self, namespace: str, job: str) -> None:
        """Drop a deleted job's series so they do not linger at their last value."""
        for gauge in (self.desired_workers, self.current_workers):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, job)


METRICS = Metrics()


def serve(port: int) -> None:
    """Expose /metrics on the given port (0 disables)."""
    if port:
        start_http_server(port)


def observe_drain(
    reason: str, since: datetime | None, round_started: datetime, sent: datetime, accepted: datetime
) -> None:
    """One drain: its reason, and for an interruption (``since``: its signal) the time to the drain and
    its stages: queued (signal to this round), plan (round to the delete sent), api (sent to accepted)."""
    METRICS.drains.labels(reason).inc()
    if since is None:
        return
    METRICS.interruption_to_drain.observe(max(0.0, (accepted - since).total_seconds()))
    for stage, start, end in (
        ("queued", since, round_started),
        ("plan", round_started, sent),
        ("api", sent, accepted),
    ):
        METRICS.drain_stage.labels(stage).observe(max(0.0, (end - start).total_seconds()))

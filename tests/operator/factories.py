"""Plain-object builders for the operator's unit tests (no Kubernetes API, no mocks)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from etj_operator.api.models import CapacityType, ElasticTrainingJobSpec, ElasticTrainingJobStatus
from etj_operator.decide.plan.planner import JobView, Observed
from etj_operator.observe.nodes import NodeInfo
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason, Signal

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
LONG_AGO = NOW - timedelta(hours=1)
GPU = "nvidia.com/gpu"


def spec(**overrides: Any) -> ElasticTrainingJobSpec:
    """A job spec: 1 GPU per worker, 1..4 workers, spot then on-demand; overrides merge per section."""
    body: dict[str, Any] = {
        "trainer": {"image": "trainer:1", "resources": {"gpu": 1}},
        "replicas": {"min": 1, "max": 4},
        "training": {"globalBatchSize": 64, "microBatchSize": 8},
        "scaling": {"cooldownSeconds": 60, "scaleUpDelaySeconds": 30},
        "failurePolicy": {"maxFailures": 2},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    return ElasticTrainingJobSpec.model_validate(body)


def status(**fields: Any) -> ElasticTrainingJobStatus:
    return ElasticTrainingJobStatus.model_validate(fields)


def started(current: int, *, desired: int = 4, **fields: Any) -> ElasticTrainingJobStatus:
    """Status of a job that has been running for a while with ``current`` workers (its trainer has
    reported: the world has formed, so running-count changes are resizes)."""
    fields.setdefault("progress", {"step": 100})
    return status(
        phase="Running",
        currentReplicas=current,
        desiredReplicas=desired,
        startTime=LONG_AGO.isoformat(),
        **fields,
    )


def job(s: ElasticTrainingJobSpec | None = None, st: ElasticTrainingJobStatus | None = None) -> JobView:
    return JobView("train", "ns", "uid-1", 1, s or spec(), st or ElasticTrainingJobStatus())


def node(
    name: str,
    ctype: CapacityType = CapacityType.SPOT,
    gpus: int = 1,
    *,
    signal: Reason | None = None,
    ready_since: datetime = LONG_AGO,
    unschedulable: bool = False,
) -> NodeInfo:
    sig = Signal(signal, f"node {name}: {signal}", NOW - timedelta(seconds=1)) if signal else None
    return NodeInfo(
        name=name,
        pool=f"pool-{ctype.value}",
        capacity_type=ctype,
        allocatable={GPU: gpus},
        ready_since=ready_since,
        unschedulable=unschedulable,
        signal=sig,
    )


def worker(slot: int, node_name: str | None = None, phase: str = "Running", **kw: Any) -> PodInfo:
    return PodInfo(
        name=f"train-worker-{slot}",
        job="train",
        role="worker",
        slot=slot,
        uid=f"u{slot}",
        phase=phase if node_name or phase != "Running" else "Pending",
        node=node_name,
        created=LONG_AGO,
        scheduled_at=LONG_AGO if node_name else None,
        requests={GPU: 1},
        **kw,
    )


def store(
    node_name: str | None = "od-0", phase: str = "Running", name: str = "train-rdzv", **kw: Any
) -> PodInfo:
    return PodInfo(
        name=name,
        job="train",
        role="rendezvous",
        uid="r",
        phase=phase,
        node=node_name,
        created=LONG_AGO,
        scheduled_at=LONG_AGO,
        ip="10.0.0.9",
        **kw,
    )


def observe(nodes: list[NodeInfo], pods: list[PodInfo], *, now: datetime = NOW, **kw: Any) -> Observed:
    usage: dict[str, dict[str, int]] = {}
    for p in pods:
        if p.node and p.active:
            for res, n in p.requests.items():
                usage.setdefault(p.node, {})[res] = usage.setdefault(p.node, {}).get(res, 0) + n
    return Observed(nodes={n.name: n for n in nodes}, pods=pods, now=now, node_usage=usage, **kw)


def cluster(spot: int = 4, on_demand: int = 1, **kw: Any) -> list[NodeInfo]:
    """``spot`` one-GPU spot nodes spot-0.. and ``on_demand`` GPU-less on-demand nodes od-0.. (for stores)."""
    return [node(f"spot-{i}", **kw) for i in range(spot)] + [
        node(f"od-{i}", CapacityType.ON_DEMAND, gpus=0) for i in range(on_demand)
    ]

"""Free room for more workers on the nodes a job may use: one cheap pass over the node index (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from etj_operator.api.models import CapacityType, ElasticTrainingJobSpec
from etj_operator.decide.objects.placement import capacity_tolerations
from etj_operator.decide.plan.model import Observed
from etj_operator.observe.nodes import NodeInfo, fits
from etj_operator.quantity import MILLI_RESOURCES, parse_milli


@dataclass(frozen=True)
class FreeCapacity:
    """Room for more workers on eligible nodes, and how much of it is older than the scale-up delay."""

    total: int = 0
    settled: int = 0
    young_since: datetime | None = None  # earliest Ready time among nodes still inside the delay


def free_capacity(
    spec: ElasticTrainingJobSpec,
    obs: Observed,
    types: frozenset[CapacityType] | None = None,
    avoid: frozenset[str] = frozenset(),
) -> FreeCapacity:
    """One pass over the nodes (this runs on every reconcile of every job, so it stays cheap).

    ``types``: count only nodes of these capacity types (the deadline policy asks about spot alone).
    ``avoid``: nodes new workers must not use (status.avoidedNodes): no room there for this job.
    """
    res = spec.trainer.resources
    allowed = set(spec.placement.capacity_types) & (types if types is not None else set(CapacityType))
    selector = spec.placement.node_selector
    tolerations = [
        *capacity_tolerations(spec.placement.capacity_types),
        *(t.to_dict() for t in spec.placement.tolerations),
    ]
    cutoff = obs.now - timedelta(seconds=spec.scaling.scale_up_delay_seconds)
    demand = worker_demand(spec)
    total = settled = 0
    young: datetime | None = None
    for node in obs.nodes.values():
        # Cheap rejections first; fits() re-checks them, the taint matching is the expensive part.
        if node.capacity_type not in allowed or not node.schedulable or node.name in avoid:
            continue
        if res.gpu and node.gpus(res.gpu_resource_name) < res.gpu:
            continue
        if not fits(node, capacity_types=allowed, node_selector=selector, tolerations=tolerations):
            continue
        room = _room(node, demand, obs.node_usage.get(node.name, {}), spec.replicas.max)
        if not room:
            continue
        total += room
        if node.ready_since is not None and node.ready_since > cutoff:
            young = node.ready_since if young is None else min(young, node.ready_since)
        else:
            settled += room
    return FreeCapacity(total, settled, young)


def worker_demand(spec: ElasticTrainingJobSpec) -> dict[str, int]:
    """What one worker pod requests, in NodeInfo.allocatable's units (GPUs whole, cpu/memory in milli)."""
    res = spec.trainer.resources
    demand = {res.gpu_resource_name: res.gpu} if res.gpu else {}
    for key, raw in (("cpu", res.cpu), ("memory", res.memory)):
        amount = parse_milli(raw) if raw is not None else None
        if amount:
            demand[key] = amount
    return demand


def _room(node: NodeInfo, demand: Mapping[str, int], used: Mapping[str, int], most: int) -> int:
    """How many more workers fit on ``node`` by every resource a worker requests (at most ``most``).

    A node that does not report cpu or memory at all is not limited by it (it cannot be judged); one that
    lacks a requested extended resource has no room.
    """
    room = most
    for key, need in demand.items():
        if key not in node.allocatable and key in MILLI_RESOURCES:
            continue
        free = max(0, node.allocatable.get(key, 0) - used.get(key, 0))
        room = min(room, free // need)
    return room


class LazyCapacity:
    """free_capacity, computed at most once and only when a decision needs it: not on the drain path,
    where latency matters and all jobs on lost nodes reconcile at once."""

    def __init__(
        self, spec: ElasticTrainingJobSpec, obs: Observed, avoid: frozenset[str] = frozenset()
    ) -> None:
        self.spec, self.obs = spec, obs
        self.value: FreeCapacity | None = None
        # The nodes new workers avoid (the planner's avoid_failed_nodes step): no room there for this job.
        self.avoid = avoid

    def get(self) -> FreeCapacity:
        if self.value is None:
            self.value = free_capacity(self.spec, self.obs, avoid=self.avoid)
        return self.value

"""The planner's deadline step (pure): which on-demand workers to add or release, from the policy's number.

With ``spec.deadline`` the job's ordinary workers are pinned to spot and the on-demand ones it needs to
stay on schedule are separate pods pinned to on-demand capacity (decide/objects/placement.py ``pinned_terms``:
Karpenter's and EKS's labels), so a pending one is what makes the autoscaler start an on-demand node.
A pending on-demand pod counts as on-demand capacity: the autoscaler provisions it. Release order:
on-demand workers first (pending ones, then the highest slots), each an in-place leave (a graceful drain).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from etj_operator.api.models import (
    CapacityType,
    ElasticTrainingJobSpec,
    ElasticTrainingJobStatus,
    ScheduleStatus,
    WorkersByCapacity,
)
from etj_operator.decide.deadline.policy import DeadlineDecision
from etj_operator.decide.deadline.schedule import DeadlineCosts, Standing, schedule
from etj_operator.observe.nodes import NodeInfo
from etj_operator.observe.pods import PodInfo


@dataclass(frozen=True)
class CapacityPlan:
    add_on_demand: int = 0  # new worker pods pinned to on-demand
    release: list[PodInfo] = field(default_factory=list)  # on-demand workers to drain (leave first)
    give_way: list[PodInfo] = field(default_factory=list)  # pending spot pods that make room for them
    pin_spot: bool = False  # ordinary new workers are pinned to spot (the job has a deadline policy)
    schedule: ScheduleStatus | None = None
    workers: WorkersByCapacity = field(default_factory=WorkersByCapacity)
    decision: DeadlineDecision | None = None


def capacity_of(pod: PodInfo, nodes: Mapping[str, NodeInfo]) -> CapacityType | None:
    """A worker's capacity type: its node's if it is bound, else the one it is pinned to (None: unknown)."""
    node = nodes.get(pod.node) if pod.node else None
    if node is not None:
        return node.capacity_type
    return CapacityType(pod.pinned) if pod.pinned in {c.value for c in CapacityType} else None


def manages_on_demand(spec: ElasticTrainingJobSpec) -> bool:
    """The policy adds on-demand workers only for a deadline with a non-zero cap and both types allowed."""
    d = spec.deadline
    allowed = set(spec.placement.capacity_types)
    return (
        d is not None
        and d.max_on_demand_workers != 0
        and {CapacityType.SPOT, CapacityType.ON_DEMAND} <= allowed
    )


def _release_order(pods: Sequence[PodInfo]) -> list[PodInfo]:
    # Pending first (they train nothing yet), then the highest slots (the lowest ranks stay).
    return sorted(pods, key=lambda p: (p.running, -(p.slot or 0)))


def plan_capacity(
    spec: ElasticTrainingJobSpec,
    status: ElasticTrainingJobStatus,
    survivors: Sequence[PodInfo],
    nodes: Mapping[str, NodeInfo],
    spot_free: int,
    costs: DeadlineCosts,
    now: datetime,
) -> CapacityPlan:
    """What the deadline asks of the job's worker pods this round (``survivors``: active, not drained)."""
    kinds = [(p, capacity_of(p, nodes)) for p in survivors]
    running_spot = [p for p, c in kinds if c == CapacityType.SPOT and p.running]
    on_demand = [p for p, c in kinds if c == CapacityType.ON_DEMAND and (p.running or p.pinned)]
    workers = WorkersByCapacity(spot=len(running_spot), on_demand=sum(1 for p in on_demand if p.running))
    standing = Standing(len(running_spot), spot_free, len(on_demand), workers.on_demand)
    sched, choice = schedule(spec, status, standing, costs, now)
    managed = manages_on_demand(spec)
    base = CapacityPlan(pin_spot=managed, schedule=sched, workers=workers, decision=choice)
    if not managed or choice is None:
        return base
    if choice.on_demand < len(on_demand):
        release = _release_order(on_demand)[: len(on_demand) - choice.on_demand]
        return CapacityPlan(
            0, release=release, pin_spot=True, schedule=sched, workers=workers, decision=choice
        )
    want = choice.on_demand - len(on_demand)
    if want <= 0:
        return base
    room = spec.replicas.max - len(survivors)
    # Spot pods still waiting for a node train nothing: they give way first (the autoscaler found no spot).
    waiting_spot = [p for p, c in kinds if p.pinned == CapacityType.SPOT.value and not p.node]
    # A running spot worker never makes room: it trains now, and a new on-demand one would only train
    # after its node's start-up (the safety margin counts that start-up).
    give_way = _release_order(waiting_spot)[: max(0, want - room)]
    add = min(want, room + len(give_way))
    return CapacityPlan(
        add, give_way=give_way, pin_spot=True, schedule=sched, workers=workers, decision=choice
    )

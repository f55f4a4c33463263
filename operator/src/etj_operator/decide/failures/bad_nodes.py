"""Failures in a window, and nodes new workers avoid after a crash there (pure).

Both live in status (``failureTimes``, ``avoidedNodes``), not in the operator's memory: a restarted operator
(or the other replica taking the Lease) makes the same decisions from the job alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from etj_operator.api.models import FailurePolicy
from etj_operator.api.status import MAX_AVOIDED_NODES, MAX_FAILURE_TIMES, AvoidedNode

AVOIDING_NODE = "AvoidingNode"  # the Warning Event's reason when a node is added to status.avoidedNodes


def windowed(policy: FailurePolicy) -> bool:
    """Whether the budget counts failures within failureWindowSeconds only.

    The stored times are bounded: with a budget they cannot hold (maxFailures >= MAX_FAILURE_TIMES) the
    window could never reach it, so every failure counts, as before windows existed."""
    return policy.failure_window_seconds > 0 and policy.max_failures < MAX_FAILURE_TIMES


def record_failures(
    times: Sequence[datetime], new: int, now: datetime, policy: FailurePolicy
) -> list[datetime]:
    """The failure times with ``new`` failures at ``now``: those outside the window dropped, bounded."""
    kept = [*times, *([now] * new)]
    if policy.failure_window_seconds > 0:
        start = now - timedelta(seconds=policy.failure_window_seconds)
        kept = [t for t in kept if t > start]
    return kept[-MAX_FAILURE_TIMES:]


def budget_failures(times: Sequence[datetime], lifetime: int, policy: FailurePolicy) -> int:
    """The failures counted against maxFailures: those in the window (``times`` is pruned to it), or all."""
    return len(times) if windowed(policy) else lifetime


def avoid_nodes(
    prev: Sequence[AvoidedNode],
    crashed: Sequence[tuple[str, str]],
    now: datetime,
    seconds: int,
    cap: int,
) -> list[AvoidedNode]:
    """The avoided nodes: unexpired entries plus one per (node, reason) in ``crashed``, refreshed if listed.

    Capped at ``cap`` (the job's replicas.max): the planner cannot know whether the pools have room elsewhere,
    so it never avoids more nodes than the job has workers; the oldest entry is dropped first.
    """
    if seconds <= 0:
        return []
    until = now + timedelta(seconds=seconds)
    fresh = {node for node, _ in crashed}
    kept = [a for a in prev if a.until > now and a.node not in fresh]
    kept += [AvoidedNode(node=node, until=until, reason=why[:256]) for node, why in dict(crashed).items()]
    kept.sort(key=lambda a: a.until)
    return kept[-min(max(cap, 1), MAX_AVOIDED_NODES) :]

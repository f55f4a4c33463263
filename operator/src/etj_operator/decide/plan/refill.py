"""How many workers a job adds now: at once below min and for crashed workers, else after the cooldown
and once new capacity has lasted scaleUpDelaySeconds (the planner's refill step, plan/create_steps.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from etj_operator.api.models import ElasticTrainingJobSpec, ElasticTrainingJobStatus
from etj_operator.decide.plan.capacity import LazyCapacity
from etj_operator.decide.types import Drain
from etj_operator.observe.signals import Reason

# Drains whose worker is replaced at once, not a resize: a crash (within the budget) and a Pending worker
# recreated with the affinity it should have now.
REPLACED_AT_ONCE = frozenset({Reason.WORKER_FAILED, Reason.AVOIDANCE_EXPIRED})


def _last_resize(status: ElasticTrainingJobStatus) -> datetime | None:
    return max((e.time for e in status.resize_history), default=None)


@dataclass(frozen=True)
class Adding:
    count: int  # new worker pods to create now
    wake_in: float | None = None  # seconds until a timer (cooldown, scale-up delay) allows more


def workers_to_add(
    spec: ElasticTrainingJobSpec,
    prev: ElasticTrainingJobStatus,
    drains: Sequence[Drain],
    capacity_now: LazyCapacity,
    now: datetime,
    survivors: int,
) -> Adding:
    """How many new worker pods to create now, and when a timer will allow more. ``drains``: this
    reconcile's so far; ``survivors``: the job's workers that stay, the deadline policy's new on-demand
    ones included."""
    missing = spec.replicas.max - survivors
    if missing <= 0:
        return Adding(0)
    # Below min the job cannot train at all: waiting gains nothing, so refill at once. A crashed worker
    # (within the failure budget) is restarted at once too: that restores the size, it is no new resize.
    restarts = sum(1 for d in drains if d.reason in REPLACED_AT_ONCE and d.role == "worker")
    urgent = min(missing, max(0, spec.replicas.min - survivors) + restarts)
    rest = missing - urgent
    if rest == 0:
        return Adding(urgent)
    last = _last_resize(prev)
    if any(d.reason not in REPLACED_AT_ONCE for d in drains):
        last = now  # a resize is happening right now
    if prev.start_time is None and not prev.resize_history:
        return Adding(missing)  # first start: ask for everything, pending pods drive the autoscaler
    cooldown = timedelta(seconds=spec.scaling.cooldown_seconds)
    if last is not None and now < last + cooldown:
        return Adding(urgent, (last + cooldown - now).total_seconds())
    delay = timedelta(seconds=spec.scaling.scale_up_delay_seconds)
    # Capacity that just appeared must survive scaleUpDelaySeconds first (spot flapping); when there is
    # no free capacity at all, pending pods are exactly what asks the autoscaler for nodes.
    capacity = capacity_now.get() if delay else None
    if capacity is not None and capacity.young_since is not None and capacity.settled < rest:
        return Adding(urgent + capacity.settled, (capacity.young_since + delay - now).total_seconds())
    return Adding(missing)

"""The KueueAdmitted condition and its Events (docs/kueue.md): pure, from the job's Workloads."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum

from etj_operator.api.models import Condition, ConditionType, set_condition
from etj_operator.decide.kueue.admission import KueueJob, Seats, on_demand_seats_of
from etj_operator.decide.types import KubeEvent


class KueueReason(StrEnum):
    ADMITTED = "Admitted"
    PENDING = "Pending"  # queued: Kueue's own reason for a Workload that waits for quota
    EVICTED = "Evicted"
    PRIORITY_CLASS_NOT_FOUND = "PriorityClassNotFound"
    RELEASED = "Released"  # finished, failed or suspended: the job holds no quota
    QUOTA_EXHAUSTED = "QuotaExhausted"  # OnDemandQuota: an on-demand seat waits for quota Kueue has not
    QUOTA_AVAILABLE = "QuotaAvailable"


def admitted_verdict(kueue: KueueJob, seats: Seats, stopped_as: str | None) -> tuple[bool, str, str]:
    """(status, reason, message) of KueueAdmitted. ``stopped_as``: the phase of a job that holds no quota
    (finished, failed, suspended); None while it runs or waits."""
    base = seats.base
    if stopped_as is not None:
        return False, KueueReason.RELEASED, f"the job is {stopped_as}: its Workloads are released"
    if kueue.priority is None:
        why = f"WorkloadPriorityClass {kueue.priority_class} not found: no Workload is queued until it exists"
        return False, KueueReason.PRIORITY_CLASS_NOT_FOUND, why
    if base is not None and base.evicted is not None:
        return False, KueueReason.EVICTED, f"Kueue evicted Workload {base.name}: {base.evicted}"
    if base is None or not seats.base_admitted:
        name = base.name if base is not None else "the base Workload"
        waits = base.pending if base is not None and base.pending else "waiting for Kueue to admit it"
        return False, KueueReason.PENDING, f"{name} in queue {kueue.queue}: {waits}"
    extras = [w for _, w in seats.extras]
    admitted = sum(1 for _, w in seats.extras if seats.live(w.name) is not None)
    where = ", ".join(base.flavors) or "no flavor"
    message = f"{base.name} admitted by ClusterQueue {base.cluster_queue} on {where}"
    return True, KueueReason.ADMITTED, f"{message}; {admitted} of {len(extras)} extra seats admitted"


def with_kueue_condition(
    conditions: Sequence[Condition], verdict: tuple[bool, str, str], *, generation: int, now: datetime
) -> tuple[list[Condition], list[KubeEvent]]:
    """The conditions with KueueAdmitted set, and an Event when it turns: admitted, or evicted (once, on the
    transition, with Kueue's reason)."""
    status, reason, message = verdict
    before = next((c for c in conditions if c.type == ConditionType.KUEUE_ADMITTED), None)
    type_ = ConditionType.KUEUE_ADMITTED
    conds = set_condition(list(conditions), type_, status, reason, message, generation=generation, now=now)
    events: list[KubeEvent] = []
    was = (before.status == "True", before.reason) if before is not None else (False, None)
    if reason == KueueReason.EVICTED and was[1] != KueueReason.EVICTED:
        events.append(KubeEvent("Warning", "KueueEvicted", message))
    elif status and not was[0]:
        events.append(KubeEvent("Normal", "KueueAdmitted", message))
    return conds, events


def on_demand_quota_verdict(kueue: KueueJob, seats: Seats) -> tuple[bool, str, str]:
    """(status, reason, message) of OnDemandQuota: False while one of the deadline policy's on-demand seats
    waits with Kueue's QuotaReserved=False (no quota left on any on-demand flavor of the queue), naming the
    LocalQueue and the ClusterQueue behind it (the base's admission says which)."""
    mine = on_demand_seats_of(seats)
    base = seats.base
    cq = base.cluster_queue if base is not None and base.cluster_queue else "(not admitted yet)"
    where = f"LocalQueue {kueue.queue} (ClusterQueue {cq})"
    waiting = [w for w in mine if not w.admitted and w.pending]
    if waiting:
        names = ", ".join(w.name for w in waiting)
        why = f"{len(waiting)} on-demand seat(s) the deadline policy asks for wait for quota in {where}"
        return False, KueueReason.QUOTA_EXHAUSTED, f"{why}: {names}: {waiting[0].pending}"
    admitted = sum(1 for w in mine if w.admitted)
    return True, KueueReason.QUOTA_AVAILABLE, f"{admitted} of {len(mine)} on-demand seats admitted in {where}"


def with_quota_condition(
    conditions: Sequence[Condition], verdict: tuple[bool, str, str], *, generation: int, now: datetime
) -> tuple[list[Condition], list[KubeEvent]]:
    """The conditions with OnDemandQuota set, and a Warning Event when the quota runs out (once, on the
    transition)."""
    status, reason, message = verdict
    type_ = ConditionType.ON_DEMAND_QUOTA
    before = next((c for c in conditions if c.type == type_), None)
    conds = set_condition(list(conditions), type_, status, reason, message, generation=generation, now=now)
    turned = before is None or before.reason != reason
    events = [KubeEvent("Warning", str(reason), message)] if not status and turned else []
    return conds, events

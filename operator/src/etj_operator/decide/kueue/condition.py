"""The KueueAdmitted condition and its Events (docs/kueue.md): pure, from the job's Workloads."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum

from etj_operator.api.models import Condition, ConditionType, set_condition
from etj_operator.decide.kueue.admission import KueueJob, Seats
from etj_operator.decide.types import KubeEvent


class KueueReason(StrEnum):
    ADMITTED = "Admitted"
    PENDING = "Pending"  # queued: Kueue's own reason for a Workload that waits for quota
    EVICTED = "Evicted"
    PRIORITY_CLASS_NOT_FOUND = "PriorityClassNotFound"
    RELEASED = "Released"  # finished, failed or suspended: the job holds no quota


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

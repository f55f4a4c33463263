"""Slots and store indices the planner hands out (pure): names no pod holds now."""

from __future__ import annotations

from collections.abc import Sequence

from etj_operator.decide.objects.names import rendezvous_index
from etj_operator.observe.pods import PodInfo


def next_rendezvous_index(job: str, rdzv: Sequence[PodInfo]) -> int:
    """One past every store pod still known (terminating ones included): a name no pod has now. A pod
    already gone from the API (force-deleted before we saw it fail) may see its name reused, so nothing
    keys on a store pod's name (the reconciler's bounds told are keyed by uid)."""
    indices = [i for p in rdzv if (i := rendezvous_index(job, p.name)) is not None]
    return max(indices, default=-1) + 1


def free_slots(pods: Sequence[PodInfo], count: int, also_taken: Sequence[int] = ()) -> list[int]:
    """The ``count`` lowest slots no pod (and nothing in ``also_taken``) holds."""
    taken = {p.slot for p in pods if p.slot is not None} | set(also_taken)
    out: list[int] = []
    slot = 0
    while len(out) < count:
        if slot not in taken:
            out.append(slot)
        slot += 1
    return out

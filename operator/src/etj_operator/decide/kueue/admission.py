"""What Kueue's admission of a job's Workloads means for its workers (docs/kueue.md): pure.

A job in a Kueue queue has a base Workload (``replicas.min`` workers) and one Workload per extra worker
("seats", decide/objects/workloads.py). From the Workloads observed this module says whether the job may
run at all (its base admitted), which seats are admitted and still short of a worker, on which flavor's
nodes, which workers lost their seat, and which Workloads to create or delete.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from etj_operator.decide.objects.placement import SeatPlacement
from etj_operator.decide.objects.workloads import BASE_SEAT, extra_index, extra_seat, workload_name
from etj_operator.observe.pods import TERMINAL_PHASES, PodInfo
from etj_operator.observe.signals import Reason
from etj_operator.observe.workloads import FlavorInfo, WorkloadInfo


@dataclass(frozen=True)
class KueueJob:
    """What the job says about Kueue: its queue, and the priority of its base Workload."""

    queue: str  # the kueue.x-k8s.io/queue-name label: the LocalQueue its Workloads go to
    priority: int | None = 0  # its WorkloadPriorityClass's value (0: none named); None: named, not found
    priority_class: str | None = None  # the kueue.x-k8s.io/priority-class label


@dataclass(frozen=True)
class Seats:
    """A job's Workloads: the base, and its extra seats by index."""

    base: WorkloadInfo | None
    extras: tuple[tuple[int, WorkloadInfo], ...] = ()
    names: frozenset[str] = frozenset()  # every Workload of the job, deleting ones included

    @classmethod
    def of(cls, job: str, workloads: Sequence[WorkloadInfo]) -> Seats:
        base = next((w for w in workloads if w.name == workload_name(job, BASE_SEAT)), None)
        extras = sorted((i, w) for w in workloads if (i := extra_index(job, w.name)) is not None)
        return cls(base, tuple(extras), frozenset(w.name for w in workloads))

    @property
    def base_admitted(self) -> bool:
        """The job may run: its base Workload is admitted and not evicted (nor being deleted)."""
        base = self.base
        return base is not None and base.admitted and base.evicted is None and not base.deleting

    @property
    def base_evicted(self) -> bool:
        return self.base is not None and self.base.evicted is not None

    def live(self, seat: str) -> WorkloadInfo | None:
        """The admitted, not evicted Workload named ``seat`` (a pod's etj.dev/kueue-seat), if any."""
        if self.base is not None and self.base.name == seat:
            return self.base if self.base_admitted else None
        found = next((w for _, w in self.extras if w.name == seat), None)
        if found is None or not found.admitted or found.evicted is not None or found.deleting:
            return None
        return found


def holding(pods: Sequence[PodInfo]) -> list[PodInfo]:
    """Pods that still hold their node's resources: not finished (terminating ones included). Their
    Workload's quota is given back only once none is left, so the preemptor finds the GPU free."""
    return [p for p in pods if p.phase not in TERMINAL_PHASES]


def placement(workload: WorkloadInfo, flavors: Mapping[str, FlavorInfo]) -> SeatPlacement:
    """Where a seat's workers run: the node labels and tolerations of the flavors it was admitted on. A
    flavor the index does not know (deleted since) adds nothing: the job's own placement still holds."""
    selector: dict[str, str] = {}
    tolerations: list[Mapping[str, object]] = []
    for name in workload.flavors:
        flavor = flavors.get(name)
        if flavor is not None:
            selector.update(flavor.node_labels)
            tolerations += [t for t in flavor.tolerations if t not in tolerations]
    return SeatPlacement(workload.name, selector, tuple(tolerations))


def open_seats(
    seats: Seats, survivors: Sequence[PodInfo], flavors: Mapping[str, FlavorInfo]
) -> list[SeatPlacement]:
    """One entry per worker to create now: admitted seats with fewer workers than they were admitted
    for (the base's ``count``, an extra's one). Only while the base is admitted: extras never run alone."""
    if not seats.base_admitted or seats.base is None:
        return []
    have: dict[str, int] = {}
    for pod in survivors:
        if pod.seat is not None:
            have[pod.seat] = have.get(pod.seat, 0) + 1
    out: list[SeatPlacement] = []
    for workload in (seats.base, *(w for _, w in seats.extras)):
        if seats.live(workload.name) is not None:
            out += [placement(workload, flavors)] * max(0, workload.count - have.get(workload.name, 0))
    return out


def unseated(seats: Seats, survivors: Sequence[PodInfo]) -> list[tuple[PodInfo, str]]:
    """Workers whose seat Kueue took back or that have none admitted, with why: each is drained, the way a
    spot interruption drains one (the job shrinks in place). The base's own eviction stops the whole job
    instead (``gate``); this is about extra seats."""
    out: list[tuple[PodInfo, str]] = []
    for pod in survivors:
        if pod.seat is not None and seats.live(pod.seat) is not None:
            continue
        extra = next((w for _, w in seats.extras if w.name == pod.seat), None)
        if extra is not None and extra.evicted is not None:
            why = f"Kueue evicted its Workload {extra.name} ({extra.evicted})"
        elif pod.seat is None:
            why = "it runs under no Kueue Workload"
        else:
            why = f"its Workload {pod.seat} is not admitted"
        out.append((pod, f"worker {pod.name} leaves: {why}"))
    return out


@dataclass(frozen=True)
class WorkloadWant:
    """A Workload to create: its name, pods and priority."""

    name: str
    count: int
    priority: int
    base: bool


@dataclass(frozen=True)
class WorkloadChanges:
    create: tuple[WorkloadWant, ...] = ()
    delete: tuple[str, ...] = ()


def workload_changes(
    job: str,
    kueue: KueueJob,
    seats: Seats,
    workers: Sequence[PodInfo],
    *,
    replicas: tuple[int, int],
    released: bool,
) -> WorkloadChanges:
    """Which Workloads to create and delete now. ``workers``: every worker pod of the job, terminating ones
    included; ``replicas``: (min, max); ``released``: the job holds no quota now (finished, failed,
    suspended, or its base evicted): every Workload goes once no worker holds its node any more.

    Otherwise the base is queued when there is none (and no worker is left of an earlier admission), and
    once it is admitted one extra seat per worker up to max (never before: a job whose extras were admitted
    and whose base waits would hold quota it cannot use, the gang deadlock). An evicted extra is deleted
    once its worker is gone, and queued again as a new seat under the lowest free index.
    """
    held = holding(workers)
    all_names = sorted(seats.names)
    if released:
        return WorkloadChanges(delete=tuple(all_names) if not held else ())
    low, high = replicas
    if seats.base is None:
        if held or kueue.priority is None:
            return WorkloadChanges()
        base = WorkloadWant(workload_name(job, BASE_SEAT), low, kueue.priority, True)
        return WorkloadChanges(create=(base,))
    seated = {p.seat for p in held}
    delete = [
        w.name for _, w in seats.extras if w.evicted is not None and w.name not in seated and not w.deleting
    ]
    kept = [w for _, w in seats.extras if not w.deleting and w.name not in delete]
    # Fewer extras wanted (replicas.max lowered): the pending ones go first, then those without a worker.
    surplus = sorted(kept, key=lambda w: (w.admitted, w.name in seated))[: max(0, len(kept) - (high - low))]
    delete += [w.name for w in surplus if w.name not in seated]
    if not seats.base_admitted or kueue.priority is None:
        return WorkloadChanges(delete=tuple(delete))
    missing = max(0, high - low - len(kept))
    taken = seats.names
    free = (i for i in range(len(taken) + missing + 1) if workload_name(job, extra_seat(i)) not in taken)
    create = tuple(
        WorkloadWant(workload_name(job, extra_seat(next(free))), 1, kueue.priority - 1, False)
        for _ in range(missing)
    )
    return WorkloadChanges(create=create, delete=tuple(delete))


def gate(seats: Seats) -> tuple[Reason, str] | None:
    """Why the job keeps no worker (and no store) now, if it must not run: its base Workload was evicted,
    or is not admitted (yet). None: the base is admitted."""
    base = seats.base
    if base is not None and base.evicted is not None:
        return Reason.KUEUE_EVICTED, f"Kueue evicted the job's Workload {base.name} ({base.evicted})"
    if not seats.base_admitted:
        name = base.name if base is not None else "(being created)"
        return Reason.KUEUE_QUEUED, f"the job's Workload {name} is not admitted by Kueue"
    return None

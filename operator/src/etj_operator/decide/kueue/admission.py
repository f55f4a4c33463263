"""What Kueue's admission of a job's Workloads means for its workers (docs/kueue.md): pure.

A job in a Kueue queue has a base Workload (``replicas.min`` workers) and one Workload per extra worker
("seats", decide/objects/workloads.py). From the Workloads observed this module says whether the job may
run at all (its base admitted), which seats are admitted and still short of a worker, on which flavor's
nodes, which workers lost their seat, and which Workloads to create or delete.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from etj_operator.api.models import CapacityType
from etj_operator.constants import LABEL_CAPACITY_OVERRIDE
from etj_operator.decide.objects.placement import SeatPlacement
from etj_operator.decide.objects.workloads import BASE_SEAT, extra_index, extra_seat, workload_name
from etj_operator.observe.nodes import CAPACITY_LABELS, DEFAULT_RULES
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
    seats: Seats,
    survivors: Sequence[PodInfo],
    flavors: Mapping[str, FlavorInfo],
    leaving: frozenset[str] = frozenset(),
) -> list[SeatPlacement]:
    """One entry per worker to create now: admitted seats with fewer workers than they were admitted
    for (the base's ``count``, an extra's one). Only while the base is admitted: extras never run alone.
    ``leaving``: seats given up this round (on_demand_seats), which get no new worker."""
    if not seats.base_admitted or seats.base is None:
        return []
    have: dict[str, int] = {}
    for pod in survivors:
        if pod.seat is not None:
            have[pod.seat] = have.get(pod.seat, 0) + 1
    out: list[SeatPlacement] = []
    for workload in (seats.base, *(w for _, w in seats.extras)):
        if seats.live(workload.name) is not None and workload.name not in leaving:
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
    """A Workload to create: its name, pods and priority; a pinned seat's capacity type and the node
    labels that pin it (decide/objects/workloads.py)."""

    name: str
    count: int
    priority: int
    base: bool
    capacity: CapacityType | None = None
    pin: Mapping[str, str] = field(default_factory=dict)


CAPACITY_KEYS = frozenset({LABEL_CAPACITY_OVERRIDE, *(key for key, _, _ in CAPACITY_LABELS)})


def capacity_pin(flavors: Mapping[str, FlavorInfo], capacity: CapacityType) -> dict[str, str]:
    """The node labels that keep Kueue on flavors of one capacity type: the capacity labels of the first
    (by name) flavor whose nodeLabels are of that type; Karpenter's label when no flavor is."""
    for name in sorted(flavors):
        labels = flavors[name].node_labels
        pin = {k: v for k, v in labels.items() if k in CAPACITY_KEYS}
        if pin and DEFAULT_RULES.capacity_type(labels) == capacity:
            return pin
    return {"karpenter.sh/capacity-type": capacity.value}


@dataclass(frozen=True)
class OnDemand:
    """What the deadline policy asks of a Kueue job's on-demand seats (docs/kueue.md, "The deadline
    policy asks Kueue"): ``seats`` of them (extra seats pinned to on-demand flavors); the job's other new
    extra seats are pinned to spot. ``pins``: the node labels of each capacity type's flavors."""

    seats: int
    pins: Mapping[CapacityType, Mapping[str, str]] = field(default_factory=dict)


def on_demand_seats_of(seats: Seats) -> list[WorkloadInfo]:
    """The job's on-demand seats that stay (not deleting, not evicted)."""
    return [
        w
        for _, w in seats.extras
        if w.capacity == CapacityType.ON_DEMAND.value and not w.deleting and w.evicted is None
    ]


def surplus_on_demand(seats: Seats, wanted: int, workers: Sequence[PodInfo]) -> list[WorkloadInfo]:
    """The on-demand seats beyond ``wanted``, in the order they go: pending ones first (they hold no
    quota), then admitted ones without a worker, then those with one, the highest index first."""
    held = {p.seat for p in holding(workers)}
    mine = on_demand_seats_of(seats)
    index = {w.name: i for i, w in seats.extras}
    order = sorted(mine, key=lambda w: (w.admitted, w.name in held, -index[w.name]))
    return order[: max(0, len(mine) - wanted)]


@dataclass(frozen=True)
class WorkloadChanges:
    create: tuple[WorkloadWant, ...] = ()
    delete: tuple[str, ...] = ()


SeatWant = tuple[CapacityType | None, Mapping[str, str]]  # a new extra seat's capacity type and pin


def on_demand_wants(
    kept: Sequence[WorkloadInfo], on_demand: OnDemand, *, room: int
) -> tuple[list[WorkloadInfo], list[SeatWant]]:
    """The pending spot seats that give way, and the on-demand seats to queue: missing ones take the free
    ``room`` first, then the place of pending spot seats (the autoscaler found no spot, or no quota; they
    train nothing), never of a seat with a worker."""
    od = CapacityType.ON_DEMAND
    have = sum(1 for w in kept if w.capacity == od.value)
    missing = max(0, on_demand.seats - have)
    pending_spot = [w for w in kept if w.capacity != od.value and not w.admitted]
    give_way = pending_spot[::-1][: max(0, missing - room)]
    return give_way, [(od, on_demand.pins.get(od, {}))] * min(missing, room + len(give_way))


def new_seats(
    job: str, taken: frozenset[str], wants: Sequence[SeatWant], priority: int
) -> tuple[WorkloadWant, ...]:
    """One extra seat of one worker per want, each under the lowest index no Workload of the job has."""
    free = (i for i in range(len(taken) + len(wants) + 1) if workload_name(job, extra_seat(i)) not in taken)
    return tuple(
        WorkloadWant(workload_name(job, extra_seat(next(free))), 1, priority, False, capacity, dict(pin))
        for capacity, pin in wants
    )


def workload_changes(
    job: str,
    kueue: KueueJob,
    seats: Seats,
    workers: Sequence[PodInfo],
    *,
    replicas: tuple[int, int],
    released: bool,
    on_demand: OnDemand | None = None,
) -> WorkloadChanges:
    """Which Workloads to create and delete now. ``workers``: every worker pod of the job, terminating ones
    included; ``replicas``: (min, max); ``released``: the job holds no quota now (finished, failed,
    suspended, or its base evicted): every Workload goes once no worker holds its node any more.

    Otherwise the base is queued when there is none (and no worker is left of an earlier admission), and
    once it is admitted one extra seat per worker up to max (never before: a job whose extras were admitted
    and whose base waits would hold quota it cannot use, the gang deadlock). An evicted extra is deleted
    once its worker is gone, and queued again as a new seat under the lowest free index.

    ``on_demand`` (a job whose deadline policy buys on-demand workers): that many extra seats are pinned
    to on-demand flavors, the others to spot. Surplus on-demand seats go once no worker holds them; missing
    ones take free room first, then the place of pending spot seats (which train nothing), never of a seat
    with a worker.
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
    if on_demand is not None:
        delete += [w.name for w in surplus_on_demand(seats, on_demand.seats, workers) if w.name not in seated]
    kept = [w for _, w in seats.extras if not w.deleting and w.name not in delete]
    # Fewer extras wanted (replicas.max lowered): the pending ones go first, then those without a worker.
    surplus = sorted(kept, key=lambda w: (w.admitted, w.name in seated))[: max(0, len(kept) - (high - low))]
    delete += [w.name for w in surplus if w.name not in seated]
    if not seats.base_admitted or kueue.priority is None:
        return WorkloadChanges(delete=tuple(delete))
    kept = [w for w in kept if w.name not in delete]
    wants: list[SeatWant] = []
    if on_demand is not None:
        give_way, wants = on_demand_wants(kept, on_demand, room=max(0, high - low - len(kept)))
        delete += [w.name for w in give_way]
        kept = [w for w in kept if w not in give_way]
    missing = max(0, high - low - len(kept) - len(wants))
    spot = (CapacityType.SPOT, on_demand.pins.get(CapacityType.SPOT, {})) if on_demand is not None else None
    wants += [spot or (None, {})] * missing
    create = new_seats(job, seats.names, wants, kueue.priority - 1)
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

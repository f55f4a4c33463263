"""The planner's steps that create: the images pods run, the workers to add, and where the store runs.

Each takes only what it reads and returns its decision as a ``StepResult`` subclass; the planner copies the
decision into the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from etj_operator.api.models import CapacityType
from etj_operator.decide.deadline.on_demand import CapacityPlan
from etj_operator.decide.plan.capacity import LazyCapacity
from etj_operator.decide.plan.model import JobPods, JobView, Observed, StepResult, store_image, trainer_image
from etj_operator.decide.plan.refill import workers_to_add
from etj_operator.decide.plan.sharing import extra_slots
from etj_operator.decide.plan.slots import free_slots, next_rendezvous_index
from etj_operator.decide.plan.store_move import plan_store
from etj_operator.decide.types import Drain
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason


@dataclass(frozen=True)
class Images:
    trainer: str | None  # what new worker pods run; None: nothing may be created
    store: str | None  # what a new store pod runs (None exactly when trainer is None)


def resolve_image(job: JobView) -> Images:
    """Without an image (none in the spec, none recorded, no operator default) no pod can be created; the
    Ready condition and a Warning event say so, and the job waits for a spec edit."""
    trainer = trainer_image(job)
    return Images(trainer, store_image(job, trainer))


@dataclass(frozen=True, kw_only=True)
class Refill(StepResult):
    create_workers: list[int] = field(default_factory=list)
    create_on_demand: list[int] = field(default_factory=list)
    extra_workers: list[int] = field(default_factory=list)
    pin_spot: bool = False
    startup_workers: int = 0


def refill_workers(
    job: JobView,
    now: datetime,
    workers: Sequence[PodInfo],
    survivors: Sequence[PodInfo],
    drains: Sequence[Drain],
    capacity: CapacityPlan,
    room: LazyCapacity,
) -> Refill:
    """Create the missing workers (the caller asks only while the job runs, has an image and is not waiting
    for its final report). Pending pods are the demand signal for Karpenter/cluster-autoscaler."""
    on_demand = free_slots(workers, capacity.add_on_demand)
    staying = len(survivors) + len(on_demand)
    adding = workers_to_add(job.spec, job.status, drains, room, now, staying)
    create = free_slots(workers, adding.count, on_demand)
    # Which of them run beyond min, at the elastic-extra class; on-demand first: the deadline policy bought
    # them to keep the job on time.
    extra = extra_slots(job.spec.replicas.min, survivors, [*on_demand, *create], job.extra_priority_class)
    startup = 0
    if create:
        # Only pods with room now: one waiting for the autoscaler must not hold the first world back.
        startup = len(survivors) + min(len(create), room.get().total)
    return Refill(
        create_workers=create,
        create_on_demand=on_demand,
        extra_workers=extra,
        pin_spot=capacity.pin_spot,
        startup_workers=startup,
        wake_in=adding.wake_in,
    )


@dataclass(frozen=True, kw_only=True)
class StorePlacement(StepResult):
    capacity: list[CapacityType] = field(default_factory=list)
    ensure_service: bool = False
    create: int | None = None  # the index of a new store pod; None: none now
    serve: int | None = None  # the index the Service selects; None: leave it alone


def place_rendezvous(
    job: JobView, pods: JobPods, obs: Observed, stop_reason: Reason | None, image: str | None
) -> StorePlacement:
    """The store: one pod per job on capacity that is not reclaimed, behind a headless Service. ``image``:
    the resolved store image (None: no store pod may be created)."""
    capacity = list(job.spec.placement.rendezvous.capacity_types)
    if stop_reason is not None:
        drains = tuple(
            Drain(p.name, stop_reason, "rendezvous store not needed", p.node, role="rendezvous")
            for p in pods.live_rdzv
        )
        return StorePlacement(capacity=capacity, drains=drains)
    # Make before break (decide/plan/store_move.py): a store whose node is being emptied stays until its
    # replacement is Ready; a lost one is replaced at once under a fresh name.
    store = plan_store(job.name, pods.rdzv, obs, next_rendezvous_index(job.name, pods.rdzv))
    return StorePlacement(
        capacity=capacity,
        ensure_service=True,
        create=store.create if image is not None else None,
        serve=store.serve,
        drains=tuple(store.drains),
        events=tuple(store.events),
        wake_in=store.requeue,
    )

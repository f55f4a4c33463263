"""What the planner reads and writes: the job (``JobView``), the world (``Observed``), the ``Plan``, and
what every step returns (``StepResult``: its drains, events and when to look again, merged by ``Plan.take``).

Plain data, no decisions: planner.py and its steps decide, the reconciler fills these in and applies the
result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from etj_contract.progress import FINAL_REPORT_DEADLINE_S
from etj_operator.api.models import CapacityType, ElasticTrainingJobSpec, ElasticTrainingJobStatus
from etj_operator.decide.deadline.schedule import DeadlineCosts, PriceDefaults
from etj_operator.decide.kueue.admission import KueueJob, WorkloadWant
from etj_operator.decide.objects.placement import SeatPlacement
from etj_operator.decide.types import Drain, KubeEvent
from etj_operator.observe.nodes import NodeInfo
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason
from etj_operator.observe.workloads import FlavorInfo, WorkloadInfo

# Workers that exited 0 have normally had their final report acknowledged (rank 0 retries it for up to 60 s
# before it exits: etj_trainer.core.progress), and the operator re-reads the store at once when it sees them
# (reconciler.py). Until that report is in status the store is kept and the job is not Succeeded, for at most
# this long: the accuracy and last resizes live in that report only.
FINAL_REPORT_GRACE = timedelta(seconds=FINAL_REPORT_DEADLINE_S + 30)


@dataclass(frozen=True)
class JobView:
    name: str
    namespace: str
    uid: str
    generation: int
    spec: ElasticTrainingJobSpec
    status: ElasticTrainingJobStatus
    # The operator's default trainer image (--default-trainer-image, the chart's trainer.image), for jobs
    # whose spec names none.
    default_image: str | None = None
    # The operator's default store image (--default-store-image, the chart's trainer.storeImage): the small
    # CPU-only image for the rendezvous pod, which needs torch's TCPStore and nothing of CUDA.
    default_store_image: str | None = None
    # The operator's default prices (the chart's ``prices``) and what a change costs a job (``deadline``).
    prices: PriceDefaults = field(default_factory=PriceDefaults)
    deadline_costs: DeadlineCosts = field(default_factory=DeadlineCosts)
    # The operator's elastic-extra PriorityClass (--extra-priority-class, the chart's sharing values):
    # workers beyond replicas.min run at it (decide/plan/sharing.py). None: every worker at the job's
    # priority.
    extra_priority_class: str | None = None
    # The job goes through Kueue (labelled kueue.x-k8s.io/queue-name, the operator run with --kueue): its
    # queue and priority (decide/plan/kueue_steps.py). None: it does not.
    kueue: KueueJob | None = None


def trainer_image(job: JobView) -> str | None:
    """The image the job's pods run: the spec's; else the one the job already runs (status.trainerImage),
    so a changed operator default never mixes two images in one job; else the operator's default."""
    return job.spec.trainer.image or job.status.trainer_image or job.default_image


def store_image(job: JobView, trainer: str | None) -> str | None:
    """The image of a new store pod: the spec's storeImage, else the operator's default store image, else
    ``trainer`` (the resolved trainer image, which carries etj-train store too). None when ``trainer`` is:
    a job that cannot run workers creates no store either. Not recorded in status: the store holds no
    state a new image could misread, and a replaced store may run a changed default."""
    if trainer is None:
        return None
    return job.spec.trainer.store_image or job.default_store_image or trainer


@dataclass(frozen=True)
class Observed:
    nodes: Mapping[str, NodeInfo]
    pods: Sequence[PodInfo]  # this job's pods (workers and rendezvous)
    now: datetime
    node_usage: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # GPUs requested per node
    # Namespaces whose pods node_usage counts; empty: all. A namespaced operator (--namespace, the chart's
    # watchNamespaces) cannot see other namespaces' pods, so GPUs they use look free (docs/operator.md).
    usage_namespaces: tuple[str, ...] = ()
    deleted_nodes: Mapping[str, datetime] = field(default_factory=dict)  # tombstones from the node index
    progress: Mapping[str, Any] | None = None
    progress_time: datetime | None = None
    # How long to wait for the final report once workers exited 0; zero when the operator does not read
    # progress at all (--progress-seconds 0): no report can come.
    final_report_grace: timedelta = FINAL_REPORT_GRACE
    # The apiserver's message refusing the last pod create (quota, admission), while creates keep failing.
    create_rejection: str | None = None
    # Whether the operator reads the trainer's progress at all (--progress-seconds > 0): the Progressing
    # condition can only be judged from it.
    progress_tracked: bool = True
    # The job's Kueue Workloads and the ResourceFlavors they may be admitted on (a Kueue job only).
    workloads: Sequence[WorkloadInfo] = ()
    flavors: Mapping[str, FlavorInfo] = field(default_factory=dict)


@dataclass(frozen=True)
class JobPods:
    """The job's pods by role, sorted once per reconcile for every step."""

    workers: tuple[PodInfo, ...]
    rdzv: tuple[PodInfo, ...]  # store pods, live or not

    @classmethod
    def of(cls, pods: Sequence[PodInfo]) -> JobPods:
        return cls(
            tuple(p for p in pods if p.role == "worker"), tuple(p for p in pods if p.role == "rendezvous")
        )

    @property
    def active(self) -> tuple[PodInfo, ...]:
        return tuple(p for p in self.workers if p.active)

    @property
    def live_rdzv(self) -> tuple[PodInfo, ...]:
        return tuple(p for p in self.rdzv if p.active)


def remaining(pods: Sequence[PodInfo], drains: Sequence[Drain]) -> tuple[PodInfo, ...]:
    """``pods`` without those ``drains`` delete: the survivors after a step that drains."""
    gone = {d.pod for d in drains}
    return tuple(p for p in pods if p.name not in gone)


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """What any step may add to the plan besides what it decides: pods to drain, Events, a time to look
    again. Steps return a subclass carrying their own decision; the planner merges these with ``Plan.take``
    in the order of its steps, so drains and Events keep the decision's order."""

    drains: tuple[Drain, ...] = ()
    events: tuple[KubeEvent, ...] = ()
    wake_in: float | None = None  # seconds until a time-based decision of this step changes


@dataclass(frozen=True)
class Verdict:
    """How the job stands: failed, finished or failed (terminal), and why every worker stops."""

    failed: bool = False
    terminal: bool = False  # Failed or Succeeded
    stop_reason: Reason | None = None  # finished, failed, suspended; None: workers run


@dataclass
class Plan:
    create_workers: list[int] = field(default_factory=list)  # slots; names are <job>-worker-<slot>
    # Slots of new workers pinned to on-demand capacity (the deadline policy asks for them).
    create_on_demand: list[int] = field(default_factory=list)
    # Slots of create_workers and create_on_demand that run at the elastic-extra PriorityClass (beyond
    # replicas.min); the others run at the job's own (decide/plan/sharing.py).
    extra_workers: list[int] = field(default_factory=list)
    pin_spot: bool = False  # create_workers are pinned to spot (a job whose deadline policy adds on-demand)
    # Workers the job has once those of create_workers that fit on free capacity now exist: new agents wait
    # (bounded) for that many before their first rendezvous (etj_trainer/agent/first_round.py), so a job's
    # first world forms at the size already scheduled instead of 0->2->4.
    startup_workers: int = 0
    drains: list[Drain] = field(default_factory=list)
    ensure_service: bool = False
    create_rendezvous: bool = False
    rendezvous_index: int = 0  # the new store pod is names.rendezvous_pod_name(job, index)
    # The store index the job's Service must select (the serving store); None: leave the Service alone.
    serve_rendezvous: int | None = None
    rendezvous_capacity: list[CapacityType] = field(default_factory=list)
    status: ElasticTrainingJobStatus = field(default_factory=ElasticTrainingJobStatus)
    trainer_image: str | None = None  # what new worker pods run (None: nothing may be created)
    store_image: str | None = None  # what a new store pod runs (None exactly when trainer_image is None)
    events: list[KubeEvent] = field(default_factory=list)
    new_failures: int = 0
    # Nodes new worker pods must not run on (status.avoidedNodes): a required NotIn on kubernetes.io/hostname.
    avoid_nodes: list[str] = field(default_factory=list)
    requeue_after: float | None = None  # seconds until a time-based decision changes
    delete_job: bool = False  # ttlSecondsAfterFinished expired
    # A Kueue job's new workers' seats (slot → its Workload and flavor), and its Workloads to create and
    # delete (decide/plan/kueue_steps.py).
    worker_seats: dict[int, SeatPlacement] = field(default_factory=dict)
    create_workloads: list[WorkloadWant] = field(default_factory=list)
    delete_workloads: list[str] = field(default_factory=list)

    def requeue(self, seconds: float) -> None:
        seconds = max(0.5, seconds)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    def take(self, result: StepResult) -> None:
        """Merge one step's drains, Events and wake-up into the plan (its own decision the planner reads)."""
        self.drains += result.drains
        self.events += result.events
        if result.wake_in is not None:
            self.requeue(result.wake_in)

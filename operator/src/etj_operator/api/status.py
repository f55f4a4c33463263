"""Status models of an ElasticTrainingJob and helpers the operator uses to write them.

kopf writes status with a JSON merge patch, which replaces lists whole: ``ElasticTrainingJobStatus.to_patch``
therefore always carries the full ``conditions`` and ``resizeHistory`` lists.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from etj_contract.progress import StatePath
from etj_operator.api._base import ApiModel, Time
from etj_operator.api.schedule import CostStatus, ScheduleStatus, WorkersByCapacity

MAX_CONDITIONS = 16
MAX_RESIZE_HISTORY = 20
# Bounds of the failure bookkeeping (decide/failures/bad_nodes.py): enough to judge maxFailures within the
# window,
# and more avoided nodes than any sane replicas.max cap needs.
MAX_FAILURE_TIMES = 64
MAX_AVOIDED_NODES = 32


class Phase(StrEnum):
    """Coarse lifecycle of a job; details live in conditions."""

    PENDING = "Pending"
    RUNNING = "Running"
    RESIZING = "Resizing"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ResizeMode(StrEnum):
    """How the job's world changes size (spec.trainer.launcher decides)."""

    IN_PLACE = "InPlace"
    RESTART = "Restart"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """Condition types the operator sets (other types are allowed, as in metav1.Condition)."""

    READY = "Ready"  # at least replicas.min workers joined and training
    RESIZING = "Resizing"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CAPACITY_AVAILABLE = "CapacityAvailable"  # enough schedulable nodes for replicas.min
    # The apiserver refused a pod the job needs (ResourceQuota, LimitRange, an admission webhook, Pod
    # Security): True with reason FailedCreate and the apiserver's message, as a ReplicaSet reports it.
    REPLICA_FAILURE = "ReplicaFailure"
    # The training step advances: False once it stood still for failurePolicy.progressDeadlineSeconds while
    # the job was Ready (a crash loop, a hang); Unknown while the job is not training or progress is unread.
    PROGRESSING = "Progressing"
    CHECKPOINT_VOLATILE = "CheckpointVolatile"  # no PVC, no object store: the shared copy dies with the pods
    # The newest write of the shared checkpoint (PVC or object store) succeeded: False with the trainer's
    # error while writes fail (training goes on with node-local copies for checkpoint.maxFailedWrites).
    CHECKPOINT_DURABLE = "CheckpointDurable"
    # Workers crash again and again (pod failures and restarts inside pods, with or without progress in
    # between): True from the CRASH_LOOP_CRASHES-th crash within the window until the job runs a window clean.
    CRASH_LOOPING = "CrashLooping"
    # A pod of the job that never started is held back by the kubelet (an image that cannot be pulled, a
    # missing Secret) or, while the job is not Ready, by the scheduler (Unschedulable): True with that reason
    # and its message (decide/failures/start_blocks.py). failurePolicy.podStartDeadlineSeconds bounds the
    # wait.
    PODS_BLOCKED = "PodsBlocked"
    # Only on jobs labelled kueue.x-k8s.io/queue-name under an operator run with --kueue (docs/kueue.md): True
    # while Kueue admits the job's base Workload; False while it waits (reason Pending, Kueue's message) or
    # after Kueue evicted it (reason Evicted).
    KUEUE_ADMITTED = "KueueAdmitted"
    # Only on Kueue jobs whose deadline policy buys on-demand workers (docs/kueue.md, "The deadline policy
    # asks Kueue"): False, reason QuotaExhausted, while an on-demand seat waits for quota Kueue does not have
    # (the LocalQueue and ClusterQueue named, with Kueue's message); True, reason QuotaAvailable, otherwise.
    ON_DEMAND_QUOTA = "OnDemandQuota"


class StatusModel(ApiModel):
    # Status is written by the operator and may gain fields; parsing an older/newer one must not fail.
    model_config = ConfigDict(extra="ignore")


class Condition(StatusModel):
    """A metav1.Condition."""

    type: Annotated[str, Field(min_length=1, max_length=316, pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9_.-]+$")] = (
        Field(description="Condition type in CamelCase, e.g. Ready.")
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )
    last_transition_time: Time = Field(description="When status last changed.")
    reason: Annotated[
        str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    ] = Field(description="Machine-readable CamelCase reason of the last transition.")
    message: Annotated[str, Field(max_length=32768)] = Field(
        default="", description="Human-readable details."
    )


class Progress(StatusModel):
    """Training progress reported by rank 0."""

    epoch: int | None = Field(default=None, ge=0, description="Current epoch (0-based).")
    step: int | None = Field(default=None, ge=0, description="Optimizer steps completed.")
    samples_seen: int | None = Field(default=None, ge=0, description="Training samples consumed so far.")
    samples_total: int | None = Field(
        default=None, ge=0, description="Samples the whole run trains (epochs x dataset size)."
    )
    samples_per_second: float | None = Field(default=None, ge=0, description="Recent training throughput.")
    loss: float | None = Field(default=None, description="Recent training loss.")
    accuracy: float | None = Field(default=None, description="Final evaluation accuracy (set at the end).")
    last_update_time: Time | None = Field(default=None, description="When the trainer last reported.")
    last_step_time: Time | None = Field(
        default=None, description="When step last changed (the Progressing condition's clock)."
    )
    step_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Measured seconds per optimizer step (a moving average over the step changes the "
        "operator saw): the stall threshold adapts to it (failurePolicy.stallFloorSeconds).",
    )
    crashes: int | None = Field(
        default=None,
        ge=0,
        description="Crashes the job's agents reported to its store (workers restarted inside their pods); "
        "an increase is recorded in status.crashTimes.",
    )


class ResizeEvent(StatusModel):
    """One change of the world size."""

    time: Time = Field(description="When the new world size started training.")
    from_: int = Field(alias="from", ge=0, description="Worker pods before the resize.")
    to: int = Field(ge=0, description="Worker pods after the resize.")
    reason: Annotated[str, Field(max_length=256)] = Field(
        default="", description="Why, e.g. SpotInterruption, CapacityAdded, WorkerFailed, ScaledByUser."
    )
    pause_seconds: float | None = Field(default=None, ge=0, description="Seconds without training steps.")
    steps_lost: int | None = Field(
        default=None, ge=0, description="Optimizer steps redone because they were after the last checkpoint."
    )
    state_path: StatePath | None = Field(
        default=None,
        description="How the trained state crossed the resize, as the trainer measured it: InPlace (kept "
        "in memory by the ranks that stayed; joiners got it from a peer), InPlaceResharded (a sharded "
        "state, FSDP: every tensor gathered from the old world before it changed, the leaving ranks' shards "
        "included, and resharded onto the new one in memory) or Restart (the world restarted from the "
        "newest checkpoint, resharded onto the new world for a sharded state: stepsLost says what it cost).",
    )
    unmeasured_reason: Annotated[str, Field(max_length=64)] | None = Field(
        default=None,
        description="Why pauseSeconds is absent: NotJoinedBeforeEnd (worker pods started, but the job "
        "finished before its world admitted them).",
    )


class LastCheckpoint(StatusModel):
    """The newest checkpoint whose shared copy (PVC or object store) was confirmed written."""

    step: int = Field(ge=0, description="Optimizer step of the checkpoint.")
    path: Annotated[str, Field(max_length=2048)] = Field(description="Where it was written.")
    time: Time | None = Field(default=None, description="When it was written.")


class AvoidedNode(StatusModel):
    """A node new workers stay off for a while, because a worker crashed on it."""

    node: Annotated[str, Field(min_length=1, max_length=253)] = Field(description="The node's name.")
    until: Time = Field(description="When new workers may be placed on it again.")
    reason: Annotated[str, Field(max_length=256)] = Field(default="", description="Which worker failed, how.")


class ElasticTrainingJobStatus(StatusModel):
    """Observed state of an ElasticTrainingJob, written by the operator."""

    phase: Phase | None = Field(
        default=None, description="Pending, Running, Resizing, Suspended, Succeeded or Failed."
    )
    conditions: Annotated[list[Condition], Field(max_length=MAX_CONDITIONS)] = Field(
        default_factory=list,
        description="Latest observations (metav1.Condition); the whole list is rewritten on every update.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="Generation of the spec last acted on."
    )
    desired_replicas: int | None = Field(
        default=None, ge=0, description="Workers the operator currently wants."
    )
    current_replicas: int | None = Field(default=None, ge=0, description="Worker pods running now.")
    workers: Annotated[str, Field(max_length=32)] | None = Field(
        default=None, description="current/desired workers, for kubectl get."
    )
    selector: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None, description="Label selector of the worker pods (for the scale subresource)."
    )
    world_size: int | None = Field(
        default=None,
        ge=0,
        description="Training processes (ranks) in the current world: workers x trainer.procsPerWorker.",
    )
    per_rank_batch: int | None = Field(
        default=None, ge=0, description="Samples per rank per optimizer step (the largest share)."
    )
    per_worker_batch: int | None = Field(
        default=None,
        ge=0,
        description="Samples per worker pod per optimizer step: its ranks' shares together (the largest).",
    )
    accumulation_steps: int | None = Field(
        default=None, ge=0, description="Gradient accumulation steps per optimizer step on each rank."
    )
    lr_multiplier: float | None = Field(
        default=None, ge=0, description="Current learning-rate multiplier (changes under DynamicSGD)."
    )
    lr: float | None = Field(
        default=None,
        ge=0,
        description="Learning rate in force: the schedule's value at the samples seen x lrMultiplier.",
    )
    progress: Progress | None = Field(default=None, description="Training progress.")
    resize_history: Annotated[list[ResizeEvent], Field(max_length=MAX_RESIZE_HISTORY)] = Field(
        default_factory=list,
        description=f"The last {MAX_RESIZE_HISTORY} resizes of the running world, oldest first (pods that "
        "start before the trainer's first report or exit after its finished report are not resizes).",
    )
    last_checkpoint: LastCheckpoint | None = Field(
        default=None,
        description="Newest checkpoint confirmed written to the shared location (checkpoint.pvc or uri).",
    )
    failures: int | None = Field(
        default=None,
        ge=0,
        description="Worker failures counted over the job's whole life (the budget counts only those "
        "within failurePolicy.failureWindowSeconds: status.failureTimes).",
    )
    failure_times: Annotated[list[Time], Field(max_length=MAX_FAILURE_TIMES)] = Field(
        default_factory=list,
        description=f"When the last failures (at most {MAX_FAILURE_TIMES}) were counted, oldest first: "
        "failurePolicy.failureWindowSeconds counts those within the window (entries older than it are "
        "dropped).",
    )
    crash_times: Annotated[list[Time], Field(max_length=MAX_FAILURE_TIMES)] = Field(
        default_factory=list,
        description="When workers crashed recently (failed pods and restarts inside pods; crashes less than "
        "a few seconds apart are one), oldest first, within the CrashLooping condition's window.",
    )
    avoided_nodes: Annotated[list[AvoidedNode], Field(max_length=MAX_AVOIDED_NODES)] = Field(
        default_factory=list,
        description="Nodes new workers avoid after a worker crashed there (failurePolicy.avoidNodeSeconds), "
        "oldest first; expired entries are dropped.",
    )
    trainer_image: Annotated[str, Field(max_length=512)] | None = Field(
        default=None,
        description="Image the job's pods run: spec.trainer.image, or the operator's default trainer image "
        "when the spec names none (kept from the job's first start, so a changed default never mixes images "
        "in one job).",
    )
    resize_mode: ResizeMode | None = Field(
        default=None,
        description="How this job resizes. InPlace (trainer.launcher Etj): leaves, joins and crashes re-form "
        "the world in the running processes, with the global batch fixed and every sample once per epoch. "
        "Restart (trainer.launcher Torchrun): every membership change restarts all workers, which resume "
        "from the script's own checkpoint; batch, sampling and checkpoints are the script's, and etj "
        "guarantees neither a fixed global batch nor exactly-once sampling unless the script does.",
    )
    start_time: Time | None = Field(default=None, description="When the first worker started training.")
    completion_time: Time | None = Field(default=None, description="When the job Succeeded or Failed.")
    workers_by_capacity: WorkersByCapacity | None = Field(
        default=None, description="Running workers by the capacity type of their node."
    )
    cost: CostStatus | None = Field(
        default=None, description="Cost of the worker pods so far, and where the prices come from."
    )
    schedule: ScheduleStatus | None = Field(
        default=None,
        description="Projected finish and slack against spec.deadline (unset without a deadline).",
    )

    def to_patch(self) -> dict[str, Any]:
        """The ``status`` body of a merge patch, camelCase, lists complete, unset fields left untouched."""
        body = self.to_dict()
        body["conditions"] = [c.to_dict() for c in self.conditions]
        body["resizeHistory"] = [e.to_dict() for e in self.resize_history[-MAX_RESIZE_HISTORY:]]
        if self.current_replicas is not None and self.desired_replicas is not None:
            body["workers"] = f"{self.current_replicas}/{self.desired_replicas}"
        return body

    def add_resize(self, event: ResizeEvent) -> None:
        """Append a resize, dropping the oldest beyond the bound."""
        self.resize_history = [*self.resize_history, event][-MAX_RESIZE_HISTORY:]


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus | bool,
    reason: str,
    message: str = "",
    *,
    generation: int | None = None,
    now: datetime | None = None,
) -> list[Condition]:
    """Return a new list with one condition upserted.

    lastTransitionTime only moves when status changes, as metav1.Condition requires.
    """
    if isinstance(status, bool):
        status = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    new_status, at = status, now or datetime.now(UTC)

    def upserted(old: Condition | None) -> Condition:
        return Condition(
            type=type_,
            status=new_status,
            reason=reason,
            message=message,
            observed_generation=generation,
            last_transition_time=old.last_transition_time if old and old.status == new_status else at,
        )

    if any(c.type == type_ for c in conditions):
        return [upserted(c) if c.type == type_ else c for c in conditions]
    return [*conditions, upserted(None)]

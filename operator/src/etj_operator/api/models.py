"""ElasticTrainingJob ``etj.dev/v1alpha1``: the pydantic models are the single source of truth.

``crd.py`` turns these models into ``crds/`` (OpenAPI v3 + CEL); the operator parses a job with
``ElasticTrainingJobSpec.model_validate(body["spec"])`` (defaults applied, same limits as the apiserver)
and writes status with the models in ``status.py``. Everything in ``pod.py`` and ``status.py`` is
re-exported here, so ``from etj_operator.api.models import X`` works for every API type.

Field names are a public API: renaming one breaks stored objects and the operator. Add, do not rename.
Long because: the job's spec types stay together here (with the markers that emit each one's CEL rule),
while the pod-shaped types live in pod.py and the status types in status.py.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, StringConstraints, model_validator

from etj_contract import env as etj_env
from etj_operator.api._base import (
    ABSOLUTE_PATH_RE,
    DNS_SUBDOMAIN_RE,
    ApiModel,
    CheckedModel,
    Matches,
    cel,
    rules,
    section,
    unchanged,
)
from etj_operator.api.pod import (
    DEFAULT_COMMAND,
    DEFAULT_GPU_RESOURCE,
    RESERVED_ENV,
    CapacityType,
    EnvVar,
    Launcher,
    Placement,
    PullPolicy,
    RendezvousPlacement,
    TaintEffect,
    Toleration,
    TolerationOperator,
    TrainerSpec,
    Volume,
    VolumeMount,
    WorkerResources,
    procs_cel,
)
from etj_operator.api.recipe import (
    AugmentationSpec,
    AugmentationType,
    LrScheduleSpec,
    OptimizerSpec,
    Parallelism,
    Precision,
    ScheduleType,
    epoch_checks,
    parallelism_checks,
)
from etj_operator.api.schedule import (
    CostStatus,
    DeadlineSpec,
    PricesSpec,
    ScheduleStatus,
    WorkersByCapacity,
)
from etj_operator.api.status import (
    MAX_RESIZE_HISTORY,
    Condition,
    ConditionStatus,
    ConditionType,
    ElasticTrainingJobStatus,
    LastCheckpoint,
    Phase,
    Progress,
    ResizeEvent,
    ResizeMode,
    set_condition,
)

GROUP = "etj.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ElasticTrainingJob"
PLURAL = "elastictrainingjobs"
SINGULAR = "elastictrainingjob"
SHORT_NAMES = ["etj"]
CATEGORIES = ["training"]

MAX_REPLICAS = 1024
# The job name is a label value and prefixes its pods' and Service's names ("<job>-worker-<slot>",
# "<job>-rdzv"), all capped at 63 characters: 48 leaves room for the longest suffix ("-worker-1023").
MAX_JOB_NAME = 48


class ResizePolicy(StrEnum):
    """What happens to batch size and learning rate when the number of workers changes."""

    FIXED_GLOBAL_BATCH = "FixedGlobalBatch"
    DYNAMIC_SGD = "DynamicSGD"


class ReplicaRange(ApiModel):
    """Elastic range of worker pods (torchrun --nnodes=min:max)."""

    model_config = {
        "json_schema_extra": rules(
            cel(
                "self.min <= self.max",
                # A static message: string(int) in a messageExpression has an unbounded estimated size,
                # which blows the apiserver's CEL cost budget.
                "replicas.min must not be greater than replicas.max",
                field_path=".min",
            ),
        )
    }

    min: int = Field(
        ge=1, le=MAX_REPLICAS, description="Fewest workers the job trains with; below it, it waits."
    )
    max: int = Field(
        ge=1,
        le=MAX_REPLICAS,
        description="Most workers the job uses (the scale subresource sets this value).",
    )

    @model_validator(mode="after")
    def _check(self) -> ReplicaRange:
        if self.min > self.max:
            raise ValueError(f"replicas.min ({self.min}) must not be greater than replicas.max ({self.max})")
        return self


class DynamicSGDSpec(ApiModel):
    """Dynamic SGD (Lin et al. 2019): after a resize by factor k, ramp the LR multiplier to k over T steps."""

    ramp_steps: int = Field(
        default=1000,
        ge=1,
        le=10_000_000,
        description="Ramp length T in optimizer steps (ETJ_DSGD_RAMP_STEPS).",
    )


# The recipe fields a running job must not change (globalBatchSize and resizePolicy have rules of their own).
_FIXED_TRAINING = (
    "epochs",
    "seed",
    "microBatchSize",
    "precision",
    "dynamicSGD",
    "optimizer",
    "lrSchedule",
    "augmentation",
    "parallelism",
    "shardGroupSize",
)


class TrainingSpec(CheckedModel):
    """Batch sizes, resize policy, length and recipe (optimizer, LR schedule, precision, augmentation)."""

    checks = epoch_checks() + parallelism_checks()

    model_config = {
        "json_schema_extra": rules(
            cel(
                "self.microBatchSize <= self.globalBatchSize",
                "training.microBatchSize must not be greater than training.globalBatchSize",
                field_path=".microBatchSize",
            ),
            cel(
                " && ".join(unchanged(f) for f in _FIXED_TRAINING),
                "training.epochs, seed, microBatchSize, precision, optimizer, lrSchedule, augmentation, "
                "parallelism, shardGroupSize and dynamicSGD are immutable: a change would reach only the "
                "workers started after it and mix two settings in one job; create a new job to change them",
            ),
        )
    }

    global_batch_size: int = Field(
        ge=1,
        le=1 << 24,
        description="Samples per optimizer step across all training processes (ranks). FixedGlobalBatch: "
        "at every size. DynamicSGD: the batch at replicas.min (the LR belongs to it); each rank keeps "
        "globalBatchSize / (replicas.min x trainer.procsPerWorker) samples and the batch grows with the "
        "ranks. Immutable.",
        json_schema_extra=rules(
            cel("self == oldSelf", "training.globalBatchSize is immutable; create a new job to change it")
        ),
    )
    micro_batch_size: int = Field(
        ge=1,
        le=1 << 20,
        description="Largest per-process (per-rank) batch that fits in memory; larger per-rank shares use "
        "gradient accumulation.",
    )
    resize_policy: ResizePolicy = Field(
        default=ResizePolicy.FIXED_GLOBAL_BATCH,
        description="FixedGlobalBatch keeps the global batch and LR (per-rank batch = global / ranks); "
        "DynamicSGD keeps the per-rank batch and scales the LR with a ramp (multiplier ranks / minimum "
        "ranks). Immutable.",
        json_schema_extra=rules(
            cel("self == oldSelf", "training.resizePolicy is immutable; create a new job to change it")
        ),
    )
    dynamic_sgd: DynamicSGDSpec = Field(
        default_factory=DynamicSGDSpec,
        alias="dynamicSGD",
        description="Dynamic SGD settings; used only when resizePolicy is DynamicSGD.",
        json_schema_extra={"default": {}},
    )
    epochs: int = Field(default=1, ge=1, le=100_000, description="Passes over the training set.")
    seed: int = Field(default=0, ge=0, le=(1 << 31) - 1, description="Seed of the sampler and model init.")
    optimizer: OptimizerSpec = section(OptimizerSpec, "SGD settings: learning rate, momentum, weight decay.")
    lr_schedule: LrScheduleSpec = section(LrScheduleSpec, "LR schedule over samples seen (epochs).")
    precision: Precision = Field(
        default=Precision.FP32,
        description="fp32, bf16 or fp16: autocast, fp16 with a checkpointed gradient scaler (ETJ_PRECISION).",
    )
    augmentation: AugmentationSpec = section(AugmentationSpec, "Training-image augmentation.")
    parallelism: Parallelism = Field(
        default=Parallelism.DDP,
        description="DDP: a full replica of the model and optimizer on every rank. FSDP: parameters, "
        "gradients and optimizer state sharded over all ranks (FSDP2), checkpointed with "
        "torch.distributed.checkpoint and resharded on load at any size; a leave or a join reshards "
        "in place, in memory, a crash restarts the world from the newest checkpoint "
        "(status.resizeHistory[].statePath says which). HSDP: sharded within groups of shardGroupSize "
        "ranks, replicated across them; every resize restarts the world. Sharded jobs need "
        "checkpoint.pvc (ETJ_PARALLELISM). Immutable.",
    )
    shard_group_size: int | None = Field(
        default=None,
        ge=1,
        le=1 << 16,
        description="HSDP only: ranks per shard group (default: trainer.procsPerWorker, so a pod holds "
        "one sharded copy and pods replicate it); the world size must be a multiple of it "
        "(ETJ_SHARD_GROUP_SIZE).",
    )

    @model_validator(mode="after")
    def _check(self) -> TrainingSpec:
        if self.micro_batch_size > self.global_batch_size:
            raise ValueError(
                f"training.microBatchSize ({self.micro_batch_size}) must not be greater than "
                f"training.globalBatchSize ({self.global_batch_size})"
            )
        return self


class PVCRef(ApiModel):
    """A PersistentVolumeClaim (ReadWriteMany for more than one node) mounted at checkpoint.path."""

    claim_name: Annotated[
        str,
        StringConstraints(min_length=1, max_length=253),
        Matches(
            DNS_SUBDOMAIN_RE,
            "checkpoint.pvc.claimName must be a lower-case DNS name (letters, digits, '-', '.')",
        ),
    ] = Field(description="Name of the PVC in the job's namespace.")
    sub_path: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        default=None, description="Directory inside the volume; defaults to the volume root."
    )


class CheckpointSpec(ApiModel):
    """Where and how often checkpoints are written. The location is immutable once the job exists."""

    model_config = {
        "json_schema_extra": rules(
            cel("!(has(self.pvc) && has(self.uri))", "set checkpoint.pvc or checkpoint.uri, not both"),
            cel(
                " && ".join(unchanged(f) for f in ("path", "pvc", "uri")),
                "checkpoint.pvc, checkpoint.path and checkpoint.uri are immutable; a new location would lose "
                "the job's progress",
            ),
        )
    }

    pvc: PVCRef | None = Field(default=None, description="Shared volume holding the checkpoints.")
    path: Annotated[
        str,
        StringConstraints(min_length=1, max_length=1024),
        Matches(ABSOLUTE_PATH_RE, "checkpoint.path must be an absolute path"),
    ] = Field(
        default="/checkpoints",
        description="Absolute checkpoint directory inside the worker (the PVC's mount point when pvc is "
        "set).",
    )
    uri: (
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=2048),
            Matches(
                etj_env.CHECKPOINT_URI_RE,
                "checkpoint.uri must be s3://bucket/prefix (the object stores the trainer writes to: "
                + ", ".join(etj_env.CHECKPOINT_URI_SCHEMES)
                + ")",
            ),
        ]
        | None
    ) = Field(
        default=None, description="Object-store location (e.g. s3://bucket/prefix) used instead of path."
    )
    interval_steps: int = Field(
        default=500, ge=1, le=10_000_000, description="Checkpoint every N optimizer steps."
    )
    keep: int = Field(default=3, ge=1, le=100, description="Number of most recent checkpoints kept.")
    max_failed_writes: int = Field(
        default=3,
        ge=0,
        le=1000,
        description="Writes of the shared checkpoint (pvc or uri) that may fail in a row while training "
        "goes on with node-local copies (condition CheckpointDurable=False, a Warning Event); one more and "
        "the workers stop with the error. 0: stop at the first failed write.",
    )
    # No onInterruption switch: a worker told to stop always writes its just-in-time checkpoint (within
    # the pod's grace period); turning that off could only lose work.

    @model_validator(mode="after")
    def _check(self) -> CheckpointSpec:
        if self.pvc is not None and self.uri is not None:
            raise ValueError("set checkpoint.pvc or checkpoint.uri, not both")
        return self

    @property
    def location(self) -> str:
        """Where the shared checkpoints go: the URI if set (ETJ_CHECKPOINT_URI), else the directory."""
        return self.uri if self.uri is not None else self.path


class ScalingSpec(ApiModel):
    """How eagerly the operator resizes the job."""

    cooldown_seconds: int = Field(
        default=60, ge=0, le=86_400, description="Minimum time between two planned resizes."
    )
    scale_up_delay_seconds: int = Field(
        default=30,
        ge=0,
        le=86_400,
        description="How long extra capacity must stay available before workers are added (avoids flapping).",
    )


class FailurePolicy(ApiModel):
    """Failure budget: how many worker failures the job survives."""

    max_failures: int = Field(
        default=5,
        ge=0,
        le=10_000,
        description="Worker failures (crashes, not node interruptions) tolerated before the job is Failed.",
    )
    count_interruptions: bool = Field(
        default=False, description="Also count spot interruptions and drains against maxFailures."
    )
    startup_deadline_seconds: int = Field(
        default=1800,
        ge=1,
        le=86_400,
        description="How long a worker waits for the job's rendezvous store to answer before its first "
        "rendezvous (a store pod waiting for a node or an image pull). Waiting is never a failure; a worker "
        "still without a store after this long exits 1, which counts against maxFailures.",
    )
    pod_start_deadline_seconds: int = Field(
        default=900,
        ge=0,
        le=604_800,
        description="How long the job may wait, while it is not Ready, for a pod of it that has never "
        "started and that the scheduler (Unschedulable) or the kubelet (ErrImagePull, ImagePullBackOff, "
        "ErrImageNeverPull, CreateContainerConfigError, CreateContainerError) holds back, before the job "
        "is Failed with that reason and the kubelet's or scheduler's message. The clock starts at the later "
        "of the pod's creation and the job losing Ready, so elastic extras pending beside a running job "
        "never fail it; once the job has trained, no room (Unschedulable) is a capacity drought that is "
        "reported and waited out, never failed for. InvalidImageName fails the job at once: no retry can "
        "fix an image reference that "
        "does not parse. The PodsBlocked condition and a Warning Event report every such pod at once, "
        "whatever this value. 0: never fail the job for it. The default leaves time for an autoscaler to "
        "bring a GPU node and for three image pull retries, and ends before startupDeadlineSeconds' "
        "default, so a store pod that cannot start fails the job naming its image, not the store.",
    )
    progress_deadline_seconds: int = Field(
        default=600,
        ge=0,
        le=604_800,
        description="Seconds the training step may stand still while the job is Ready before the "
        "Progressing condition turns False (reason ProgressDeadlineExceeded, with a Warning Event naming "
        "the trainer's last error). 0 disables the check.",
    )
    stall_floor_seconds: int = Field(
        default=90,
        ge=1,
        le=604_800,
        description="The step counts as stalled (Progressing False) after 20 measured step times without a "
        "step (status.progress.stepSeconds), but never sooner than this many seconds and never later than "
        "progressDeadlineSeconds. Set it to progressDeadlineSeconds or more to judge by the fixed deadline "
        "only (steps that pause for long checkpoints).",
    )
    failure_window_seconds: int = Field(
        default=3600,
        ge=0,
        le=31_536_000,
        description="Only failures within the last this many seconds count against maxFailures, so crashes "
        "spread over days do not fail a long job. 0 counts every failure of the job's life. The window is "
        "judged from status.failureTimes, which keeps at most the last 64 failures: with maxFailures of 64 "
        "or more the window is not applied (every failure counts).",
    )
    avoid_node_seconds: int = Field(
        default=1800,
        ge=0,
        le=604_800,
        description="After a worker crashes on a node (exit code not 0, OOM kill; not an interruption or a "
        "drain), new workers avoid that node (a required node affinity on kubernetes.io/hostname) for this "
        "many seconds; the nodes are listed in status.avoidedNodes. At most replicas.max nodes are avoided "
        "at once (the oldest is dropped first). 0 disables it.",
    )


# Training processes (ranks) per worker pod in CEL (mirrors ElasticTrainingJobSpec.procs_per_worker).
_PROCS_CEL = procs_cel("self.trainer")
_DSGD_CEL = "has(self.training.resizePolicy) && self.training.resizePolicy == 'DynamicSGD'"
FIXED_BATCH_TOO_SMALL = (
    "training.globalBatchSize must be at least one sample per training process at replicas.max "
    "(replicas.max x trainer.procsPerWorker)"
)
DSGD_BATCH_NOT_MULTIPLE = (
    "with DynamicSGD, training.globalBatchSize is the batch at replicas.min and must be a multiple of the "
    "training processes there (replicas.min x trainer.procsPerWorker)"
)
# DCP writes every rank's shards to one file system; the object-store writer takes whole DDP files only.
SHARDED_NEEDS_VOLUME = (
    "training.parallelism FSDP or HSDP checkpoints to a volume every worker mounts (checkpoint.pvc), "
    "not to checkpoint.uri"
)


_TORCHRUN_CEL = "has(self.trainer.launcher) && self.trainer.launcher == 'Torchrun'"
# A stock script is opaque to etj (issue 47, rung 0): what etj would do inside it cannot be asked for.
TORCHRUN_NO_DYNAMIC_SGD = (
    "trainer.launcher Torchrun runs a stock script whose batch and learning rate are its own: "
    "training.resizePolicy DynamicSGD needs a script on etj_trainer.elastic (trainer.launcher Etj)"
)
TORCHRUN_NO_SHARDING = (
    "trainer.launcher Torchrun runs a stock script, which wraps its model itself: training.parallelism "
    "FSDP or HSDP is etj's sharding of a script on etj_trainer.elastic (trainer.launcher Etj); leave it DDP"
)


class ElasticTrainingJobSpec(ApiModel):
    """Desired state of an ElasticTrainingJob."""

    model_config = {
        "json_schema_extra": rules(
            cel(
                # A non-positive batch already has its own error; do not report it twice.
                f"self.training.globalBatchSize < 1 || ({_DSGD_CEL}) || "
                f"self.training.globalBatchSize >= self.replicas.max * {_PROCS_CEL}",
                FIXED_BATCH_TOO_SMALL,
                field_path=".training.globalBatchSize",
            ),
            cel(
                f"self.training.globalBatchSize < 1 || !({_DSGD_CEL}) || "
                f"self.training.globalBatchSize % (self.replicas.min * {_PROCS_CEL}) == 0",
                DSGD_BATCH_NOT_MULTIPLE,
                field_path=".training.globalBatchSize",
            ),
            cel(
                "!has(self.training.parallelism) || self.training.parallelism == 'DDP' || "
                "!has(self.checkpoint) || !has(self.checkpoint.uri)",
                SHARDED_NEEDS_VOLUME,
                field_path=".checkpoint.uri",
            ),
            cel(
                f"!({_TORCHRUN_CEL}) || !({_DSGD_CEL})",
                TORCHRUN_NO_DYNAMIC_SGD,
                field_path=".trainer.launcher",
            ),
            cel(
                f"!({_TORCHRUN_CEL}) || !has(self.training.parallelism) || "
                "self.training.parallelism == 'DDP'",
                TORCHRUN_NO_SHARDING,
                field_path=".trainer.launcher",
            ),
        )
    }

    trainer: TrainerSpec = Field(description="Container that runs the training on every worker.")
    replicas: ReplicaRange = Field(
        description="Elastic range of worker pods; in training processes (ranks), replicas x "
        "trainer.procsPerWorker."
    )
    training: TrainingSpec = Field(
        description="Batch sizes, resize policy, training length and recipe (optimizer, LR schedule, "
        "precision, augmentation)."
    )
    placement: Placement = section(Placement, "Node pools for workers and the rendezvous store.")
    checkpoint: CheckpointSpec = section(CheckpointSpec, "Checkpoint storage and interval.")
    scaling: ScalingSpec = section(ScalingSpec, "Resize timing.")
    failure_policy: FailurePolicy = section(FailurePolicy, "Failure budget.")
    deadline: DeadlineSpec | None = Field(
        default=None,
        description="Finish by this time at the lowest cost: train on spot, add on-demand workers (up to "
        "deadline.maxOnDemandWorkers) only while the job would miss it, release them first when spot "
        "returns. Unset: no deadline, no on-demand workers added for a schedule (the behaviour without it).",
    )
    prices: PricesSpec = section(
        PricesSpec, "USD per worker-hour by capacity type for status.cost; unset: the operator's defaults."
    )
    suspend: bool = Field(
        default=False,
        description="True stops all workers (after a checkpoint) and keeps the job; false resumes.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=31_536_000,
        description="Delete the job this many seconds after it Succeeded or Failed; unset keeps it.",
    )

    @model_validator(mode="after")
    def _check(self) -> ElasticTrainingJobSpec:
        batch = self.training.global_batch_size
        if self.training.resize_policy == ResizePolicy.DYNAMIC_SGD:
            if batch % self.min_ranks:
                raise ValueError(f"{DSGD_BATCH_NOT_MULTIPLE} ({batch} is not a multiple of {self.min_ranks})")
        elif batch < self.max_ranks:
            raise ValueError(f"{FIXED_BATCH_TOO_SMALL} ({batch} < {self.max_ranks})")
        if self.training.parallelism != Parallelism.DDP and self.checkpoint.uri:
            raise ValueError(SHARDED_NEEDS_VOLUME)
        if self.trainer.launcher == Launcher.TORCHRUN:
            if self.training.resize_policy == ResizePolicy.DYNAMIC_SGD:
                raise ValueError(TORCHRUN_NO_DYNAMIC_SGD)
            if self.training.parallelism != Parallelism.DDP:
                raise ValueError(TORCHRUN_NO_SHARDING)
        return self

    @property
    def resizes_in_place(self) -> bool:
        """False for a stock torchrun script: every membership change restarts its workers."""
        return self.trainer.launcher == Launcher.ETJ

    @property
    def procs_per_worker(self) -> int:
        """ETJ_NPROC_PER_WORKER: trainer.procsPerWorker, else one process per GPU, or one on CPU."""
        return self.trainer.procs

    @property
    def min_ranks(self) -> int:
        """The job's minimum in training processes: replicas.min x procsPerWorker."""
        return self.replicas.min * self.procs_per_worker

    @property
    def max_ranks(self) -> int:
        """The job's maximum in training processes: replicas.max x procsPerWorker."""
        return self.replicas.max * self.procs_per_worker


class ObjectMeta(ApiModel):
    """The subset of metadata the models read; the apiserver owns the rest."""

    model_config = {"extra": "ignore"}

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class ElasticTrainingJob(ApiModel):
    """A whole ElasticTrainingJob object (metadata, spec, status)."""

    model_config = {"extra": "ignore"}

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ElasticTrainingJobSpec
    status: ElasticTrainingJobStatus | None = None


__all__ = [
    "API_VERSION",
    "CATEGORIES",
    "DEFAULT_COMMAND",
    "DEFAULT_GPU_RESOURCE",
    "GROUP",
    "KIND",
    "MAX_RESIZE_HISTORY",
    "PLURAL",
    "RESERVED_ENV",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "AugmentationSpec",
    "AugmentationType",
    "CapacityType",
    "CheckpointSpec",
    "Condition",
    "ConditionStatus",
    "ConditionType",
    "CostStatus",
    "DeadlineSpec",
    "DynamicSGDSpec",
    "ElasticTrainingJob",
    "ElasticTrainingJobSpec",
    "ElasticTrainingJobStatus",
    "EnvVar",
    "FailurePolicy",
    "LastCheckpoint",
    "Launcher",
    "LrScheduleSpec",
    "OptimizerSpec",
    "PVCRef",
    "Parallelism",
    "Phase",
    "Placement",
    "Precision",
    "PricesSpec",
    "Progress",
    "PullPolicy",
    "RendezvousPlacement",
    "ReplicaRange",
    "ResizeEvent",
    "ResizeMode",
    "ResizePolicy",
    "ScalingSpec",
    "ScheduleStatus",
    "ScheduleType",
    "TaintEffect",
    "Toleration",
    "TolerationOperator",
    "TrainerSpec",
    "TrainingSpec",
    "Volume",
    "VolumeMount",
    "WorkerResources",
    "WorkersByCapacity",
    "set_condition",
]

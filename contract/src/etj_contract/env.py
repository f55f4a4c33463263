"""The worker pod's environment: every ``ETJ_*`` variable, its type, who sets it and what it means.

The one list both sides derive from:

- the operator sets ``OPERATOR_SET`` on every worker from the job spec (``worker_env``), and users may not
  override them (``RESERVED_ENV``, the CRD's CEL rule on ``spec.trainer.env``);
- the trainer reads them, and the trainer settings users pass in ``spec.trainer.env``, into
  ``TrainConfig`` (each variable with a ``field``) and ``AgentConfig``;
- ``etj-train local|train`` turn the variables marked ``flag`` into ``--<field>`` flags.

Standard library only: both images and the tests import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class SetBy(StrEnum):
    OPERATOR = "operator"  # on every worker, from the job spec; users cannot override it
    USER = "user"  # a trainer setting: spec.trainer.env, or an etj-train flag
    AGENT = "agent"  # `etj-train worker` sets it for its own worker processes


def truthy(raw: str) -> bool:
    """A boolean variable: 1, true or yes (any case) is on, anything else off."""
    return raw.strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Var(Generic[T]):
    name: str
    parse: Callable[[str], T]  # the variable's type: how its text becomes a value
    meaning: str
    set_by: SetBy = SetBy.USER
    field: str | None = None  # the TrainConfig field it sets, if any
    flag: bool = False  # also an `etj-train local|train` flag, --<field>

    def read(self, env: Mapping[str, str]) -> T | None:
        """The parsed value from ``env``; None when unset or empty."""
        raw = env.get(self.name)
        return self.parse(raw) if raw else None

    def get(self, env: Mapping[str, str], fallback: T) -> T:
        """The parsed value, or ``fallback`` when the variable is unset (and has no default)."""
        value = self.read(env)
        return fallback if value is None else value


def _var(
    name: str,
    parse: Callable[[str], T],
    meaning: str,
    *,
    set_by: SetBy = SetBy.USER,
    field: str | None = None,
    flag: bool = False,
) -> Var[T]:
    return Var(f"ETJ_{name}", parse, meaning, set_by, field, flag)


OP = SetBy.OPERATOR

# ---- set by the operator on every worker (docs/contract.md) --------------------------------------------
JOB_NAME = _var("JOB_NAME", str, "the ElasticTrainingJob's name", field="job_name", set_by=OP)
NAMESPACE = _var("NAMESPACE", str, "the job's namespace", set_by=OP)
WORKER_ID = _var("WORKER_ID", str, "stable worker identity (the pod name)", set_by=OP)
RDZV_ENDPOINT = _var("RDZV_ENDPOINT", str, "host:port of the job's rendezvous store (a TCPStore)", set_by=OP)
RDZV_ID = _var("RDZV_ID", str, "rendezvous run id (the job's uid)", set_by=OP)
MIN_WORKERS = _var(
    "MIN_WORKERS",
    int,
    "spec.replicas.min, in pods (torchrun --nnodes=MIN:); the minimum in ranks is this x NPROC_PER_WORKER",
    field="min_workers",
    set_by=OP,
)
MAX_WORKERS = _var(
    "MAX_WORKERS", int, "spec.replicas.max, in pods (torchrun --nnodes=:MAX)", field="max_workers", set_by=OP
)
STARTUP_WORKERS = _var(
    "STARTUP_WORKERS",
    int,
    "workers the job has once this pod's batch exists: a new agent waits (bounded) for that many to arrive"
    " before its first rendezvous, so the first world forms at that size, not 0->2->4",
    set_by=OP,
)
STORE_WAIT_SECONDS = _var(
    "STORE_WAIT_SECONDS",
    float,
    "how long an agent waits for the job's rendezvous store to answer before its first rendezvous"
    " (spec.failurePolicy.startupDeadlineSeconds): a store that starts late is waited for, not a failure",
    set_by=OP,
)
NPROC_PER_WORKER = _var(
    "NPROC_PER_WORKER",
    int,
    "training processes (ranks) per worker pod: spec.trainer.procsPerWorker (default: GPUs, else 1); "
    "torchrun --nproc-per-node",
    field="procs_per_worker",
    set_by=OP,
)
GLOBAL_BATCH_SIZE = _var(
    "GLOBAL_BATCH_SIZE",
    int,
    "samples per optimizer step: always (FixedGlobalBatch), or at the minimum in ranks (DynamicSGD)",
    field="global_batch_size",
    flag=True,
    set_by=OP,
)
MICRO_BATCH_SIZE = _var(
    "MICRO_BATCH_SIZE",
    int,
    "samples per process per forward pass",
    field="micro_batch_size",
    flag=True,
    set_by=OP,
)
RESIZE_POLICY = _var(
    "RESIZE_POLICY", str, "FixedGlobalBatch or DynamicSGD", field="resize_policy", flag=True, set_by=OP
)
DSGD_RAMP_STEPS = _var(
    "DSGD_RAMP_STEPS",
    int,
    "DynamicSGD's ramp length T in steps",
    field="dsgd_ramp_steps",
    flag=True,
    set_by=OP,
)
EPOCHS = _var("EPOCHS", int, "training length in epochs", field="epochs", flag=True, set_by=OP)
SEED = _var("SEED", int, "the training seed", field="seed", flag=True, set_by=OP)
CHECKPOINT_DIR = _var(
    "CHECKPOINT_DIR", Path, "shared checkpoint directory", field="checkpoint_dir", flag=True, set_by=OP
)
CHECKPOINT_URI = _var(
    "CHECKPOINT_URI",
    str,
    "object-store checkpoint location (s3://bucket/prefix), used instead of CHECKPOINT_DIR; empty: none",
    field="checkpoint_uri",
    flag=True,
    set_by=OP,
)
# The object stores the trainer writes checkpoints to (etj_trainer.checkpoint.object_store), and so the only
# URIs the CRD admits: a scheme it validated and the trainer then refused (gs://) failed the job at its
# first save.
CHECKPOINT_URI_SCHEMES = ("s3",)
CHECKPOINT_URI_RE = rf"^({'|'.join(CHECKPOINT_URI_SCHEMES)})://[^/\s]+(/.*)?$"
CHECKPOINT_KEEP = _var(
    "CHECKPOINT_KEEP",
    int,
    "checkpoints kept (older ones deleted)",
    field="checkpoint_keep",
    flag=True,
    set_by=OP,
)
CHECKPOINT_MAX_FAILED_WRITES = _var(
    "CHECKPOINT_MAX_FAILED_WRITES",
    int,
    "shared checkpoint writes that may fail in a row while training goes on with node-local copies; one "
    "more and the job stops with the error (spec.checkpoint.maxFailedWrites)",
    field="checkpoint_max_failed_writes",
    flag=True,
    set_by=OP,
)
TERMINATION_GRACE_SECONDS = _var(
    "TERMINATION_GRACE_SECONDS",
    int,
    "the worker pod's terminationGracePeriodSeconds: the agent gives its workers this, less a margin, to "
    "checkpoint and exit",
    set_by=OP,
)
CHECKPOINT_INTERVAL_STEPS = _var(
    "CHECKPOINT_INTERVAL_STEPS",
    int,
    "steps between checkpoints",
    field="checkpoint_interval_steps",
    flag=True,
    set_by=OP,
)
PROGRESS_URL = _var(
    "PROGRESS_URL", str, "where rank 0 POSTs progress (the rendezvous pod)", field="progress_url", set_by=OP
)
# The only operator variable that is not a literal: the pod reads it from the job's Secret (secretKeyRef),
# so the token never appears in a pod spec. The store requires it on /progress (etj_contract.progress).
PROGRESS_TOKEN = _var(
    "PROGRESS_TOKEN", str, "the job's secret for the progress endpoint (from the Secret <job>-etj-token)",
    set_by=OP,
)  # fmt: skip


@dataclass(frozen=True)
class Choice:
    """A variable with a fixed set of values (an enum on both sides; also the flag's argparse choices)."""

    options: tuple[str, ...]

    def __call__(self, raw: str) -> str:
        if raw not in self.options:
            raise ValueError(f"{raw!r} is not one of {', '.join(self.options)}")
        return raw


def floats(raw: str) -> tuple[float, ...]:
    """A comma-separated list of numbers: ``"30,60,80"`` -> ``(30.0, 60.0, 80.0)``; empty -> ``()``."""
    return tuple(float(x) for x in raw.replace(" ", "").split(",") if x)


# The training recipe (spec.training.optimizer/lrSchedule/precision/augmentation); flags of the same name.
LR = _var("LR", float, "learning rate at GLOBAL_BATCH_SIZE", field="lr", flag=True, set_by=OP)
MOMENTUM = _var("MOMENTUM", float, "SGD momentum", field="momentum", flag=True, set_by=OP)
NESTEROV = _var("NESTEROV", truthy, "Nesterov momentum", field="nesterov", flag=True, set_by=OP)
WEIGHT_DECAY = _var("WEIGHT_DECAY", float, "L2 weight decay", field="weight_decay", flag=True, set_by=OP)
NO_WD_NORM_BIAS = _var(
    "NO_WD_NORM_BIAS",
    truthy,
    "no weight decay on normalisation weights and biases (1-d parameters)",
    field="no_wd_norm_bias",
    flag=True,
    set_by=OP,
)
LABEL_SMOOTHING = _var(
    "LABEL_SMOOTHING", float, "label smoothing in [0, 1)", field="label_smoothing", flag=True, set_by=OP
)
LR_SCHEDULE = _var(
    "LR_SCHEDULE", Choice(("constant", "step", "cosine", "poly")), "the LR schedule over samples seen",
    field="lr_schedule", flag=True,
    set_by=OP,
)  # fmt: skip
WARMUP_EPOCHS = _var(
    "WARMUP_EPOCHS", float, "linear warm-up length in epochs", field="warmup_epochs", flag=True, set_by=OP
)
LR_MILESTONES = _var(
    "LR_MILESTONES",
    floats,
    "step schedule: epochs, e.g. 30,60,80",
    field="lr_milestones",
    flag=True,
    set_by=OP,
)
LR_GAMMA = _var(
    "LR_GAMMA", float, "step schedule: factor per milestone", field="lr_gamma", flag=True, set_by=OP
)
LR_POWER = _var("LR_POWER", float, "poly schedule: exponent", field="lr_power", flag=True, set_by=OP)
LR_FINAL_FRACTION = _var(
    "LR_FINAL_FRACTION",
    float,
    "cosine schedule: final LR as a fraction of the LR",
    field="lr_final_fraction",
    flag=True,
    set_by=OP,
)
PRECISION = _var(
    "PRECISION",
    Choice(("fp32", "bf16", "fp16")),
    "autocast precision",
    field="precision",
    flag=True,
    set_by=OP,
)
# The data-parallel strategy (spec.training.parallelism): how the model and its optimizer state are laid
# out over the ranks. The trainer shards with FSDP2 (HSDP: replicated groups of SHARD_GROUP_SIZE shards).
PARALLELISMS = ("DDP", "FSDP", "HSDP")
PARALLELISM = _var(
    "PARALLELISM",
    Choice(PARALLELISMS),
    "DDP (a full replica per rank), FSDP (parameters, gradients and optimizer state sharded over every "
    "rank) or HSDP (sharded within groups of SHARD_GROUP_SIZE ranks, replicated across them)",
    field="parallelism",
    flag=True,
    set_by=OP,
)
# How the workers run the user's code (spec.trainer.launcher, docs/porting.md): Etj, the built-in trainer or
# a script on etj_trainer.elastic (in-place resizes, fixed global batch); Torchrun, a stock torchrun script
# run unchanged, whose workers restart on every membership change and resume from its own checkpoint.
LAUNCHERS = ("Etj", "Torchrun")
LAUNCHER = _var(
    "LAUNCHER",
    Choice(LAUNCHERS),
    "Etj (the built-in trainer, or a script on etj_trainer.elastic) or Torchrun (a stock torchrun script, "
    "run as `python script.py` with torch elastic's environment; every membership change restarts it)",
    set_by=OP,
)
SHARD_GROUP_SIZE = _var(
    "SHARD_GROUP_SIZE",
    int,
    "HSDP: ranks per shard group (the world size must be a multiple of it; 0: a pod's ranks)",
    field="shard_group_size",
    flag=True,
    set_by=OP,
)
AUGMENT = _var(
    "AUGMENT", Choice(("none", "standard")), "standard: crop + flip", field="augment", flag=True, set_by=OP
)
MIN_CROP_SCALE = _var(
    "MIN_CROP_SCALE", float, "standard augmentation: smallest crop area", field="min_crop_scale", flag=True,
    set_by=OP,
)  # fmt: skip
AUGMENT_FLIP = _var(
    "AUGMENT_FLIP", truthy, "standard augmentation: mirror half the images", field="augment_flip", flag=True,
    set_by=OP,
)  # fmt: skip
VAL_RESIZE = _var(
    "VAL_RESIZE",
    int,
    "validation: shorter side resized to this, then center crop (0: IMAGE_SIZE)",
    field="val_resize",
    flag=True,
    set_by=OP,
)


# ---- trainer settings a user passes (spec.trainer.env) or flags of etj-train local|train ---------------
DATA = _var(
    "DATA", str, "training data: digits, digits-tensor, a folder tree or a .tar", field="data", flag=True
)
VAL_DATA = _var(
    "VAL_DATA", str, "validation data, same forms (unset: no validation)", field="val_data", flag=True
)
MODEL = _var("MODEL", str, "a torchvision model name or module:callable", field="model", flag=True)
MAX_STEPS = _var(
    "MAX_STEPS", int, "stop after this many global steps (0: all epochs)", field="max_steps", flag=True
)
NUM_CLASSES = _var("NUM_CLASSES", int, "classes of the model's output", field="num_classes")
IMAGE_SIZE = _var("IMAGE_SIZE", int, "input image side in pixels", field="image_size", flag=True)
SYNC_BATCHNORM = _var("SYNC_BATCHNORM", truthy, "synchronise BatchNorm statistics", field="sync_batchnorm")
DTYPE = _var("DTYPE", str, "float32, or float64 for bit-tight equivalence tests", field="dtype", flag=True)
MIN_STEP_SECONDS = _var(
    "MIN_STEP_SECONDS",
    float,
    "throttle: each step lasts at least this long",
    field="min_step_seconds",
    flag=True,
)
RANK_SAMPLES_PER_SECOND = _var(
    "RANK_SAMPLES_PER_SECOND",
    float,
    "throttle: each rank trains at most this many samples a second, so throughput grows with the world "
    "as on accelerators (CPU benches of the deadline policy; 0: off)",
    field="rank_samples_per_second",
    flag=True,
)
LOCAL_CHECKPOINT_DIR = _var(
    "LOCAL_CHECKPOINT_DIR",
    Path,
    "node-local copy of the last step (default /dev/shm/etj-<job>-<rdzv id> on a worker)",
    field="local_checkpoint_dir",
)
LOCAL_SNAPSHOT_INTERVAL_S = _var(
    "LOCAL_SNAPSHOT_INTERVAL_S",
    float,
    "seconds between background snapshots of the local copy (bounds the loss on a SIGKILL; default 60)",
    field="local_snapshot_interval_s",
)
CHECKPOINT_STORE_TIMEOUT_S = _var(
    "CHECKPOINT_STORE_TIMEOUT_S",
    float,
    "seconds a restore retries a checkpoint store it cannot list or read before it fails with the error "
    "(never 'no checkpoint'; default 120)",
    field="checkpoint_store_timeout_s",
    flag=True,
)
SCRIPT = _var(
    "SCRIPT",
    str,
    "your own training script and its arguments, a JSON list; workers run it instead of the built-in "
    "trainer (set by etj-train worker|local --script)",
)
SAMPLE_LOG_DIR = _var(
    "SAMPLE_LOG_DIR", Path, "log each rank's sample ids per step", field="sample_log_dir", flag=True
)
DATA_CACHE = _var("DATA_CACHE", Path, "where converted datasets are cached (default /tmp/etj-data)")
COLLECTIVE_TIMEOUT_S = _var(
    "COLLECTIVE_TIMEOUT_S", int, "bound on a collective whose peer vanished, seconds (default 120)"
)
PEER_DEAD_AFTER_S = _var(
    "PEER_DEAD_AFTER_S", float, "a peer whose heartbeat stops this long is lost: recover in place (default 1)"
)
LOG_LEVEL = _var("LOG_LEVEL", str, "the elastic agent's log level (default WARNING)")
# The elastic agent (etj-train worker); docs/trainer.md explains each.
LAST_CALL_TIMEOUT = _var("LAST_CALL_TIMEOUT", float, "seconds a round below max size waits for stragglers")
RDZV_POLL_INTERVAL = _var("RDZV_POLL_INTERVAL", float, "seconds between rendezvous state polls")
KEEP_ALIVE_INTERVAL = _var("KEEP_ALIVE_INTERVAL", int, "seconds between rendezvous keep-alives")
STARTUP_WAIT_SECONDS = _var(
    "STARTUP_WAIT_SECONDS", float, "bound on that start-up wait, seconds (default 60)"
)
FAST_RESTART = _var(
    "FAST_RESTART", truthy, "0: plain torchrun behaviour (no forkserver, no explicit leave); default on"
)
MAX_CRASH_RESTARTS = _var(
    "MAX_CRASH_RESTARTS",
    int,
    "in-pod restarts after crashes without progress before the pod fails (default 3)",
)

# ---- set by the agent for its workers ------------------------------------------------------------------
AGENT_STATE_FILE = _var(
    "AGENT_STATE_FILE", Path, "tells workers whether a SIGTERM means leave or restart", set_by=SetBy.AGENT
)
JOIN_IN_PLACE = _var(
    "JOIN_IN_PLACE", truthy, "this worker joins the running world at a step boundary", set_by=SetBy.AGENT
)
JOIN_NODE = _var(
    "JOIN_NODE",
    str,
    "this joining worker's node (one id per join attempt): a node's ranks are admitted together",
    set_by=SetBy.AGENT,
)
AGENT_PID = _var("AGENT_PID", int, "the agent's pid: its forkserver dies with it", set_by=SetBy.AGENT)
SIGTERM_GRACE_SECONDS = _var(
    "SIGTERM_GRACE_SECONDS",
    int,
    "seconds a worker has between the SIGTERM of a leave (a spot notice, a drain) and its SIGKILL: the time "
    "its node has left to checkpoint",
    set_by=SetBy.AGENT,
)

# Every variable above, in the order written (the order worker_env sets them and docs/contract.md lists them).
ALL: tuple[Var[Any], ...] = tuple(v for v in list(globals().values()) if isinstance(v, Var))
OPERATOR_SET: tuple[Var[Any], ...] = tuple(v for v in ALL if v.set_by == SetBy.OPERATOR)
RESERVED_ENV: tuple[str, ...] = tuple(v.name for v in OPERATOR_SET)
CONFIG_FIELDS: tuple[Var[Any], ...] = tuple(v for v in ALL if v.field is not None)
TRAIN_FLAGS: tuple[Var[Any], ...] = tuple(v for v in ALL if v.flag)

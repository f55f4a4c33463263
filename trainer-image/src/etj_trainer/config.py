"""Training configuration, read from the ``ETJ_*`` environment of ``etj_contract.env`` (or built directly)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from etj_contract import env as etj_env
from etj_trainer.batching.plan import ResizePolicy
from etj_trainer.batching.schedule import LrSchedule, ScheduleType
from etj_trainer.data.augment import Augmentation

E = TypeVar("E", bound=StrEnum)


class Parallelism(StrEnum):
    """How the model and its optimizer state are laid out over the ranks (spec.training.parallelism)."""

    DDP = "DDP"  # a full replica on every rank (the default)
    FSDP = "FSDP"  # FSDP2: parameters, gradients and optimizer state sharded over every rank
    HSDP = "HSDP"  # FSDP2 on a 2-D mesh: sharded within groups of shard_group_size, replicated across


DEFAULT_MICRO_BATCH = 64  # micro_batch_size when unset (0), capped at the global batch
# The counts a config must hold, with their least value (the CRD's bounds, etj_operator/api/models.py):
# a 0 or negative size used to fail deep in the sampler, after the process group and the restore.
AT_LEAST = {
    "global_batch_size": 1,
    "micro_batch_size": 1,
    "epochs": 1,
    "min_workers": 1,
    "procs_per_worker": 1,
    "max_steps": 0,
    "checkpoint_interval_steps": 0,
    "checkpoint_max_failed_writes": 0,
    "checkpoint_store_timeout_s": 0,
    "shard_group_size": 0,
}


@dataclass
class TrainConfig:
    data: str = ""  # "digits", "digits-tensor", a folder tree, or a .tar (webdataset-style) file
    val_data: str = ""  # same forms; empty = no validation
    model: str = "etj_trainer.classifier.models:small_cnn"  # torchvision name or "module:callable"
    num_classes: int = 10
    image_size: int = 32
    global_batch_size: int = 64
    # 0 (unset): the global batch, at most DEFAULT_MICRO_BATCH -- a script setting only a small global
    # batch is not refused for the default being larger (same micro-batches: a rank's share is at most
    # the global batch); one given larger than the global batch is refused, as the CRD does
    micro_batch_size: int = 0
    resize_policy: ResizePolicy = ResizePolicy.FIXED_GLOBAL_BATCH
    parallelism: Parallelism = Parallelism.DDP
    shard_group_size: int = 0  # HSDP: ranks per shard group (0: unset)
    dsgd_ramp_steps: int = 100
    min_workers: int = 1  # pods (replicas.min); batches and the regroup minimum count ranks: min_ranks
    max_workers: int = 1
    procs_per_worker: int = 1  # ranks per pod (ETJ_NPROC_PER_WORKER; unset: torchrun's LOCAL_WORLD_SIZE)
    epochs: int = 1
    max_steps: int = 0  # stop after this many global steps (0 = run all epochs)
    seed: int = 0
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    nesterov: bool = False
    no_wd_norm_bias: bool = True  # no weight decay on BatchNorm/LayerNorm weights and biases (1-d params)
    label_smoothing: float = 0.0
    # LR schedule over samples seen (schedule.py); the LR above belongs to global_batch_size
    lr_schedule: ScheduleType = ScheduleType.CONSTANT
    warmup_epochs: float = 0.0
    lr_milestones: tuple[float, ...] = ()
    lr_gamma: float = 0.1
    lr_power: float = 1.0
    lr_final_fraction: float = 0.0
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast; fp16 with a GradScaler)
    augment: Augmentation = Augmentation.NONE
    min_crop_scale: float = 0.08  # "standard": random-resized-crop area fraction in [min_crop_scale, 1]
    augment_flip: bool = True  # "standard": mirror half the images (off for digits, text)
    val_resize: int = 0  # validation: shorter side resized to this, then center crop (0: image_size)
    sync_batchnorm: bool = False
    checkpoint_dir: Path | None = None
    checkpoint_uri: str | None = (
        None  # s3://bucket/prefix: the shared copy goes there instead (object_store.py)
    )
    checkpoint_keep: int = 3
    # Shared writes that may fail in a row (training goes on with node-local copies) before the job stops
    # with the error; and how long a restore retries a store it cannot read (checkpoint/retry.py).
    checkpoint_max_failed_writes: int = 3
    checkpoint_store_timeout_s: float = 120.0
    checkpoint_interval_steps: int = 100
    # node-local copy, e.g. /dev/shm/etj-<job>: written when the process stops, and snapshotted in the
    # background every local_snapshot_interval_s (checkpoint.StateWriter)
    local_checkpoint_dir: Path | None = None
    local_snapshot_interval_s: float = 60.0
    progress_url: str = ""
    sample_log_dir: Path | None = None  # log each rank's sample ids per step (exactly-once checks)
    dtype: str = "float32"  # "float64" for bit-tight equivalence tests
    job_name: str = "local"
    deterministic: bool = True
    dali_threads: int = 2
    min_step_seconds: float = 0.0  # throttle (demos/tests on a laptop: makes resizes land mid-training)
    # Throttle per rank: on a CPU machine more workers do not train faster (they share the cores); with it
    # a step lasts at least its share / this, so the world's rate grows with its size as on GPUs.
    rank_samples_per_second: float = 0.0

    def step_floor_s(self, rank_samples: int) -> float:
        """The shortest a step may last under the throttles, for a rank training ``rank_samples``."""
        rate = self.rank_samples_per_second
        return max(self.min_step_seconds, rank_samples / rate if rate > 0 else 0.0)

    def __post_init__(self) -> None:
        """The one validation of a config, from the environment, ``Job`` keywords or built directly: a
        value that is not one of a setting's choices, a size below its least, a micro-batch larger than
        the global batch are refused here, before any process group or collective."""
        # The environment gives text; the contract module is standard-library only.
        self.resize_policy = _one_of("resize_policy", ResizePolicy, self.resize_policy)
        self.lr_schedule = _one_of("lr_schedule", ScheduleType, self.lr_schedule)
        self.augment = _one_of("augment", Augmentation, self.augment)
        self.parallelism = _one_of("parallelism", Parallelism, self.parallelism)
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision={self.precision!r} is not one of fp32, bf16, fp16")
        if self.micro_batch_size == 0:
            self.micro_batch_size = min(DEFAULT_MICRO_BATCH, self.global_batch_size)
        for name, least in AT_LEAST.items():
            if getattr(self, name) < least:
                raise ValueError(f"{name}={getattr(self, name)!r} must be at least {least}")
        if self.micro_batch_size > self.global_batch_size:
            raise ValueError(
                f"micro_batch_size={self.micro_batch_size} must not be greater than "
                f"global_batch_size={self.global_batch_size}"
            )
        self._check_sharding()

    def _check_sharding(self) -> None:
        """Only HSDP takes a shard-group size (unset: a pod's ranks, ``shard_group``). A sharded state is
        written with torch.distributed.checkpoint to a file system every rank shares (checkpoint_dir); the
        object-store copy does not take it yet (docs/trainer.md, "Sharded models"): refused, not ignored."""
        if self.parallelism != Parallelism.HSDP and self.shard_group_size:
            raise ValueError(
                f"shard_group_size={self.shard_group_size} is for parallelism='HSDP', "
                f"not {self.parallelism.value!r}"
            )
        if self.parallelism != Parallelism.DDP and self.checkpoint_uri:
            raise ValueError(
                f"parallelism={self.parallelism.value!r} checkpoints with torch.distributed.checkpoint to "
                "checkpoint_dir (a volume every rank shares); checkpoint_uri (s3://) takes DDP "
                "checkpoints only for now"
            )

    @property
    def shard_group(self) -> int:
        """HSDP's ranks per shard group: as set, else a pod's ranks (shards within a node's fast links,
        replicas across nodes)."""
        return self.shard_group_size or self.procs_per_worker

    @property
    def sharded(self) -> bool:
        """FSDP or HSDP: the state is sharded over the ranks (DCP checkpoints; a crash restarts the world)."""
        return self.parallelism != Parallelism.DDP

    @property
    def hsdp(self) -> bool:
        """HSDP: every resize restarts the world (its mesh needs whole shard groups)."""
        return self.parallelism == Parallelism.HSDP

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> TrainConfig:
        """The variables of ``etj_contract.env`` that name a config field, then ``overrides`` (by field)."""
        e = os.environ if env is None else env
        names = {f.name for f in fields(cls)}
        for k in overrides:
            if k not in names:
                raise TypeError(f"unknown config field {k}")
        values: dict[str, Any] = {}
        for var in etj_env.CONFIG_FIELDS:
            value = var.read(e)
            if value is not None and var.field is not None:
                values[var.field] = value
        if "procs_per_worker" not in values and e.get("LOCAL_WORLD_SIZE"):
            # Under a plain `torchrun --nproc-per-node N` (no etj agent): its processes per node.
            values["procs_per_worker"] = int(e["LOCAL_WORLD_SIZE"])
        # The overrides go through the constructor's checks with the rest: set afterwards, a typo
        # (lr_schedule="cosin") used to train on another schedule.
        cfg = cls(**{**values, **overrides})
        rdzv_id = etj_env.RDZV_ID.read(e)
        if (
            cfg.local_checkpoint_dir is None
            and "local_checkpoint_dir" not in overrides
            and rdzv_id is not None
            and Path("/dev/shm").is_dir()
        ):
            # Per job run (the rendezvous id is the job uid): /dev/shm is shared by every process of the pod
            # (and of the laptop); without a run id a stale copy from another run could be picked up.
            cfg.local_checkpoint_dir = Path("/dev/shm") / f"etj-{cfg.job_name}-{rdzv_id}"
        return cfg

    @classmethod
    def with_defaults(
        cls, defaults: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> tuple[TrainConfig, dict[str, tuple[Any, Any]]]:
        """The config in etj's one precedence order: the ``ETJ_*`` environment (the operator, ``etj-train``
        flags, ``spec.trainer.env``) over ``defaults`` (a script's own values, ``Job(lr=...)``) over the
        field defaults. Returns it and what the environment overrode: ``{field: (given, from env)}``."""
        e = os.environ if env is None else env
        unknown = set(defaults) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown config fields {sorted(unknown)}")
        set_by_env = {v.field for v in etj_env.CONFIG_FIELDS if v.read(e) is not None}
        cfg = cls.from_env(e, **{k: v for k, v in defaults.items() if k not in set_by_env})
        overridden = {
            k: (v, getattr(cfg, k))
            for k, v in defaults.items()
            if k in set_by_env and str(getattr(cfg, k)) != str(v)
        }
        return cfg, overridden

    @property
    def min_ranks(self) -> int:
        """The job's minimum in ranks (training processes): replicas.min x processes per pod."""
        return self.min_workers * self.procs_per_worker

    def schedule(self) -> LrSchedule:
        """The LR schedule (validated: warm-up shorter than training, milestones inside it)."""
        return LrSchedule(
            type=self.lr_schedule,
            epochs=self.epochs,
            warmup_epochs=self.warmup_epochs,
            milestones=tuple(self.lr_milestones),
            gamma=self.lr_gamma,
            power=self.lr_power,
            final_lr_fraction=self.lr_final_fraction,
        )


def _one_of(name: str, kind: type[E], value: str) -> E:
    """``value`` as a member of ``kind``, or a ValueError naming the setting and its choices."""
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(m.value for m in kind)}") from None


class ConfigIgnored(UserWarning):
    """A config setting that the script's own optimizer (not ``job.setup_dynamic_sgd``'s) does not follow."""


def ignored_by_own_optimizer(cfg: TrainConfig, optimizer_lr: float) -> list[str]:
    """The LR settings of ``cfg`` an optimizer built by the script itself does not follow: the schedule
    (etj applies it to ``DynamicSGD`` only), and an ``lr`` set (not the default) other than its own."""
    ignored = []
    if cfg.lr_schedule != ScheduleType.CONSTANT or cfg.warmup_epochs > 0:
        ignored.append(f"lr_schedule={cfg.lr_schedule.value!r}, warmup_epochs={cfg.warmup_epochs}")
    if cfg.lr != TrainConfig.lr and cfg.lr != optimizer_lr:
        ignored.append(f"lr={cfg.lr} (the optimizer's: {optimizer_lr})")
    return ignored


class ConfigOverridden(UserWarning):
    """A ``Job`` keyword that the ``ETJ_*`` environment set to another value (the environment wins)."""


def config_for_job(config: TrainConfig | None, defaults: Mapping[str, Any]) -> TrainConfig:
    """``Job``'s config in etj's one precedence order: ``config`` as given (with no keywords beside it),
    else ``TrainConfig.with_defaults``, warning on rank 0 of each keyword the environment overrode."""
    if config is not None:
        if defaults:
            raise TypeError(
                f"Job(config=...) is used as given: pass {sorted(defaults)} in the TrainConfig instead"
            )
        return config
    cfg, overridden = TrainConfig.with_defaults(defaults)
    if os.environ.get("RANK", "0") == "0":  # one warning per job, not one per rank
        for name, (given, env_value) in sorted(overridden.items()):
            var = next(v.name for v in etj_env.CONFIG_FIELDS if v.field == name)
            warnings.warn(
                f"Job({name}={given!r}) is overridden by {var}={env_value!r} from the environment "
                "(the environment comes first: the operator's job spec, etj-train flags)",
                ConfigOverridden,
                stacklevel=4,  # config_for_job <- Job.__init__ <- the script
            )
    return cfg

"""Training configuration, read from the ``ETJ_*`` environment of docs/contract.md (or built directly)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from etj_trainer.augment import Augmentation
from etj_trainer.batching import ResizePolicy
from etj_trainer.schedule import LrSchedule, ScheduleType, parse_milestones


@dataclass
class TrainConfig:
    data: str = ""  # "digits", "digits-tensor", a folder tree, or a .tar (webdataset-style) file
    val_data: str = ""  # same forms; empty = no validation
    model: str = "etj_trainer.models:small_cnn"  # torchvision name or "module:callable"
    num_classes: int = 10
    image_size: int = 32
    global_batch_size: int = 64
    micro_batch_size: int = 64
    resize_policy: ResizePolicy = ResizePolicy.FIXED_GLOBAL_BATCH
    dsgd_ramp_steps: int = 100
    min_workers: int = 1
    max_workers: int = 1
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
    val_resize: int = 0  # validation: shorter side resized to this, then center crop (0: image_size)
    sync_batchnorm: bool = False
    checkpoint_dir: Path | None = None
    checkpoint_interval_steps: int = 100
    local_checkpoint_dir: Path | None = None  # fast copy, e.g. /dev/shm/etj-<job>; written every step
    progress_url: str = ""
    sample_log_dir: Path | None = None  # log each rank's sample ids per step (exactly-once checks)
    dtype: str = "float32"  # "float64" for bit-tight equivalence tests
    job_name: str = "local"
    deterministic: bool = True
    dali_threads: int = 2
    min_step_seconds: float = 0.0  # throttle (demos/tests on a laptop: makes resizes land mid-training)
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> TrainConfig:
        e = os.environ if env is None else env
        cfg = cls()

        def get(name: str) -> str | None:
            v = e.get(name)
            return v if v not in (None, "") else None

        ints = {
            "ETJ_GLOBAL_BATCH_SIZE": "global_batch_size",
            "ETJ_MICRO_BATCH_SIZE": "micro_batch_size",
            "ETJ_DSGD_RAMP_STEPS": "dsgd_ramp_steps",
            "ETJ_MIN_WORKERS": "min_workers",
            "ETJ_MAX_WORKERS": "max_workers",
            "ETJ_EPOCHS": "epochs",
            "ETJ_SEED": "seed",
            "ETJ_CHECKPOINT_INTERVAL_STEPS": "checkpoint_interval_steps",
            "ETJ_MAX_STEPS": "max_steps",
            "ETJ_NUM_CLASSES": "num_classes",
            "ETJ_IMAGE_SIZE": "image_size",
            "ETJ_VAL_RESIZE": "val_resize",
        }
        for var, attr in ints.items():
            if (v := get(var)) is not None:
                setattr(cfg, attr, int(v))
        strs = {
            "ETJ_DATA": "data",
            "ETJ_VAL_DATA": "val_data",
            "ETJ_MODEL": "model",
            "ETJ_PROGRESS_URL": "progress_url",
            "ETJ_JOB_NAME": "job_name",
            "ETJ_DTYPE": "dtype",
            "ETJ_PRECISION": "precision",
        }
        for var, attr in strs.items():
            if (v := get(var)) is not None:
                setattr(cfg, attr, v)
        for var, attr in (
            ("ETJ_LR", "lr"),
            ("ETJ_MOMENTUM", "momentum"),
            ("ETJ_MIN_STEP_SECONDS", "min_step_seconds"),
            ("ETJ_WEIGHT_DECAY", "weight_decay"),
            ("ETJ_LABEL_SMOOTHING", "label_smoothing"),
            ("ETJ_WARMUP_EPOCHS", "warmup_epochs"),
            ("ETJ_LR_GAMMA", "lr_gamma"),
            ("ETJ_LR_POWER", "lr_power"),
            ("ETJ_LR_FINAL_FRACTION", "lr_final_fraction"),
            ("ETJ_MIN_CROP_SCALE", "min_crop_scale"),
        ):
            if (v := get(var)) is not None:
                setattr(cfg, attr, float(v))
        if (v := get("ETJ_RESIZE_POLICY")) is not None:
            cfg.resize_policy = ResizePolicy(v)
        for var, attr in (
            ("ETJ_SYNC_BATCHNORM", "sync_batchnorm"),
            ("ETJ_NESTEROV", "nesterov"),
            ("ETJ_NO_WD_NORM_BIAS", "no_wd_norm_bias"),
        ):
            if (v := get(var)) is not None:
                setattr(cfg, attr, v.lower() in ("1", "true", "yes"))
        if (v := get("ETJ_LR_SCHEDULE")) is not None:
            cfg.lr_schedule = ScheduleType(v)
        if (v := get("ETJ_LR_MILESTONES")) is not None:
            cfg.lr_milestones = parse_milestones(v)
        if (v := get("ETJ_AUGMENT")) is not None:
            cfg.augment = Augmentation(v)
        if (v := get("ETJ_CHECKPOINT_DIR")) is not None:
            cfg.checkpoint_dir = Path(v)
        if (v := get("ETJ_LOCAL_CHECKPOINT_DIR")) is not None:
            cfg.local_checkpoint_dir = Path(v)
        elif get("ETJ_RDZV_ID") is not None and Path("/dev/shm").is_dir():
            # Per job run (the rendezvous id is the job uid): /dev/shm is shared by every process of the pod
            # (and of the laptop); without a run id a stale copy from another run could be picked up.
            cfg.local_checkpoint_dir = Path("/dev/shm") / f"etj-{cfg.job_name}-{e['ETJ_RDZV_ID']}"
        if (v := get("ETJ_SAMPLE_LOG_DIR")) is not None:
            cfg.sample_log_dir = Path(v)
        names = {f.name for f in fields(cls)}
        for k, val in overrides.items():
            if k not in names:
                raise TypeError(f"unknown config field {k}")
            setattr(cfg, k, val)
        return cfg

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

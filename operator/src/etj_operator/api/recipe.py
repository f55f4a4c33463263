"""The training recipe of a job: optimizer, LR schedule, precision, augmentation (``spec.training.*``).

Each setting reaches the trainer as one ``ETJ_*`` variable (``pod_env.recipe_env``, docs/contract.md) of the
same meaning as an ``etj-train`` flag. The LR schedule is defined over samples seen (epochs), never steps or
wall time, so a resize leaves it where it was; under DynamicSGD the Dynamic SGD multiplier multiplies it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from etj_operator.api._base import ApiModel, Check, CheckedModel

DEFAULT_LR_PER_256 = 0.1  # Goyal et al. 2017: 0.1 per 256 samples (linear scaling rule)


class ScheduleType(StrEnum):
    """Shape of the LR after warm-up."""

    CONSTANT = "constant"
    STEP = "step"
    COSINE = "cosine"
    POLY = "poly"


class Precision(StrEnum):
    """Arithmetic of forward and backward passes (weights and optimizer stay fp32)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class Parallelism(StrEnum):
    """How the model and its optimizer state are laid out over the ranks (the trainer's FSDP2)."""

    DDP = "DDP"
    FSDP = "FSDP"
    HSDP = "HSDP"


class AugmentationType(StrEnum):
    """Training-image augmentation."""

    NONE = "none"
    STANDARD = "standard"


class OptimizerSpec(CheckedModel):
    """SGD with momentum: learning rate (absolute or per 256 samples), weight decay, label smoothing."""

    checks = (
        Check(
            "!(has(self.lr) && has(self.lrPer256))",
            "set training.optimizer.lr or training.optimizer.lrPer256, not both",
            lambda o: o.lr is None or o.lr_per256 is None,
        ),
    )

    lr: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="Learning rate at training.globalBatchSize (ETJ_LR). Unset: lrPer256 x globalBatchSize "
        "/ 256.",
    )
    lr_per256: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="Learning rate per 256 samples (linear scaling rule: LR = lrPer256 x globalBatchSize / "
        f"256). Unset and lr unset: {DEFAULT_LR_PER_256}.",
    )
    momentum: float = Field(default=0.9, ge=0, lt=1, description="SGD momentum (ETJ_MOMENTUM).")
    nesterov: bool = Field(default=False, description="Nesterov momentum (ETJ_NESTEROV).")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="L2 weight decay (ETJ_WEIGHT_DECAY).")
    no_weight_decay_on_norm_and_bias: bool = Field(
        default=True,
        description="Exempt normalisation weights and biases (1-d parameters) from weight decay "
        "(ETJ_NO_WD_NORM_BIAS).",
    )
    label_smoothing: float = Field(
        default=0.0, ge=0, lt=1, description="Label smoothing of the cross-entropy loss, in [0, 1)."
    )

    def lr_at(self, global_batch_size: int) -> float:
        """The LR the trainer gets: ``lr``, else the linear scaling rule."""
        if self.lr is not None:
            return self.lr
        return (self.lr_per256 or DEFAULT_LR_PER_256) * global_batch_size / 256


class LrScheduleSpec(CheckedModel):
    """LR over training, as a function of samples seen (epochs): linear warm-up, then constant, step, cosine
    or poly decay. Multiplied by the Dynamic SGD multiplier under DynamicSGD."""

    checks = (
        Check(
            "!has(self.milestones) || (self.milestones.isSorted() && "
            "self.milestones.all(m, self.milestones.filter(x, x == m).size() == 1))",
            "training.lrSchedule.milestones must be strictly increasing",
            lambda s: all(a < b for a, b in zip(s.milestones, s.milestones[1:], strict=False)),
            field_path=".milestones",
        ),
        Check(
            # has(): the apiserver also checks rules against the section's `default: {}` (nothing filled in)
            "!has(self.type) || self.type != 'step' || (has(self.milestones) && size(self.milestones) > 0)",
            "training.lrSchedule.milestones must name at least one epoch when type is step",
            lambda s: s.type != ScheduleType.STEP or len(s.milestones) > 0,
            field_path=".milestones",
        ),
    )

    type: ScheduleType = Field(
        default=ScheduleType.CONSTANT, description="constant, step, cosine or poly (ETJ_LR_SCHEDULE)."
    )
    warmup_epochs: float = Field(
        default=0.0,
        ge=0,
        le=100_000,
        description="Linear warm-up from 0 to the LR over this many epochs; less than training.epochs.",
    )
    milestones: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=list,
        max_length=64,
        description="Epochs at which a step schedule multiplies the LR by gamma: increasing, each less than "
        "training.epochs (ETJ_LR_MILESTONES).",
    )
    gamma: float = Field(default=0.1, gt=0, le=1, description="Factor per milestone of a step schedule.")
    power: float = Field(default=1.0, gt=0, le=10, description="Exponent of a poly schedule, (1 - t)^power.")
    final_lr_fraction: float = Field(
        default=0.0, ge=0, le=1, description="Where a cosine schedule ends, as a fraction of the LR."
    )


class AugmentationSpec(ApiModel):
    """Training-image augmentation, drawn from (seed, epoch, sample id) only so it is the same on any rank."""

    type: AugmentationType = Field(
        default=AugmentationType.NONE,
        description="standard: random-resized crop + horizontal flip; none: resize + center crop "
        "(ETJ_AUGMENT).",
    )
    min_crop_scale: float = Field(
        default=0.08,
        gt=0,
        le=1,
        description="Smallest crop of a standard augmentation, as a fraction of the image area.",
    )
    horizontal_flip: bool = Field(
        default=True,
        description="standard: mirror half of the training images left-right. Turn it off for images a "
        "mirror changes the meaning of, such as digits or text (ETJ_AUGMENT_FLIP).",
    )
    validation_resize: int | None = Field(
        default=None,
        ge=1,
        le=16_384,
        description="Validation (and unaugmented training) images: the shorter side is resized to this, then "
        "center-cropped to the training size. Unset: the training size (ETJ_VAL_RESIZE).",
    )


def epoch_checks() -> tuple[Check, ...]:
    """Rules between the schedule and ``training.epochs`` (they live on TrainingSpec, which sees both)."""
    return (
        Check(
            "!has(self.lrSchedule) || !has(self.lrSchedule.warmupEpochs) || "
            "self.lrSchedule.warmupEpochs < double(self.epochs)",
            "training.lrSchedule.warmupEpochs must be less than training.epochs",
            lambda t: t.lr_schedule.warmup_epochs < t.epochs,
            field_path=".lrSchedule.warmupEpochs",
        ),
        Check(
            "!has(self.lrSchedule) || !has(self.lrSchedule.milestones) || "
            "self.lrSchedule.milestones.all(m, m < double(self.epochs))",
            "training.lrSchedule.milestones must each be less than training.epochs",
            lambda t: all(m < t.epochs for m in t.lr_schedule.milestones),
            field_path=".lrSchedule.milestones",
        ),
    )


def parallelism_checks() -> tuple[Check, ...]:
    """``training.shardGroupSize`` is HSDP's (unset there: a pod's ranks)."""
    return (
        Check(
            "!has(self.shardGroupSize) || (has(self.parallelism) && self.parallelism == 'HSDP')",
            "training.shardGroupSize (ranks per shard group) is for training.parallelism HSDP only",
            lambda t: t.shard_group_size is None or t.parallelism == Parallelism.HSDP,
            field_path=".shardGroupSize",
        ),
    )

"""Learning-rate schedules defined over samples seen (epochs), never over steps or wall time.

A step's LR is ``base_lr * factor(position) * dynamic_sgd_multiplier``. The position is where the sampler
stands in *epochs* (``epoch + consumed / dataset_size``), which is what the elastic sampler checkpoints and
re-splits on every resize: so a resize, whatever the new world size, leaves the schedule exactly where it
was, and under FixedGlobalBatch an elastic run sees the same LR sequence as a fixed one (a step count
would too, but wall time would not, and under DynamicSGD the number of steps per epoch changes with the
world size while samples per epoch do not).

* warm-up: linear over ``warmup_epochs``, evaluated at the position *after* the step (the first step
  trains at ``B / (warmup_epochs * N)`` of the LR rather than at 0, as in Goyal et al. 2017's gradual
  warm-up);
* after warm-up, evaluated at the position *before* the step (so every step of an epoch shares the
  epoch's LR for ``step``, and the decay starts where warm-up ends):
  ``constant`` 1; ``step``: ``gamma ** (milestones passed)``; ``cosine``: from 1 down to
  ``final_lr_fraction`` over ``[warmup_epochs, epochs]``; ``poly``: ``(1 - t) ** power`` over the same span.

Under DynamicSGD the Dynamic SGD multiplier (batch follows the world size, see dynamic_sgd.py) multiplies
this factor: the schedule says *where in training* we are, the multiplier *how large the batch is now*.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum


class ScheduleType(StrEnum):
    CONSTANT = "constant"
    STEP = "step"
    COSINE = "cosine"
    POLY = "poly"


@dataclass(frozen=True)
class LrSchedule:
    type: ScheduleType = ScheduleType.CONSTANT
    epochs: int = 1  # the training length the decay spans
    warmup_epochs: float = 0.0
    milestones: tuple[float, ...] = field(default=())  # epochs, for "step"
    gamma: float = 0.1
    power: float = 1.0  # for "poly"
    final_lr_fraction: float = 0.0  # for "cosine"

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError("epochs must be at least 1")
        if not 0 <= self.warmup_epochs < self.epochs:
            raise ValueError("warmup_epochs must be in [0, epochs)")
        if list(self.milestones) != sorted(set(self.milestones)) or any(
            not 0 < m < self.epochs for m in self.milestones
        ):
            raise ValueError("milestones must be increasing and inside (0, epochs)")
        if not 0 <= self.final_lr_fraction <= 1:
            raise ValueError("final_lr_fraction must be in [0, 1]")


def lr_factor(s: LrSchedule, before: float, after: float) -> float:
    """Multiplier of the base LR for a step that moves the position from ``before`` to ``after`` epochs."""
    if s.warmup_epochs > 0 and before < s.warmup_epochs:
        return min(1.0, after / s.warmup_epochs)
    if s.type == ScheduleType.CONSTANT:
        return 1.0
    if s.type == ScheduleType.STEP:
        return float(s.gamma ** sum(1 for m in s.milestones if before >= m))
    span = s.epochs - s.warmup_epochs
    t = min(1.0, max(0.0, (before - s.warmup_epochs) / span))
    if s.type == ScheduleType.COSINE:
        return s.final_lr_fraction + (1 - s.final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * t))
    return float((1 - t) ** s.power)


def position(epoch: int, consumed: int, dataset_size: int) -> float:
    """The sampler's position in epochs (a step never crosses an epoch, so ``consumed < dataset_size``)."""
    return epoch + consumed / dataset_size


def parse_milestones(text: str) -> tuple[float, ...]:
    """``"30,60,80"`` -> ``(30.0, 60.0, 80.0)``; empty -> ``()``."""
    return tuple(float(m) for m in text.replace(" ", "").split(",") if m)

"""What every batch source shares: the micro-batch stream's items, the augmentation draw, the normalisation.

Split from sources.py (the in-memory sources and ``open_source``) so that the DALI source, which
sources.py opens, and sources.py itself both build on it without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from etj_trainer.data.augment import Augmentation, Crops, draw_crops

MEAN, STD = 0.5, 0.25  # digits are grey scale; the same constants are used by the DALI path


@dataclass(frozen=True)
class Micro:
    """One micro-batch of sample ids and the epoch they belong to (augmentation draws depend on it)."""

    epoch: int
    ids: np.ndarray


# A source takes a stream of micro-batches; a bare id array means "epoch 0" (validation, tests).
StreamItem = Micro | np.ndarray


def unpack(item: StreamItem) -> Micro:
    return item if isinstance(item, Micro) else Micro(0, np.asarray(item))


@dataclass(frozen=True)
class Augmenter:
    """The training split's augmentation: draws depend on (seed, epoch, sample id) only (augment.py)."""

    policy: Augmentation = Augmentation.NONE
    seed: int = 0
    min_scale: float = 0.08
    flip: bool = True

    @property
    def on(self) -> bool:
        return self.policy == Augmentation.STANDARD

    def crops(self, m: Micro) -> Crops:
        return draw_crops(self.seed, m.epoch, m.ids, self.min_scale, self.flip)


class BatchSource(Protocol):
    num_samples: int
    sample_shape: tuple[int, ...]  # C, H, W: lets a rank with an empty share build an empty batch

    def batches(self, index_stream: Iterator[StreamItem]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def close(self) -> None: ...

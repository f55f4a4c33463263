"""Elastic, exactly-once sampler.

The position inside an epoch is kept as ONE global counter (samples of the epoch's permutation already
trained on), never as per-rank offsets. A step takes the next ``B`` indices of the permutation and splits
them over the *current* world size, so after a resize the remaining samples are simply re-split over the
new ranks: nothing is skipped or repeated, whatever the schedule of world sizes (DALI#2849, accelerate
#4233 are the per-rank-offset bugs this avoids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from etj_trainer.batching.plan import split_counts


@dataclass
class SamplerState:
    epoch: int = 0
    consumed: int = 0  # samples of this epoch's permutation already committed (all ranks together)


class ElasticSampler:
    """Seeded per-epoch permutation with a global position, re-split over any world size."""

    def __init__(self, dataset_size: int, seed: int, shuffle: bool = True) -> None:
        if dataset_size <= 0:
            raise ValueError(f"dataset_size={dataset_size} must be positive")
        self.dataset_size = dataset_size
        self.seed = seed
        self.shuffle = shuffle
        self.state = SamplerState()
        self._perm_epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        # Seeded by (seed, epoch) only, so every rank and every restarted process derives the same order
        # without communicating it.
        if epoch != self._perm_epoch:
            if self.shuffle:
                rng = np.random.default_rng([self.seed, epoch])
                self._perm = rng.permutation(self.dataset_size).astype(np.int64)
            else:
                self._perm = np.arange(self.dataset_size, dtype=np.int64)
            self._perm_epoch = epoch
        return self._perm

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def remaining(self) -> int:
        return self.dataset_size - self.state.consumed

    def next_global_batch(self, global_batch: int) -> np.ndarray:
        """Indices of the next step (short at the end of an epoch; a step never crosses epochs)."""
        if global_batch <= 0:
            raise ValueError("global_batch must be positive")
        start = self.state.consumed
        return self.permutation(self.state.epoch)[start : start + global_batch]

    def commit(self, count: int) -> None:
        """Mark ``count`` samples as trained on; rolls over to the next epoch at the end."""
        if count < 0 or count > self.remaining:
            raise ValueError(f"cannot commit {count} samples, {self.remaining} remain")
        self.state.consumed += count
        if self.state.consumed == self.dataset_size:
            self.state = SamplerState(epoch=self.state.epoch + 1, consumed=0)

    @staticmethod
    def rank_slice(global_indices: np.ndarray, world_size: int, rank: int) -> np.ndarray:
        """This rank's contiguous share of a step's indices (uneven shares allowed)."""
        counts = split_counts(len(global_indices), world_size)
        start = sum(counts[:rank])
        return global_indices[start : start + counts[rank]]

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.state.epoch,
            "consumed": self.state.consumed,
            "seed": self.seed,
            "dataset_size": self.dataset_size,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        # A different dataset or seed would make the saved position meaningless: refuse instead of
        # silently duplicating or skipping samples.
        if (
            sd["dataset_size"] != self.dataset_size
            or sd["seed"] != self.seed
            or sd["shuffle"] != self.shuffle
        ):
            raise ValueError(f"sampler state does not match this dataset/seed: {sd}")
        self.state = SamplerState(epoch=int(sd["epoch"]), consumed=int(sd["consumed"]))

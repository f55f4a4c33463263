"""How a step's samples are split over ranks and micro-batches, and how gradients are weighted.

Fixed global batch: every rank sums its per-sample losses and scales by ``world_size / step_samples``.
DistributedDataParallel averages gradients over ranks (divides by ``world_size``), so the all-reduced
gradient is ``sum_i grad(loss_i) / step_samples`` -- exactly the single-process mean-loss gradient on the
same samples, even when shares are uneven or a rank has none (equal-weight averaging would be biased).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np


class ResizePolicy(StrEnum):
    FIXED_GLOBAL_BATCH = "FixedGlobalBatch"
    DYNAMIC_SGD = "DynamicSGD"


def split_counts(total: int, parts: int) -> list[int]:
    """Split ``total`` items over ``parts`` evenly; the first ``total % parts`` parts get one more."""
    if parts <= 0:
        raise ValueError("parts must be positive")
    if total < 0:
        raise ValueError("total must be non-negative")
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def micro_batch_sizes(count: int, micro_batch: int) -> list[int]:
    """Chunk a rank's share into micro-batches of at most ``micro_batch`` (gradient accumulation)."""
    if micro_batch <= 0:
        raise ValueError("micro_batch must be positive")
    if count == 0:
        return []
    n = math.ceil(count / micro_batch)
    # Even chunks rather than "full chunks + remainder": same accumulation count, better balanced.
    return split_counts(count, n)


def micro_slices(ids: np.ndarray, micro_batch: int) -> list[np.ndarray]:
    """A rank's share of sample ids cut into its micro-batches (``micro_batch_sizes``), in order; views."""
    slices, start = [], 0
    for n in micro_batch_sizes(len(ids), micro_batch):
        slices.append(ids[start : start + n])
        start += n
    return slices


def loss_scale(world_size: int, step_samples: int) -> float:
    """Factor for a rank's *summed* loss so that DDP's mean over ranks gives the global mean gradient."""
    if step_samples <= 0:
        raise ValueError("step_samples must be positive")
    return world_size / step_samples


@dataclass(frozen=True)
class BatchPlan:
    """What one step looks like at a given world size (in ranks)."""

    global_batch: int
    per_rank_batch: int  # the largest rank's share
    per_worker_batch: int  # the largest pod's share: its ranks' shares together (for reporting)
    accumulation_steps: int  # micro-batches of the largest rank's share
    lr_target: float  # LR multiplier the policy asks for at this world size


def plan_step(
    policy: ResizePolicy,
    global_batch: int,
    micro_batch: int,
    ranks: int,
    min_ranks: int,
    procs_per_worker: int = 1,
) -> BatchPlan:
    """Global batch and LR target for a world of ``ranks`` training processes.

    Every count here is in ranks (processes), never pods: a pod runs ``procs_per_worker`` of them, and the
    job's minimum is ``min_ranks = replicas.min x procs_per_worker``. FixedGlobalBatch keeps ``B =
    GLOBAL_BATCH_SIZE`` at every size, so the LR never changes. DynamicSGD keeps the per-rank batch ``b =
    GLOBAL_BATCH_SIZE // min_ranks`` and lets ``B = n*b`` follow the ranks ``n``: ``GLOBAL_BATCH_SIZE`` is the
    batch at the minimum, the configured LR belongs to it, and the target multiplier is ``n*b /
    GLOBAL_BATCH_SIZE`` (linear scaling): exactly 1 at the minimum when ``min_ranks`` divides the batch (the
    operator requires that), and DynamicSGD ramps towards it.
    """
    if policy == ResizePolicy.FIXED_GLOBAL_BATCH:
        b_global = global_batch
        lr_target = 1.0
    else:
        per_rank = max(1, global_batch // max(1, min_ranks))
        b_global = per_rank * ranks
        lr_target = b_global / global_batch
    shares = split_counts(b_global, ranks)
    # torch elastic numbers a pod's ranks consecutively and split_counts gives the extra samples to the
    # first ranks, so the first pod holds the largest share.
    return BatchPlan(
        global_batch=b_global,
        per_rank_batch=shares[0],
        per_worker_batch=sum(shares[: max(1, procs_per_worker)]),
        accumulation_steps=max(1, len(micro_batch_sizes(shares[0], micro_batch))),
        lr_target=lr_target,
    )

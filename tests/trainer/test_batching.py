"""Fixed-global-batch split, gradient weighting and the policy's batch/LR plan."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etj_trainer.batching.plan import ResizePolicy, loss_scale, micro_batch_sizes, plan_step, split_counts


def test_micro_batches_respect_the_limit() -> None:
    assert micro_batch_sizes(0, 8) == []
    assert micro_batch_sizes(8, 8) == [8]
    assert micro_batch_sizes(11, 4) == [4, 4, 3]
    assert all(n <= 4 for n in micro_batch_sizes(13, 4))


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_weighted_uneven_shares_equal_single_process_gradient(world: int) -> None:
    """Sum over ranks of (rank's summed-loss gradient * scale) / world == full-batch mean gradient: what
    DDP's averaging produces equals the single-process update, for uneven shares and micro-batches."""
    torch.manual_seed(0)
    model = nn.Linear(5, 3).double()
    x, y = torch.randn(13, 5, dtype=torch.float64), torch.randint(0, 3, (13,))
    ref = torch.autograd.grad(nn.functional.cross_entropy(model(x), y), list(model.parameters()))
    total = [torch.zeros_like(p) for p in model.parameters()]
    start = 0
    for share in split_counts(13, world):
        for n in micro_batch_sizes(share, 2) or [0]:
            xs, ys = x[start : start + n], y[start : start + n]
            start += n
            loss = nn.functional.cross_entropy(model(xs), ys, reduction="sum") * loss_scale(world, 13)
            grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
            for t, g in zip(total, grads, strict=True):
                if g is not None:
                    t += g / world  # DDP's all-reduce average
    for t, r in zip(total, ref, strict=True):
        torch.testing.assert_close(t, r)


def test_fixed_global_batch_keeps_batch_and_lr() -> None:
    for n in (1, 2, 3, 7):
        plan = plan_step(ResizePolicy.FIXED_GLOBAL_BATCH, 64, 16, n, 1)
        assert plan.global_batch == 64 and plan.lr_target == 1.0
    assert plan_step(ResizePolicy.FIXED_GLOBAL_BATCH, 64, 16, 1, 1).accumulation_steps == 4


def test_dynamic_sgd_batch_follows_world_size() -> None:
    plans = [plan_step(ResizePolicy.DYNAMIC_SGD, 64, 64, n, 2) for n in (2, 4, 1)]
    assert [p.global_batch for p in plans] == [64, 128, 32]
    assert [p.lr_target for p in plans] == [1.0, 2.0, 0.5]


# (policy, global batch, ranks, min ranks, procs per pod) -> (B, per-rank, per-pod, LR target). Every count
# is in ranks: a pod of P processes is P ranks, and the minimum is replicas.min x P.
RANK_PLANS = {
    "DynamicSGD at the minimum, 2 procs per pod: multiplier exactly 1": (
        (ResizePolicy.DYNAMIC_SGD, 64, 2, 2, 2),
        (64, 32, 64, 1.0),
    ),
    "DynamicSGD, 2 pods x 8 GPUs at a minimum of 1 pod: per-rank batch kept, 2x": (
        (ResizePolicy.DYNAMIC_SGD, 256, 16, 8, 8),
        (512, 32, 256, 2.0),
    ),
    "DynamicSGD, 2 pods x 2 at a minimum of 2 pods: the batch at the minimum": (
        (ResizePolicy.DYNAMIC_SGD, 32, 4, 4, 2),
        (32, 8, 16, 1.0),
    ),
    "FixedGlobalBatch, 2 pods x 2: uneven split, the first pod holds the largest share": (
        (ResizePolicy.FIXED_GLOBAL_BATCH, 30, 4, 2, 2),
        (30, 8, 16, 1.0),
    ),
}


@pytest.mark.parametrize("case", list(RANK_PLANS), ids=list(RANK_PLANS))
def test_batch_plans_count_ranks_not_pods(case: str) -> None:
    (policy, batch, ranks, min_ranks, procs), want = RANK_PLANS[case]
    plan = plan_step(policy, batch, 8, ranks, min_ranks, procs)
    assert (plan.global_batch, plan.per_rank_batch, plan.per_worker_batch, plan.lr_target) == want

"""What a micro-batch's loss is a reduction of, so ``Step.backward`` weights it right (pure, no state).

etj weights each micro-batch's loss so that the all-reduced gradient is the mean over the global batch
(batching/plan.py). That needs the micro-batch's *sum* of per-sample losses; PyTorch's losses return the
*mean* by default, and a mean taken for a sum gives every micro-batch the weight of one sample: the wrong
gradient scale, silently. So ``Step.backward`` accepts a mean (rescaled by the micro-batch's sample count),
a sum, or a per-sample vector, and needs to know which one it got:

* read from the autograd graph where that is certain: the root is a loss function's node with its
  ``reduction`` saved (``F.cross_entropy``, ``F.mse_loss``, ... ``_saved_reduction``: 1 mean, 2 sum), or
  ``Tensor.mean``/``Tensor.sum``, or an addition/subtraction/negation of such terms that all agree;
* otherwise from the caller (``reduction="mean"|"sum"``); neither known, or the two contradicting: refused.

Multiplying by a constant ends the reading (``F.cross_entropy(x, y) * len(y)`` is a sum written as a
mean), as does anything else: such losses must say what they are.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import torch


class Reduction(StrEnum):
    MEAN = "mean"
    SUM = "sum"


# torch's at::Reduction codes, as loss functions' backward nodes save them.
_SAVED = {1: Reduction.MEAN, 2: Reduction.SUM}
_REDUCE = {"MeanBackward0": Reduction.MEAN, "MeanBackward1": Reduction.MEAN,
           "SumBackward0": Reduction.SUM, "SumBackward1": Reduction.SUM}  # fmt: skip
_LINEAR = {"AddBackward0", "SubBackward0", "NegBackward0"}  # terms keep their reduction


def detect(loss: torch.Tensor) -> Reduction | None:
    """The reduction a scalar loss's graph shows for certain, else None (can't tell)."""
    kinds: set[Reduction] = set()
    pending: list[Any] = [loss.grad_fn]
    while pending:
        node = pending.pop()
        if node is None:
            return None  # a constant term, or a loss without a graph
        name = type(node).__name__
        saved = getattr(node, "_saved_reduction", None)
        if isinstance(saved, int) and saved in _SAVED:
            kinds.add(_SAVED[saved])
        elif name in _REDUCE:
            kinds.add(_REDUCE[name])
        elif name in _LINEAR:
            pending.extend(n for n, _ in node.next_functions if n is not None)
        else:
            return None
    return kinds.pop() if len(kinds) == 1 else None


def resolve(declared: str | None, detected: Reduction | None, grad_fn: str = "") -> Reduction:
    """The reduction to weight a loss by: the caller's, checked against the graph's where that is known."""
    if declared is not None:
        said = Reduction(declared)  # a ValueError names a value that is neither
        if detected is not None and detected != said:
            raise ValueError(
                f"step.backward(loss, reduction={said.value!r}), but the loss is a {detected.value} "
                f"({grad_fn}): pass reduction={detected.value!r} or compute it with "
                f"reduction={said.value!r}"
            )
        return said
    if detected is None:
        raise ValueError(
            f"cannot tell whether this loss ({grad_fn or 'no autograd graph'}) is the micro-batch's mean "
            "or its sum; say which: step.backward(loss, reduction='mean') (PyTorch's default for its "
            "losses) or reduction='sum'"
        )
    return detected


def summed(loss: torch.Tensor, samples: int | None, declared: str | None = None) -> torch.Tensor:
    """The micro-batch's summed loss, from a mean, a sum or a per-sample vector of ``samples`` losses.

    ``samples`` is the micro-batch's sample count (None: outside ``step.micro_batches()``, where only a
    sum can be taken as it is). An empty micro-batch's mean is NaN: its sum is 0, with no NaN reaching
    the gradients.
    """
    if loss.ndim == 1 and samples is not None and loss.numel() == samples:
        return loss.sum()  # per-sample losses (reduction="none")
    if loss.ndim != 0:
        raise ValueError(
            f"step.backward takes a scalar loss or one loss per sample ({samples}), not shape "
            f"{tuple(loss.shape)}"
        )
    kind = resolve(declared, detect(loss), type(loss.grad_fn).__name__ if loss.grad_fn else "")
    if kind == Reduction.SUM:
        return loss
    if samples is None:
        raise ValueError("a mean loss is rescaled by its micro-batch: call backward inside micro_batches()")
    if samples == 0:
        return loss.nan_to_num(nan=0.0) * 0.0  # nan_to_num's gradient is 0 where the input was NaN
    return loss * samples

"""The parts of the training recipe that are not the LR schedule: parameter groups and precision.

* Weight decay is not applied to 1-d parameters (BatchNorm/LayerNorm weights, biases) when
  ``no_wd_norm_bias`` is set (Goyal et al. 2017, NVIDIA's ResNet-50 v1.5): decaying a BN scale only fights
  the normalisation, it does not regularise.
* Precision: ``fp32`` runs as is; ``bf16``/``fp16`` run forward and loss under ``torch.autocast`` with fp32
  master weights; ``fp16`` also scales the loss with a ``torch.amp.GradScaler`` (its state is part of the
  checkpoint, so a resize does not reset the scale to 65536 and waste steps on overflow again). On CUDA
  the model and inputs use ``channels_last`` (tensor-core friendly convolutions).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import torch
from torch import nn


class Precision(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


AUTOCAST_DTYPE = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}


def param_groups(model: nn.Module, weight_decay: float, no_wd_norm_bias: bool) -> list[dict[str, Any]]:
    """Optimizer groups: decayed (>= 2-d weights) and, when asked, not decayed (1-d: norm scales, biases)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not no_wd_norm_bias or weight_decay == 0:
        return [{"params": params, "weight_decay": weight_decay}]
    return [
        {"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},
    ]


def autocast(
    precision: Precision, device: torch.device
) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """A factory of the forward pass's context (a fresh one per micro-batch)."""
    if precision == Precision.FP32:
        return contextlib.nullcontext
    dtype = AUTOCAST_DTYPE[precision]
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: Precision, device: torch.device) -> torch.amp.GradScaler | None:
    return torch.amp.GradScaler(device.type) if precision == Precision.FP16 else None


def memory_format(device: torch.device) -> torch.memory_format:
    return torch.channels_last if device.type == "cuda" else torch.contiguous_format


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Inputs to the device, in the model's memory format (4-d image batches only)."""
    x = x.to(device, non_blocking=True)
    return x.contiguous(memory_format=memory_format(device)) if x.ndim == 4 else x

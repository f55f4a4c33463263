"""The built-in trainer: an image classifier written on the public loop API (``elastic.py``).

It is one user of ``etj_trainer.elastic`` like any script (``examples/custom-loop/train.py``): it opens
the data (DALI or in-memory, ``data/``), builds the model of ``ETJ_MODEL`` with the recipe (parameter
groups, precision, channels_last; ``recipe.py``) and runs the API's loop -- what a step, a resize, a
checkpoint or a failure does is the API's, documented there. Its own parts: a prefetching loader fed with
each membership's exact micro-batch stream, autocast and label smoothing in the loss, and validation on
rank 0 before the final report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from etj_trainer.classifier import recipe
from etj_trainer.classifier.models import build_model
from etj_trainer.config import TrainConfig
from etj_trainer.core import devices
from etj_trainer.data.sources import open_source
from etj_trainer.data.stream import Augmenter, BatchSource
from etj_trainer.elastic import Job, StopFlag

__all__ = ["EXIT_RESIZE", "StopFlag", "TrainResult", "evaluate", "train"]

EXIT_RESIZE = 75  # EX_TEMPFAIL: "stopped for a membership change, restart me"


@dataclass
class TrainResult:
    step: int
    epoch: int
    stopped_early: bool  # stopped by a SIGTERM somewhere in the world
    accuracy: float | None
    loss: float
    world_size: int
    params: dict[str, torch.Tensor] = field(default_factory=dict)


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64}[name]


def evaluate(model: nn.Module, source: BatchSource, micro: int, device: torch.device) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        stream = (
            np.arange(i, min(i + micro, source.num_samples)) for i in range(0, source.num_samples, micro)
        )
        for x, y in source.batches(stream):
            correct += int((model(recipe.to_device(x, device)).argmax(1) == y.to(device)).sum())
    model.train()
    return correct / source.num_samples


def train(cfg: TrainConfig, stop: StopFlag | None = None) -> TrainResult:
    """Run (or resume) training in the current process group; see the module docstring.

    Long because: the built-in loop reads top to bottom, as the example a user's own loop follows.
    """
    devices.bind_this_rank()  # before the input pipeline picks its GPU
    dtype = _dtype(cfg.dtype)
    precision = recipe.Precision(cfg.precision)
    augment = Augmenter(cfg.augment, cfg.seed, cfg.min_crop_scale, cfg.augment_flip)
    src = open_source(
        cfg.data,
        "train",
        cfg.image_size,
        dtype,
        cfg.dali_threads,
        augment=augment,
        max_batch=cfg.micro_batch_size,
    )
    job = Job(src.num_samples, cfg, stop=stop or StopFlag())
    net = build_model(cfg.model, cfg.num_classes).to(dtype=dtype)
    model = job.setup_model(net.to(memory_format=recipe.memory_format(job.device)))
    job.setup_dynamic_sgd(
        recipe.param_groups(model.module, cfg.weight_decay, cfg.no_wd_norm_bias),
        scaler=recipe.grad_scaler(precision, job.device),
    )
    forward = recipe.autocast(precision, job.device)
    # The source reads ahead: each membership's exact micro-batches, re-opened when the world changes.
    loader = job.loader(
        stream=src.batches,
        empty=lambda: (
            torch.empty((0, *src.sample_shape), dtype=dtype),
            torch.empty((0,), dtype=torch.int64),
        ),
    )
    with job:
        for step in job.steps():
            for x, y in step.batches(loader):
                with forward():
                    out = model(recipe.to_device(x, job.device))
                loss = F.cross_entropy(
                    out.float() if out.dtype in (torch.float16, torch.bfloat16) else out,
                    y.to(job.device),
                    reduction="sum",
                    label_smoothing=cfg.label_smoothing,
                )
                step.backward(loss, reduction="sum")  # label smoothing hides the reduction from etj
            step.optimizer_step()
        loader.close()
        accuracy = None
        # A sharded model's forward gathers its parameters from every rank: all of them evaluate then
        if not job.stopped_early and cfg.val_data and (job.world.rank == 0 or cfg.sharded):
            val = open_source(
                cfg.val_data,
                "val",
                cfg.image_size,
                dtype,
                cfg.dali_threads,
                max_batch=cfg.micro_batch_size,
                val_resize=cfg.val_resize,
            )
            accuracy = evaluate(model.module, val, cfg.micro_batch_size, job.device)
            val.close()
        job.finish(accuracy=accuracy)
    src.close()
    return TrainResult(
        step=job.steps_done,
        epoch=job.epoch,
        stopped_early=job.stopped_early,
        accuracy=accuracy,
        loss=job.loss,
        world_size=job.world.size,
        params={k: v.detach().clone() for k, v in model.module.state_dict().items()},
    )

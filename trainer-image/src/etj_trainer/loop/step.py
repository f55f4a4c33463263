"""One step of the loop API (etj_trainer.elastic), and the module a step trains through.

``Step`` is this rank's share of one global step: its micro-batches, the weighted backward and the commit
(one all-reduce: the loss and every rank's stop code) before the optimizer step; ``_Undo`` is what a step
changes before that commit point (module buffers, the RNG), put back when the step does not commit;
``ElasticModule`` routes training forwards through the current membership's DDP wrapper and
``Membership`` is one world's fixed ranks and batch plan. Split out of job.py (which keeps ``Job``, the
loop and its state) so each module stays small: these parts only read the job's state and call back into
it at the commit.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from etj_trainer.batching.dynamic_sgd import DynamicSGD
from etj_trainer.batching.plan import BatchPlan, micro_slices
from etj_trainer.batching.sampler import ElasticSampler
from etj_trainer.batching.schedule import LrSchedule, lr_factor, position
from etj_trainer.config import TrainConfig
from etj_trainer.core import devices
from etj_trainer.core.rng import HostGenerators
from etj_trainer.core.sample_log import SampleLog
from etj_trainer.core.world import World
from etj_trainer.data.stream import Micro
from etj_trainer.loop import loss as losses
from etj_trainer.resize import recover

B = TypeVar("B")
B_co = TypeVar("B_co", covariant=True)


class Feed(Protocol[B_co]):
    """What ``Step.batches`` reads from: a loader that yields a step's micro-batches (loop/loader.py)."""

    def feed(self, step: Step) -> Iterator[B_co]: ...


class StepHost(Protocol):
    """What a step, its module wrapper and its membership read of the job that runs them, and the one
    call back at the commit. loop/job.py's ``Job`` is the implementation; this view is narrow so that
    this module does not import job.py (which imports it) nor reach into the Job's private state."""

    @property
    def config(self) -> TrainConfig: ...
    @property
    def sampler(self) -> ElasticSampler: ...
    @property
    def step(self) -> int: ...  # the last committed step
    @property
    def schedule(self) -> LrSchedule: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer | None: ...
    @property
    def scaler(self) -> torch.amp.GradScaler | None: ...
    @property
    def model(self) -> ElasticModule | None: ...
    @property
    def ddp(self) -> nn.Module | None: ...  # the current membership's DDP wrapper (None: one rank)
    @property
    def step_lost(self) -> bool: ...
    @property
    def t_last_commit(self) -> float: ...  # time.monotonic() of the last commit (min_step_seconds)
    @property
    def samples_log(self) -> SampleLog | None: ...

    def guard(self) -> AbstractContextManager[None]: ...  # around every collective of a step

    def stop_code(self) -> int: ...  # this rank's code in the commit all-reduce (core/stopping.py)

    def commit_step(self, step: Step, loss: float, codes: list[int]) -> None: ...


@dataclass
class Membership:
    """One membership of the world: fixed ranks, batch plan and DDP wrapper until the next resize."""

    world: World
    plan: BatchPlan
    incarnation: float  # a world-wide id (rank 0's clock): tags sample-log lines and regroup keys
    job: StepHost

    def upcoming(self) -> Iterator[Micro]:
        """Every micro-batch this rank will train on in this membership, in order (for prefetching
        loaders; a resize starts a new membership and with it a new stream)."""
        job, cfg = self.job, self.job.config
        sim = ElasticSampler(job.sampler.dataset_size, job.sampler.seed, job.sampler.shuffle)
        sim.load_state_dict(job.sampler.state_dict())
        step = job.step
        while still_training(cfg, sim.epoch, step):
            gidx = sim.next_global_batch(self.plan.global_batch)
            mine = ElasticSampler.rank_slice(gidx, self.world.size, self.world.rank)
            for ids in micro_slices(mine, cfg.micro_batch_size):
                yield Micro(sim.epoch, ids)
            sim.commit(len(gidx))
            step += 1


class ElasticModule(nn.Module):
    """The user's module, trained through the DDP wrapper of the current membership.

    Training forwards (grad enabled, ``train()`` mode) go through DDP; evaluation calls the module itself
    (no collective, so rank 0 may evaluate alone). ``state_dict`` is the module's own (no ``module.``).
    """

    def __init__(self, module: nn.Module, job: StepHost) -> None:
        super().__init__()
        self.module = module
        self._job = [job]  # in a list: not a submodule, not part of the state

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        job = self._job[0]
        if not (self.training and torch.is_grad_enabled()) or job.ddp is None:
            return self.module(*args, **kwargs)
        if not job.step_lost:
            with job.guard():  # DDP broadcasts buffers here: a collective
                return job.ddp(*args, **kwargs)
        return self._discarded(*args, **kwargs)  # the step is lost (a peer died): it is redone later

    def _discarded(self, *args: Any, **kwargs: Any) -> Any:
        """A forward whose output only feeds the rest of a lost step's calls, which do nothing: no
        collective (SyncBatchNorm's, on the failed group, would raise) and no state touched."""
        self.module.eval()
        try:
            with torch.no_grad():
                return self.module(*args, **kwargs)
        finally:
            self.module.train()

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)


@dataclass
class _Undo:
    """What a step changes before its commit point: the module buffers a forward pass updates (BatchNorm
    statistics, DDP's buffer broadcast) and the RNG. Small next to the parameters; captured every step."""

    buffers: list[torch.Tensor]
    rng: HostGenerators
    cuda_rng: list[torch.Tensor]  # every visible GPU's generator (dropout, GPU augmentation)

    @classmethod
    def capture(cls, model: nn.Module | None) -> _Undo:
        return cls(
            [b.detach().clone() for b in model.buffers()] if model is not None else [],
            HostGenerators.capture(),
            devices.cuda_rng_states(),
        )

    def restore(self, model: nn.Module | None) -> None:
        if model is not None:
            with torch.no_grad():
                for b, saved in zip(model.buffers(), self.buffers, strict=True):
                    b.copy_(saved)
        self.rng.restore()
        devices.set_cuda_rng_states(self.cuda_rng)


class Step:
    """One global step: this rank's share of the step's indices, in micro-batches."""

    def __init__(self, job: StepHost, membership: Membership) -> None:
        self.job = job
        self.membership = membership
        self.number = job.step + 1  # 1-based: the step this trains
        sampler = job.sampler
        self.epoch = sampler.epoch
        self.indices = sampler.next_global_batch(membership.plan.global_batch)  # the whole world's
        self.ids = ElasticSampler.rank_slice(self.indices, membership.world.size, membership.world.rank)
        n = sampler.dataset_size
        before = position(sampler.epoch, sampler.state.consumed, n)
        self.position = (before, before + len(self.indices) / n)  # epochs, before and after this step
        if isinstance(job.optimizer, DynamicSGD):
            # The schedule follows the samples seen, so a resize (any new world size) leaves it in place.
            job.optimizer.set_schedule_factor(lr_factor(job.schedule, *self.position))
        self.lr = lr_of(job.optimizer)
        self.loss_sum: torch.Tensor | None = None  # on the loss's device; to the host at the commit
        self._scale = membership.world.size / len(self.indices)
        self._undo = _Undo.capture(job.model.module if job.model is not None else None)
        self.committed = False
        self._micro_samples: int | None = None  # the micro-batch being trained (a mean loss's count)
        self.lost: recover.Lost | None = None  # a peer died in this step: it is redone in a new membership
        if job.optimizer is not None:
            job.optimizer.zero_grad()  # to None, as a plain loop does: no memset of every gradient a step

    def roll_back(self) -> None:
        """Put back what this step changed before its commit point (it did not commit)."""
        model = self.job.model
        self._undo.restore(model.module if model is not None else None)

    def micro_batches(self) -> Iterator[Micro]:
        """This rank's share in micro-batches; DDP syncs gradients only in the last one's backward.

        A rank whose share is empty (an epoch's last, short step) gets one empty micro-batch: run it anyway
        (an empty forward and backward), every rank must take part in the gradient all-reduce.
        """
        ddp = self.job.ddp
        slices = micro_slices(self.ids, self.job.config.micro_batch_size) or [self.ids[:0]]
        for i, ids in enumerate(slices):
            if self.lost is not None:
                return  # the rest of a lost step is not run
            last = i == len(slices) - 1
            self._micro_samples = len(ids)
            with ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext():  # type: ignore[operator]
                yield Micro(self.epoch, ids)
        self._micro_samples = None

    def batches(self, feed: Feed[B]) -> Iterator[B]:
        """This rank's micro-batches as ``feed`` (``job.loader(...)``) loads them; each is a ``micro_batches``
        item (DDP's no_sync, the mean loss's count), an empty share an empty batch of the right shape."""
        return feed.feed(self)

    def backward(self, loss: torch.Tensor, reduction: str | None = None) -> None:
        """Backward of a micro-batch's loss, weighted so DDP's average is the global batch's mean.

        ``loss``: the micro-batch's mean (PyTorch's default), its sum, or one loss per sample; the
        reduction is read from the loss's graph where that is certain, else it must be given
        (``reduction="mean"|"sum"``), see loop/loss.py. A mean is rescaled by the micro-batch's samples.
        """
        if self.lost is not None:
            return
        loss = losses.summed(loss, self._micro_samples, reduction)
        scaled = loss * self._scale
        scaler = self.job.scaler
        with self.job.guard():  # the last micro-batch's backward all-reduces the gradients
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        summed = loss.detach().double()
        self.loss_sum = summed if self.loss_sum is None else self.loss_sum + summed

    def optimizer_step(self) -> None:
        """Commit the step (one all-reduce: the loss and every rank's stop code), then the optimizer step."""
        job, w = self.job, self.membership.world
        cfg = job.config
        if self.lost is not None:
            return
        with job.guard():
            floor = cfg.step_floor_s(len(self.ids))
            if floor > 0:
                time.sleep(max(0.0, floor - (time.monotonic() - job.t_last_commit)))
            if job.samples_log is not None:
                # Logged before the commit: a rank killed right after it used to leave a committed step
                # without its record (bench/chaos.py). A record of a step that never commits is harmless:
                # the redo logs it again under a newer incarnation, and the checker keeps the newest.
                job.samples_log.write(self.epoch, self.number, w.size, self.ids, lr=self.lr)
            stats = torch.zeros(1 + w.size, dtype=torch.float64)
            if self.loss_sum is not None:
                stats[0] = self.loss_sum  # the step's one device-to-host copy of the loss
            stats[1 + w.rank] = float(job.stop_code())
            if w.dist_on:
                dist.all_reduce(stats)
        if self.lost is not None:
            return  # the commit failed: nothing changed, the step is redone
        job.commit_step(
            self, float(stats[0]) / len(self.indices), [int(c) for c in stats[1:].round().tolist()]
        )


def still_training(cfg: TrainConfig, epoch: int, step: int) -> bool:
    """Is there a step after ``step`` (committed steps) in ``epoch``: the epochs and max steps not done."""
    return epoch < cfg.epochs and (cfg.max_steps <= 0 or step < cfg.max_steps)


def lr_of(opt: torch.optim.Optimizer | None) -> float:
    if isinstance(opt, DynamicSGD):
        return opt.lr
    return float(opt.param_groups[0]["lr"]) if opt is not None else math.nan

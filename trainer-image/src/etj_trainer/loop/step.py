"""One step of the loop API (etj_trainer.elastic), and the module a step trains through.

``Step`` is this rank's share of one global step: its micro-batches, the weighted backward and the commit
(one all-reduce: the loss and every rank's stop code) before the optimizer step, which it applies to the
``TrainState`` itself (loop/_state.py); what it changes before that commit point is put back when the step
does not commit (core/rng.py's ``StepUndo``). A step reads a ``StepContext`` -- the state, its membership,
the config, the schedule and the loop's ``Collectives`` -- never the Job. ``ElasticModule`` routes training
forwards through the current membership's DDP wrapper (read through ``Forwarding``) and ``Membership`` is
one world's fixed ranks, batch plan and DDP wrapper.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from etj_trainer.batching.dynamic_sgd import DynamicSGD
from etj_trainer.batching.plan import BatchPlan, micro_slices
from etj_trainer.batching.sampler import ElasticSampler
from etj_trainer.batching.schedule import LrSchedule, lr_factor, position
from etj_trainer.config import TrainConfig
from etj_trainer.core.rng import StepUndo
from etj_trainer.core.sample_log import SampleLog
from etj_trainer.core.world import World
from etj_trainer.data.stream import Micro
from etj_trainer.loop import loss as losses
from etj_trainer.loop._state import TrainState
from etj_trainer.resize import recover

B = TypeVar("B")
B_co = TypeVar("B_co", covariant=True)


class Feed(Protocol[B_co]):
    """What ``Step.batches`` reads from: a loader that yields a step's micro-batches (loop/loader.py)."""

    def feed(self, step: Step) -> Iterator[B_co]: ...


class Collectives(Protocol):
    """What a step asks of the loop that runs it (loop/_engine.py's ``Engine``): a guard around each of
    its collectives (a peer's death marks the step lost), and this rank's code for the commit all-reduce."""

    def guard(self) -> AbstractContextManager[None]: ...

    def stop_code(self) -> int: ...  # core/stopping.py's codes: 0 trains on


class Forwarding(Protocol):
    """What ``ElasticModule`` reads of the loop: the current membership's DDP wrapper (None: one rank),
    whether the step in progress is lost, and the guard a training forward's collective runs in."""

    @property
    def ddp(self) -> nn.Module | None: ...
    @property
    def step_lost(self) -> bool: ...

    def guard(self) -> AbstractContextManager[None]: ...


@dataclass
class Membership:
    """One membership of the world: fixed ranks, batch plan and DDP wrapper until the next resize."""

    world: World
    plan: BatchPlan
    incarnation: float  # a world-wide id (rank 0's clock): tags sample-log lines and regroup keys
    config: TrainConfig
    state: TrainState
    ddp: nn.Module | None = None  # None: one rank, or the world is re-forming (the wrapper went with it)
    samples_log: SampleLog | None = None  # this membership's sample log (tagged with its incarnation)

    def upcoming(self) -> Iterator[Micro]:
        """Every micro-batch this rank will train on in this membership, in order (for prefetching
        loaders; a resize starts a new membership and with it a new stream)."""
        cfg, sampler = self.config, self.state.sampler
        sim = ElasticSampler(sampler.dataset_size, sampler.seed, sampler.shuffle)
        sim.load_state_dict(sampler.state_dict())
        step = self.state.steps_done
        while still_training(cfg, sim.epoch, step):
            gidx = sim.next_global_batch(self.plan.global_batch)
            mine = ElasticSampler.rank_slice(gidx, self.world.size, self.world.rank)
            for ids in micro_slices(mine, cfg.micro_batch_size):
                yield Micro(sim.epoch, ids)
            sim.commit(len(gidx))
            step += 1


@dataclass(frozen=True)
class StepContext:
    """What a step reads of the loop that runs it, in place of the Job (one per membership)."""

    state: TrainState
    membership: Membership
    config: TrainConfig
    schedule: LrSchedule
    loop: Collectives


class ElasticModule(nn.Module):
    """The user's module, trained through the DDP wrapper of the current membership.

    Training forwards (grad enabled, ``train()`` mode) go through DDP; evaluation calls the module itself
    (no collective, so rank 0 may evaluate alone). ``state_dict`` is the module's own (no ``module.``).
    """

    def __init__(self, module: nn.Module, loop: Forwarding) -> None:
        super().__init__()
        self.module = module
        self._loop = [loop]  # in a list: not a submodule, not part of the state

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        loop = self._loop[0]
        if not (self.training and torch.is_grad_enabled()) or loop.ddp is None:
            return self.module(*args, **kwargs)
        if not loop.step_lost:
            with loop.guard():  # DDP broadcasts buffers here: a collective
                return loop.ddp(*args, **kwargs)
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


class Step:
    """One global step: this rank's share of the step's indices, in micro-batches."""

    def __init__(self, ctx: StepContext) -> None:
        self._ctx = ctx
        self.membership = membership = ctx.membership
        state = ctx.state
        self.number = state.steps_done + 1  # 1-based: the step this trains
        sampler = state.sampler
        self.epoch = sampler.epoch
        self.indices = sampler.next_global_batch(membership.plan.global_batch)  # the whole world's
        self.ids = ElasticSampler.rank_slice(self.indices, membership.world.size, membership.world.rank)
        n = sampler.dataset_size
        before = position(sampler.epoch, sampler.state.consumed, n)
        self.position = (before, before + len(self.indices) / n)  # epochs, before and after this step
        if isinstance(state.optimizer, DynamicSGD):
            # The schedule follows the samples seen, so a resize (any new world size) leaves it in place.
            state.optimizer.set_schedule_factor(lr_factor(ctx.schedule, *self.position))
        self.lr = lr_of(state.optimizer)
        self.loss_sum: torch.Tensor | None = None  # on the loss's device; to the host at the commit
        self._scale = membership.world.size / len(self.indices)
        self._undo = StepUndo.capture(state.module)
        self.committed = False
        self.codes: list[int] = []  # every rank's stop code, from the commit all-reduce
        # An empty share is one empty micro-batch: every rank takes part in the gradient all-reduce.
        self._slices = micro_slices(self.ids, ctx.config.micro_batch_size) or [self.ids[:0]]
        # Micro-batches that had their backward, and the one being trained: all must have run before
        # the gradients are used (clip_gradients, optimizer_step).
        self._ran, self._micro, self._backed = 0, -1, -1
        self._micro_samples: int | None = None  # the micro-batch being trained (a mean loss's count)
        self._count: int | None = None  # backward(count=...): this rank's counts, the step weighs by them
        self._count_reduced = False
        self._divisor = float(len(self.indices))  # what the step's summed loss is a mean over
        self.lost: recover.Lost | None = None  # a peer died in this step: it is redone in a new membership
        if state.optimizer is not None:
            state.optimizer.zero_grad()  # to None, as a plain loop does: no memset of every gradient a step

    def roll_back(self) -> None:
        """Put back what this step changed before its commit point (it did not commit)."""
        self._undo.restore(self._ctx.state.module)

    def micro_batches(self) -> Iterator[Micro]:
        """This rank's share in micro-batches; DDP syncs gradients only in the last one's backward.

        A rank whose share is empty (an epoch's last, short step) gets one empty micro-batch: run it anyway
        (an empty forward and backward), every rank must take part in the gradient all-reduce.
        """
        ddp = self.membership.ddp
        for i, ids in enumerate(self._slices):
            if self.lost is not None:
                return  # the rest of a lost step is not run
            last = i == len(self._slices) - 1
            self._micro_samples, self._micro = len(ids), i
            with _gradient_sync(ddp, last):
                yield Micro(self.epoch, ids)
        self._micro_samples = None

    def batches(self, feed: Feed[B]) -> Iterator[B]:
        """This rank's micro-batches as ``feed`` (``job.loader(...)``) loads them; each is a ``micro_batches``
        item (DDP's no_sync, the mean loss's count), an empty share an empty batch of the right shape."""
        return feed.feed(self)

    def backward(self, loss: torch.Tensor, reduction: str | None = None, *, count: int | None = None) -> None:
        """Backward of a micro-batch's loss, weighted so DDP's average is the global batch's mean.

        ``loss``: the micro-batch's mean (PyTorch's default), its sum, or one loss per sample; the
        reduction is read from the loss's graph where that is certain, else it must be given
        (``reduction="mean"|"sum"``), see loop/loss.py. A mean is rescaled by the micro-batch's samples.

        ``count``: weigh the micro-batch by a count of its own (e.g. its non-padding tokens) instead of
        its samples: a mean is rescaled by ``count`` and the step's gradient and loss become the mean over
        the whole global batch's counts (all-reduced once the micro-batches have run). Every micro-batch
        of a step, on every rank, passes a count or none does.
        """
        if self.lost is not None:
            return
        if count is None and self._count is not None:
            raise ValueError(_MIXED)
        if self._micro_samples is not None and self._backed != self._micro:
            self._ran, self._backed = self._ran + 1, self._micro  # this micro-batch's first backward
        weight = self._micro_samples if count is None else self._counted(count)
        loss = losses.summed(loss, weight, reduction)
        scaled = loss * self._scale
        scaler = self._ctx.state.scaler
        with self._ctx.loop.guard():  # the last micro-batch's backward all-reduces the gradients
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        summed = loss.detach().double()
        self.loss_sum = summed if self.loss_sum is None else self.loss_sum + summed

    def _counted(self, count: int) -> int:
        """``backward(count=...)``: add a micro-batch's count to the step's."""
        if self._micro_samples is None:
            raise ValueError("backward(count=...) weighs a micro-batch: call it inside step.batches()")
        if count < 0:
            raise ValueError(f"backward(count={count}): a count is not negative")
        if self._count is None and self.loss_sum is not None:
            raise ValueError(_MIXED)
        self._count = (self._count or 0) + count
        return count

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        """Clip the step's gradients (all-reduced, after every micro-batch) to a total 2-norm of at most
        ``max_norm``; returns the norm before clipping (``torch.nn.utils.clip_grad_norm_``), inf or NaN when
        an fp16 step overflowed (which the GradScaler then skips). Call it before ``optimizer_step()``.

        Under fp16 the gradients are still multiplied by the GradScaler's scale: the norm is unscaled
        before the clipping factor is taken from it, the same factor and the same gradients as
        ``scaler.unscale_`` then clipping (the scale is a power of two, so both are exact), without
        marking the optimizer unscaled -- a mark that a step redone after a peer's death would trip over."""
        if self.lost is None:
            self._gradients_done("step.clip_gradients()")
        if self.lost is not None:
            return torch.tensor(math.nan)
        scaler = self._ctx.state.scaler
        scale = scaler.get_scale() if scaler is not None and scaler.is_enabled() else 1.0
        params = _stepped(self._ctx.state.optimizer)
        norm = torch.nn.utils.get_total_norm(_grads(params)) / scale
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return norm

    def _gradients_done(self, caller: str) -> None:
        """The step's gradients are complete: every micro-batch ran (the last one's backward all-reduces
        them), and a count-weighted step is turned into the mean over the world's counts (once)."""
        if self._ran < len(self._slices):
            raise RuntimeError(
                f"{caller}: only {self._ran} of {len(self._slices)} micro-batches of step {self.number} ran "
                "(had their backward); read step.batches() to its end and call step.backward in each -- "
                "DDP syncs the gradients in the last one's backward, and the samples left out would never "
                "be trained"
            )
        if self._count is None or self._count_reduced:
            return
        total = _world_total(self._count, self.membership.world, self._ctx.loop.guard)
        self._count_reduced = True
        if self.lost is None:
            # The gradients and the loss summed over counts, weighted by world/samples like any step's:
            # rescaled, they are the mean over the global batch's counts.
            self._divisor = float(max(total, 1))
            _scale_gradients(self._ctx.state.optimizer, len(self.indices) / self._divisor)

    def optimizer_step(self) -> None:
        """Commit the step (one all-reduce: the loss and every rank's stop code), then the optimizer step
        (``TrainState.apply``); the loop acts on the codes at the step boundary."""
        ctx, w, log = self._ctx, self.membership.world, self.membership.samples_log
        cfg = ctx.config
        if self.lost is not None:
            return
        self._gradients_done("step.optimizer_step()")
        if self.lost is not None:
            return  # the count all-reduce failed: the step is redone
        with ctx.loop.guard():
            floor = cfg.step_floor_s(len(self.ids))
            if floor > 0:
                time.sleep(max(0.0, floor - (time.monotonic() - ctx.state.pace.t_last_commit)))
            if log is not None:
                # Logged before the commit: a rank killed right after it used to leave a committed step
                # without its record (bench/chaos.py). A record of a step that never commits is harmless:
                # the redo logs it again under a newer incarnation, and the checker keeps the newest.
                log.write(self.epoch, self.number, w.size, self.ids, lr=self.lr)
            stats = torch.zeros(1 + w.size, dtype=torch.float64)
            if self.loss_sum is not None:
                stats[0] = self.loss_sum  # the step's one device-to-host copy of the loss
            stats[1 + w.rank] = float(ctx.loop.stop_code())
            if w.dist_on:
                dist.all_reduce(stats)
        if self.lost is not None:
            return  # the commit failed: nothing changed, the step is redone
        self.codes = [int(c) for c in stats[1:].round().tolist()]
        ctx.state.apply(len(self.indices), self.lr, float(stats[0]) / self._divisor)
        self.committed = True


_MIXED = "a step's micro-batches are weighted all by backward(count=...) or all by their samples, not both"


def _gradient_sync(wrapper: nn.Module | None, last: bool) -> AbstractContextManager[Any]:
    """Accumulation: the gradients are reduced in the last micro-batch's backward only. DDP's
    ``no_sync()`` for the others; FSDP2 has none, its module's flag says whether a backward reduces (set for
    every micro-batch, so a step never inherits the last one's setting)."""
    if isinstance(wrapper, FSDPModule):
        wrapper.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
    if wrapper is not None and not last:
        return wrapper.no_sync()  # type: ignore[operator, no-any-return]
    return contextlib.nullcontext()


def _world_total(count: int, world: World, guard: Callable[[], AbstractContextManager[None]]) -> int:
    """A count-weighted step's counts, every rank's together: one all-reduce (every rank weighs by count)."""
    stats = torch.tensor([float(count)], dtype=torch.float64)
    if world.dist_on:
        with guard():
            dist.all_reduce(stats)
    return int(stats.round().item())


def _stepped(opt: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The parameters ``opt`` steps (its groups')."""
    return [p for g in (opt.param_groups if opt is not None else []) for p in g["params"]]


def _grads(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [g for p in params if (g := p.grad) is not None]


def _scale_gradients(opt: torch.optim.Optimizer | None, factor: float) -> None:
    grads = _grads(_stepped(opt))
    if grads:
        torch._foreach_mul_(grads, factor)


def still_training(cfg: TrainConfig, epoch: int, step: int) -> bool:
    """Is there a step after ``step`` (committed steps) in ``epoch``: the epochs and max steps not done."""
    return epoch < cfg.epochs and (cfg.max_steps <= 0 or step < cfg.max_steps)


def lr_of(opt: torch.optim.Optimizer | None) -> float:
    if isinstance(opt, DynamicSGD):
        return opt.lr
    return float(opt.param_groups[0]["lr"]) if opt is not None else math.nan

"""The loop API's ``Job``: a façade of the documented calls (docs/trainer.md) over the private engine.

The public face and reference of the API is ``etj_trainer.elastic`` (its docstring says what etj
guarantees a loop written on it); scripts import from there, not from here. ``Job`` holds what a script
calls -- registering state, ``steps()``, ``finish()`` and a few facts to read -- and checks what it is
given; the loop itself (memberships, the step boundary, checkpoints, failures) is loop/_engine.py's
``Engine`` and the trained state loop/_state.py's ``TrainState``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, TypeVar

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.utils.data import Dataset

from etj_trainer.batching.dynamic_sgd import DynamicSGD
from etj_trainer.batching.plan import ResizePolicy
from etj_trainer.config import (
    ConfigIgnored,
    Parallelism,
    TrainConfig,
    config_for_job,
    ignored_by_own_optimizer,
)
from etj_trainer.core.world import StopFlag, World
from etj_trainer.data.stream import Micro
from etj_trainer.loop._engine import Engine
from etj_trainer.loop._reshard import Resharder, meta_template
from etj_trainer.loop._sharding import WrapPolicy, shard_model
from etj_trainer.loop._state import RESERVED, Stateful
from etj_trainer.loop.loader import Loader, make_loader
from etj_trainer.loop.step import ElasticModule, Step, lr_of

B = TypeVar("B")

_last_job: Job | None = None  # the last Job of this process: etj-train worker picks its exit code from it


def last_job() -> Job | None:
    return _last_job


class Job:
    """The loop API: see the module docstring and ``etj_trainer.elastic``.

    The config, in one precedence order: ``config`` (a ``TrainConfig``, used as given; nothing else is
    read), else the ``ETJ_*`` environment the operator or ``etj-train`` sets, over ``defaults`` (config
    fields as keywords, e.g. ``global_batch_size=256, lr=0.1`` in a script that also runs outside etj),
    over ``TrainConfig``'s defaults. A keyword the environment overrides with another value is warned
    about (``ConfigOverridden``), on rank 0.
    """

    def __init__(
        self,
        dataset_size: int,
        config: TrainConfig | None = None,
        *,
        stop: StopFlag | None = None,
        **defaults: Any,
    ) -> None:
        global _last_job
        # Everything that validates the input first, before this rank binds a GPU or joins a group: a bad
        # keyword or size is refused here, on every rank alike, not inside a collective or the restore.
        self._engine = Engine(config_for_job(config, defaults), dataset_size, stop)
        _last_job = self

    # ---- what a loop reads -------------------------------------------------------------------------------

    @property
    def config(self) -> TrainConfig:
        """The config in force."""
        return self._engine.config

    @property
    def world(self) -> World:
        """Who this rank is in the current membership (``rank``, ``size``, ``local_rank``, ``device``)."""
        return self._engine.world

    @property
    def device(self) -> torch.device:
        return self._engine.world.device

    @property
    def steps_done(self) -> int:
        """Committed global steps (an int; ``Step.number``, 1-based, is the step in training)."""
        return self._engine.state.steps_done

    @property
    def epoch(self) -> int:
        """The epoch the next step draws from (``epochs`` once training is done)."""
        return self._engine.state.sampler.epoch

    @property
    def loss(self) -> float:
        """The last committed step's loss (NaN before the first)."""
        return self._engine.state.pace.loss

    @property
    def stopped_early(self) -> bool:
        """The world stopped before the end (a SIGTERM somewhere in it): a restart is coming."""
        return self._engine.stopped_early

    # ---- registering state ---------------------------------------------------------------------------

    def setup_model(
        self,
        module: nn.Module,
        *,
        shard: WrapPolicy = None,
        mixed_precision: MixedPrecisionPolicy | None = None,
    ) -> ElasticModule:
        """Move ``module`` to the job's device; returns the module to train with (and checkpoint). Call it
        before building the optimizer: under ``parallelism`` FSDP/HSDP the module is sharded here, in
        place (FSDP2's ``fully_shard``), and the optimizer must hold the sharded parameters.

        ``shard``: which submodules are sharded units of their own besides the root -- module types (e.g.
        ``(Block,)``) or a predicate; ``mixed_precision``: FSDP2's ``MixedPrecisionPolicy`` (e.g. bf16
        parameters in the forward, fp32 gradient reduction). Both are ignored under DDP."""
        engine = self._engine
        module = module.to(self.device)
        if self.config.sync_batchnorm and engine.world.dist_on:
            module = nn.SyncBatchNorm.convert_sync_batchnorm(module)
        fsdp = self.config.parallelism == Parallelism.FSDP
        template = meta_template(module) if fsdp else None  # an in-place resize shards it again
        module = shard_model(module, self.config, engine.world, shard, mixed_precision)
        engine.model = ElasticModule(module, engine)
        engine.state.module = module
        if template is not None:
            args = (template, shard, mixed_precision, engine.state, self.config, engine.model)
            engine.resharder = Resharder(*args)
        return engine.model

    def setup_optimizer(
        self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None = None
    ) -> torch.optim.Optimizer:
        """Register the optimizer (and an fp16 GradScaler, which ``Step`` then applies)."""
        if ResizePolicy(self.config.resize_policy) == ResizePolicy.DYNAMIC_SGD and not isinstance(
            optimizer, DynamicSGD
        ):
            raise TypeError("resizePolicy DynamicSGD needs an etj_trainer.elastic.DynamicSGD optimizer")
        # Warned, not refused: an optimizer with its own LR (and its own torch scheduler, registered with
        # job.register) is a loop etj supports, and under the operator ETJ_LR/ETJ_LR_SCHEDULE always come
        # from the job spec; what must not be is the spec's LR being ignored without a word.
        ignored = (
            []
            if isinstance(optimizer, DynamicSGD)
            else ignored_by_own_optimizer(self.config, lr_of(optimizer))
        )
        if ignored and self.world.rank == 0:
            warnings.warn(
                f"the config's {'; '.join(ignored)} is not applied to this optimizer: etj applies the "
                "config's LR and schedule to job.setup_dynamic_sgd()'s only (or follow step.position "
                "with your own schedule, and set the config to match)",
                ConfigIgnored,
                stacklevel=2,
            )
        self._engine.state.optimizer, self._engine.state.scaler = optimizer, scaler
        return optimizer

    def setup_dynamic_sgd(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        scaler: torch.amp.GradScaler | None = None,
    ) -> DynamicSGD:
        """A ``DynamicSGD`` from the config (``lr``, ``dsgd_ramp_steps``, ``momentum``, ``weight_decay``,
        ``nesterov``; parameter groups may set their own), registered as the optimizer. Under either
        resize policy: with FixedGlobalBatch its multiplier stays 1, and the config's LR schedule acts."""
        cfg = self.config
        opt = DynamicSGD(
            params,
            lr=cfg.lr,
            ramp_steps=cfg.dsgd_ramp_steps,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            nesterov=cfg.nesterov,
        )
        self.setup_optimizer(opt, scaler)
        return opt

    def loader(
        self,
        dataset: Dataset[Any] | None = None,
        *,
        stream: Callable[[Iterator[Micro]], Iterable[B]] | None = None,
        empty: Callable[[], B] | None = None,
        **dataloader_args: Any,
    ) -> Loader[Any]:
        """A loader of this rank's micro-batches that follows membership changes (loop/loader.py); read it
        with ``step.batches(loader)``. Either a map-style ``dataset`` (through a ``torch.utils.data.
        DataLoader``: ``num_workers``, ``collate_fn``, ``pin_memory``... in ``dataloader_args``), or your
        own ``stream`` (``Micro``s in, one batch each out, in order) with ``empty()`` for an empty share.
        Closed with the job."""
        size = self._engine.state.sampler.dataset_size
        if isinstance(dataset, Sized) and len(dataset) != size:
            # The sampler draws ids from range(dataset_size): fewer would train on a part of the data
            # every epoch, silently; more would fail in the DataLoader mid-epoch.
            raise ValueError(
                f"Job(dataset_size={size}) but the loader's dataset has "
                f"{len(dataset)} samples: pass dataset_size=len(dataset) (a torch Subset for a part of it)"
            )
        made = make_loader(dataset, stream, empty, dataloader_args)
        self._engine.loaders.append(made)
        return made

    def register(self, name: str, obj: Stateful) -> None:
        """Checkpoint ``obj`` (anything with ``state_dict``/``load_state_dict``: an LR scheduler, an EMA)."""
        if name in RESERVED:
            raise ValueError(f"{name!r} is taken by etj's own state")
        self._engine.state.extra[name] = obj

    # ---- the loop --------------------------------------------------------------------------------------

    def steps(self) -> Iterator[Step]:
        """Restore, then yield one ``Step`` per global step until the epochs/max steps are done or the world
        stops (``stopped_early``); a graceful leave re-forms the world between two steps (the step
        boundary: loop/_engine.py's ``Engine.boundary``)."""
        return self._engine.steps()

    def finish(self, **metrics: Any) -> None:
        """Final checkpoint and the final report (with ``metrics``, e.g. ``accuracy``); then the world's
        last barrier. After a stop (``stopped_early``) it only closes the job. Called by ``with`` too."""
        self._engine.finish(**metrics)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            self._engine.on_failure()
        else:
            self._engine.finish()

"""A sharded job (``parallelism`` FSDP or HSDP): the model sharded with FSDP2, and its checkpoints.

``shard_model`` applies ``torch.distributed.fsdp.fully_shard`` bottom-up: to each submodule the user's
wrapping policy picks (a predicate, or module types: e.g. each transformer block), then to the root, so a
block's parameters are gathered for its own forward and backward only. FSDP shards over every rank; HSDP
over a 2-D mesh (replicate x shard): groups of ``shard_group_size`` ranks hold one sharded copy each, and
the copies' gradients are all-reduced. FSDP2 averages the reduced gradients over the world as DDP does, so
the loop's weighting (step.py: a summed loss times world / global batch) gives the same gradient.

``ShardedCheckpoints`` writes and restores the whole ``TrainState``: the model's and optimizer's DTensors
with DCP (checkpoint/sharded.py; resharded on load at any world size), the rest beside them. A sharded job
resizes through the restart path only (loop/_engine.py): its state moves through these checkpoints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from etj_trainer.checkpoint import sharded
from etj_trainer.checkpoint.store import StateWriter
from etj_trainer.config import Parallelism, TrainConfig
from etj_trainer.core.world import World
from etj_trainer.loop._state import TrainState

log = logging.getLogger(__name__)

WrapPolicy = Callable[[nn.Module], bool] | tuple[type[nn.Module], ...] | None


def mesh_for(cfg: TrainConfig, world: World) -> DeviceMesh:
    """FSDP: one dimension over every rank. HSDP: (replicas, shard_group_size), named replicate x shard."""
    kind = world.device.type
    if cfg.parallelism == Parallelism.HSDP:
        group = cfg.shard_group
        if world.size % group:
            raise ValueError(
                f"parallelism HSDP with shard_group_size={group} needs a world size that is a multiple of "
                f"it, not {world.size} (set replicas in whole shard groups)"
            )
        return init_device_mesh(kind, (world.size // group, group), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(kind, (world.size,), mesh_dim_names=("shard",))


def shard_model(
    module: nn.Module,
    cfg: TrainConfig,
    world: World,
    wrap: WrapPolicy = None,
    mixed_precision: MixedPrecisionPolicy | None = None,
) -> nn.Module:
    """``module`` sharded in place (FSDP2) for a sharded config in a world of processes; as it is else
    (DDP, or one process without a group: nothing to shard over)."""
    if not cfg.sharded or not world.dist_on:
        return module
    mesh = mesh_for(cfg, world)
    kwargs: dict[str, Any] = {"mesh": mesh}
    if mixed_precision is not None:
        kwargs["mp_policy"] = mixed_precision
    picks = _policy(wrap)
    # bottom-up: a block nested in a picked block is sharded first, the root last
    for sub in reversed(list(module.modules())):
        if sub is not module and picks(sub):
            fully_shard(sub, **kwargs)
    fully_shard(module, **kwargs)
    return module


def _policy(wrap: WrapPolicy) -> Callable[[nn.Module], bool]:
    if wrap is None:
        return lambda _m: False  # the root alone: one unit, gathered whole for the forward
    if isinstance(wrap, tuple):
        types = wrap
        return lambda m: isinstance(m, types)
    return wrap


def is_sharded(module: nn.Module | None) -> bool:
    return isinstance(module, FSDPModule)


class ShardedCheckpoints:
    """A sharded job's checkpoints in ``cfg.checkpoint_dir`` (else the local one: a file system every rank
    of the world sees, e.g. ``etj-train local`` on one machine). Every call is a collective."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.directory: Path | None = cfg.checkpoint_dir or cfg.local_checkpoint_dir
        self.keep = cfg.checkpoint_keep

    def save(self, state: TrainState, world: World, writer: StateWriter, must: bool) -> None:
        """Write the state of ``state.steps_done`` (every rank). The outcome goes where the DDP writes'
        go (``writer``'s durable write or failure count: status.lastCheckpoint, CheckpointDurable and
        checkpoint.maxFailedWrites); a failure is raised only when ``must`` (a stop, the end), as DDP's
        synchronous writes are -- an interval's failure is counted, and training goes on."""
        try:
            written = self._write(state, world)
        except sharded.ShardedCheckpointFailed as e:
            writer.failed_writes, writer.shared_error = writer.failed_writes + 1, str(e)
            if must:
                raise
            log.warning("sharded checkpoint of step %d not written: %s", state.steps_done, e)
            return
        if written is not None:
            writer.durable, writer.failed_writes, writer.shared_error = written, 0, None

    def _write(self, state: TrainState, world: World) -> dict[str, Any] | None:
        if self.directory is None:
            return None
        assert state.module is not None and state.optimizer is not None
        model, optim = get_state_dict(state.module, state.optimizer)
        rest = state.rest_state(world.size)
        rest["optimizer_extra"] = optimizer_extra(state.optimizer)
        path = sharded.save(
            self.directory,
            state.steps_done,
            {"model": model, "optimizer": optim},
            rest,
            world.rank,
            self.keep,
        )
        return {"step": state.steps_done, "path": str(path), "time": time.time()}

    def restore(self, state: TrainState, world: World) -> Path | None:
        """Load the newest complete checkpoint rank 0 finds, resharded onto this world; None: none."""
        if self.directory is None:
            return None
        found = sharded.list_sharded(self.directory) if world.rank == 0 else []
        step = torch.tensor([found[0][0] if found else -1], dtype=torch.int64)
        if world.dist_on:
            dist.broadcast(step, 0)  # one choice for the world, whatever each rank's view of the volume
        if int(step) < 0:
            return None
        path = self.directory / sharded.directory_name(int(step))
        assert state.module is not None and state.optimizer is not None
        # this world's shards of every tensor (the optimizer's initialised): DCP reads into them in place
        model, optim = get_state_dict(state.module, state.optimizer)
        rest = sharded.load(path, {"model": model, "optimizer": optim})
        set_state_dict(state.module, state.optimizer, model_state_dict=model, optim_state_dict=optim)
        load_optimizer_extra(state.optimizer, rest.pop("optimizer_extra", {}))
        written_by = rest["meta"].get("world_size")
        state.load_rest(rest)
        if world.rank == 0:
            print(f"etj: {path.name} written by {written_by} ranks, resharded onto {world.size}", flush=True)
        return path


def optimizer_extra(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimizer's state dict beyond ``state`` and ``param_groups`` (DynamicSGD's ramp), which
    ``get_state_dict`` drops."""
    return {k: v for k, v in optimizer.state_dict().items() if k not in ("state", "param_groups")}


def load_optimizer_extra(optimizer: torch.optim.Optimizer, extra: dict[str, Any]) -> None:
    """``optimizer_extra``'s part back into ``optimizer``, after torch's ``set_state_dict`` (whose
    initialising step would have moved it)."""
    if extra:
        optimizer.load_state_dict({**optimizer.state_dict(), **extra})

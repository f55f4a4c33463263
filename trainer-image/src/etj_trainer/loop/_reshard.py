"""A sharded state's in-place resizes (``parallelism`` FSDP): hand the shards over, reshard in memory.

FSDP2 binds a module's parameters to the mesh ``fully_shard`` was given, and a mesh to the process group it
was made of; a resize replaces that group (resize/regroup.py's ``reform``), and ``fully_shard`` cannot be
applied a second time. So the state crosses the resize in three moves, none of which touches a disk:

1. **Hand-over** (``gather``, in the old world, every rank including those leaving): each tensor of the
   model's and the optimizer's sharded state dicts is all-gathered over the old mesh, one tensor at a time,
   and kept on the host. A leaving rank's shards are thus with the survivors before it goes.
2. **Rebuild** (``rebuild``, in the new world): a fresh copy of the user's module is made from a template
   taken before it was first sharded (parameters on the meta device: no memory), sharded with the same
   wrapping policy and mixed precision on the new mesh, given real storage (``to_empty``) and the old
   module's buffers (non-persistent ones are in no state dict). The user's optimizer keeps its identity
   (an LR scheduler holds it): its parameter groups are re-pointed at the new parameters, by name.
3. **Reshard** (``load``): the full state is loaded with torch's ``set_state_dict(full_state_dict=True)``,
   which keeps each rank's own rows of every tensor. A joiner, which held nothing, first receives the
   hand-over from rank 0 (state_sync.broadcast_state, over the new group, which meets under the job's
   token-derived namespace).

Cost: the pause is the gather plus the rebuild and load (bench/sharded_memory.py measures it), and each
rank holds the full state on the host for that time -- what DCP's resharded load avoids, at the price of
a disk round trip and a process restart. A crash cannot hand anything over (the dead rank's shards are
gone): it takes the restart path from the newest checkpoint, resharded (loop/_engine.py). HSDP keeps the
restart path for every resize: its mesh needs whole shard groups, which a leave or a join rarely gives.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from etj_trainer.config import TrainConfig
from etj_trainer.core.world import World
from etj_trainer.loop._sharding import WrapPolicy, load_optimizer_extra, optimizer_extra, shard_model
from etj_trainer.loop._state import TrainState
from etj_trainer.resize.state_sync import broadcast_state

FULL = StateDictOptions(full_state_dict=True)


def meta_template(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are on the meta device (shapes, no storage)."""
    memo: dict[int, Any] = {}
    for t in itertools.chain(module.parameters(), module.buffers()):
        empty = torch.empty_like(t, device="meta")
        memo[id(t)] = (
            nn.Parameter(empty, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else empty
        )
    return copy.deepcopy(module, memo)


@dataclass
class Resharder:
    """How to shard the user's module again on a new world, and the hand-over on its way there (see the
    module docstring); one per Job, made by ``setup_model`` before it first shards the module."""

    template: nn.Module  # the user's module before it was first sharded, on the meta device
    wrap: WrapPolicy
    mixed_precision: MixedPrecisionPolicy | None
    state: TrainState  # the loop's (loop/_state.py): its module is replaced at each resize
    config: TrainConfig
    wrapper: nn.Module  # the ElasticModule the loop trains through: it follows the new module
    held: dict[str, Any] | None = None  # the hand-over, from the last boundary that decided a resize

    def hand_over(self, world_size: int) -> None:
        """At a boundary that decided an in-place resize, in the old world (every rank, collective)."""
        self.held = self.gather(world_size)

    def sync(self, _job: object, world: World, behind: bool) -> None:
        """resize/inplace.py's ``Sync`` for a sharded state: ``adopt`` with this rank's hand-over (none
        for a joiner), and the loop's wrapper trains through the new module."""
        held, self.held = self.held, None
        self.wrapper.module = self.adopt(world, None if behind else held)

    def gather(self, world_size: int) -> dict[str, Any]:
        """The whole state on the host (every rank of the old world: the all-gathers are collectives)."""
        state = self.state
        assert state.module is not None and state.optimizer is not None
        model, optim = get_state_dict(state.module, state.optimizer)
        return {
            "model": _full_on_host(model),
            "optimizer": _full_on_host(optim),
            **state.rest_state(world_size),
            "optimizer_extra": optimizer_extra(state.optimizer),
        }

    def adopt(self, world: World, held: dict[str, Any] | None) -> nn.Module:
        """In the new world (every rank): the hand-over to whoever lacks it (a joiner), the module rebuilt
        on the new mesh and the state resharded into it; returns the new module (the caller puts it where
        the loop reads it)."""
        full = _to_those_without(held, world)
        module = self.rebuild(world)
        load(self.state, module, full, behind=held is None)
        return module

    def rebuild(self, world: World) -> nn.Module:
        """A fresh sharded module on ``world``'s mesh, with the old one's buffers; the optimizer re-pointed
        at its parameters (its state is cleared: ``load`` fills it)."""
        old, optimizer = self.state.module, self.state.optimizer
        assert old is not None and optimizer is not None
        module = shard_model(
            copy.deepcopy(self.template), self.config, world, self.wrap, self.mixed_precision
        )
        module.to_empty(device=world.device)
        with torch.no_grad():
            buffers = dict(old.named_buffers())
            for name, b in module.named_buffers():
                b.copy_(buffers[name])
        new = dict(module.named_parameters())
        name_of = {id(p): n for n, p in old.named_parameters()}
        for group in optimizer.param_groups:
            group["params"] = [new[name_of[id(p)]] for p in group["params"]]
        optimizer.state.clear()
        return module


def load(state: TrainState, module: nn.Module, full: dict[str, Any], behind: bool) -> None:
    """``full`` (a hand-over) into ``module`` and the registered optimizer, each rank keeping its own
    rows; ``behind`` (a joiner): the rest of the state too (sampler, step, RNG, meta...)."""
    optimizer = state.optimizer
    assert optimizer is not None
    set_state_dict(
        module, optimizer, model_state_dict=full["model"], optim_state_dict=full["optimizer"], options=FULL
    )
    load_optimizer_extra(optimizer, full["optimizer_extra"])  # after the load: its init step moved it
    state.module = module
    if behind:
        state.load_rest(full)


def _to_those_without(held: dict[str, Any] | None, world: World) -> dict[str, Any]:
    """``held`` where every rank has one (a leave: the survivors gathered it); else rank 0's, sent to all."""
    have = torch.tensor([0 if held is None else 1], dtype=torch.int64, device=world.device)
    dist.all_reduce(have, op=dist.ReduceOp.MIN)
    if int(have) == 1:
        assert held is not None
        return held
    mine = held if world.rank == 0 else None
    got = broadcast_state(mine, 0, world.rank, lambda *_: None, world.device)
    return held if held is not None else got


def _full_on_host(tree: Any) -> Any:
    """``tree`` (a state dict) with every DTensor all-gathered (collective) and every tensor on the host."""
    if isinstance(tree, dict):
        return {k: _full_on_host(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_full_on_host(v) for v in tree]
    if isinstance(tree, DTensor):
        return tree.full_tensor().cpu()
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu().clone()
    return tree

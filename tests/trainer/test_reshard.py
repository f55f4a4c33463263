"""A sharded state's in-place resize (loop/_reshard.py), with real process groups: a leave (3 -> 2 ranks)
hands the leaving rank's shards over before it goes, a join (2 -> 3) gets the state from rank 0, and each
new world reshards in memory onto a module rebuilt from the meta template. The end equals the same steps
in one unsharded process, the optimizer's state included; the user's optimizer object is kept (an LR
scheduler holds it) and trains the new parameters; a non-persistent buffer (in no state dict) survives.

The end-to-end proof with agents, SIGTERM and a joining node is tests/trainer/test_fsdp.py
``test_a_sharded_job_resizes_in_place_exactly_once_and_equal``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import FSDPModule

from etj_trainer.batching.sampler import ElasticSampler
from etj_trainer.config import Parallelism, TrainConfig
from etj_trainer.core.world import World
from etj_trainer.loop._reshard import Resharder, meta_template
from etj_trainer.loop._sharding import shard_model
from etj_trainer.loop._state import TrainState

STEPS = 2  # per world: 3 ranks, then 2 after the leave, then 3 after the join


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 7), nn.Linear(7, 3)
        self.register_buffer("scale", torch.tensor(0.5), persistent=False)  # in no state dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x))) * self.scale


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = _Scaled().double()
    net.scale.fill_(2.0)  # not the constructor's value: a rebuilt module must take the old one's
    return net


X = torch.arange(20, dtype=torch.float64).reshape(4, 5) / 10


def _train(module: nn.Module, opt: torch.optim.Optimizer, state: TrainState) -> None:
    for _ in range(STEPS):  # every rank the same batch: FSDP's averaged gradient is the batch's
        opt.zero_grad()
        module(X).square().sum().backward()
        opt.step()
        state.steps_done += 1


def _group(tmp: str, name: str, rank: int, size: int) -> World:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    dist.init_process_group("gloo", init_method=f"file://{tmp}/{name}", rank=rank, world_size=size)
    return World.current()


def _fresh(cfg: TrainConfig, world: World) -> tuple[TrainState, Resharder, torch.optim.Optimizer]:
    """As Job.setup_model and setup_optimizer make them; ``wrapper`` stands for the ElasticModule."""
    net = _net()
    template = meta_template(net)
    state = TrainState(ElasticSampler(10, 0), module=shard_model(net, cfg, world, (nn.Linear,)))
    state.optimizer = torch.optim.AdamW(state.module.parameters(), lr=0.05, weight_decay=0.1)  # type: ignore[union-attr]
    wrapper = nn.Module()
    return state, Resharder(template, (nn.Linear,), None, state, cfg, wrapper), state.optimizer


def _sync(resharder: Resharder, world: World, behind: bool = False) -> nn.Module:
    resharder.sync(None, world, behind)
    assert resharder.held is None  # the hand-over is not kept past the resize
    module: nn.Module = resharder.wrapper.module
    assert module is resharder.state.module and isinstance(module, FSDPModule)
    return module


def _rank(rank: int, tmp: str) -> None:
    cfg = TrainConfig(parallelism=Parallelism.FSDP)
    state, resharder, opt = _fresh(cfg, _group(tmp, "three", rank, 3))
    assert state.module is not None
    _train(state.module, opt, state)
    resharder.hand_over(3)  # every rank of the old world, the leaving one too
    dist.destroy_process_group()
    if rank == 2:  # it left; a new node joins later with nothing but its own fresh module
        state, resharder, opt = _fresh(cfg, World.current())
    else:
        module = _sync(resharder, _group(tmp, "two", rank, 2))
        assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in module.parameters()}
        _train(module, opt, state)
        resharder.hand_over(2)
        dist.destroy_process_group()
    module = _sync(resharder, _group(tmp, "again", rank, 3), behind=rank == 2)
    assert state.steps_done == 2 * STEPS  # the joiner too: the rest of the state came with the hand-over
    _train(module, opt, state)
    model, optim = get_state_dict(module, opt, options=StateDictOptions(full_state_dict=True))
    if rank == 0:
        torch.save({"model": model, "optim": optim, "scale": float(module.scale)}, f"{tmp}/end.pt")  # type: ignore[arg-type]
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def test_a_leave_and_a_join_reshard_in_memory_and_equal_one_unsharded_process() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_rank, args=(r, tmp)) for r in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        assert [p.exitcode for p in procs] == [0, 0, 0]
        end: dict[str, Any] = torch.load(Path(tmp, "end.pt"), weights_only=False)
    net = _net()
    opt = torch.optim.AdamW(net.parameters(), lr=0.05, weight_decay=0.1)
    for _ in range(3 * STEPS):
        opt.zero_grad()
        net(X).square().sum().backward()
        opt.step()
    for name, ref in net.state_dict().items():
        torch.testing.assert_close(end["model"][name], ref, rtol=1e-12, atol=1e-14)
    names = dict(zip((id(p) for p in net.parameters()), (n for n, _ in net.named_parameters()), strict=True))
    for p, s in opt.state.items():
        mine = end["optim"]["state"][names[id(p)]]
        assert float(mine["step"]) == 3 * STEPS
        torch.testing.assert_close(mine["exp_avg"], s["exp_avg"], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(mine["exp_avg_sq"], s["exp_avg_sq"], rtol=1e-12, atol=1e-14)
    assert end["scale"] == 2.0


def test_the_template_holds_no_storage_and_keeps_tied_parameters() -> None:
    net = nn.Sequential(nn.Embedding(11, 4), nn.Linear(4, 11, bias=False))
    net[1].weight = net[0].weight  # tied, as a language model's head and embedding
    template = meta_template(net)
    assert all(t.device.type == "meta" for t in [*template.parameters(), *template.buffers()])
    assert template[1].weight is template[0].weight  # type: ignore[index]
    assert net[0].weight.device.type == "cpu"  # the original is untouched

"""bench/sharded_memory.py's pure parts: what it counts as a rank's bytes, and how it tabulates them."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from bench.sharded_memory import local_bytes, memory_table, pause_ratios, state_bytes, wide_mlp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard


@pytest.fixture
def one_rank() -> Iterator[None]:
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{Path(tmp) / 'init'}", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def test_a_dtensor_counts_its_local_shard_only(one_rank: None) -> None:
    """A DTensor of 10 x 4 float64 of which this rank holds 3 rows: 96 bytes, not 320."""
    mesh = init_device_mesh("cpu", (1,))
    shard = DTensor.from_local(
        torch.zeros(3, 4, dtype=torch.float64), mesh, [Shard(0)], shape=(10, 4), stride=(4, 1)
    )
    assert shard.shape == (10, 4)
    assert local_bytes([shard]) == 3 * 4 * 8
    assert local_bytes([torch.zeros(5, dtype=torch.float32), None]) == 20


def test_a_rank_state_is_params_grads_and_both_adam_moments() -> None:
    model = torch.nn.Linear(6, 4)  # 28 float32 parameters in 2 tensors
    opt = torch.optim.AdamW(model.parameters())
    assert state_bytes(model, opt) == {"params": 112, "grads": 0, "optimizer": 0}  # no step yet
    model(torch.ones(2, 6)).sum().backward()
    opt.step()
    # exp_avg and exp_avg_sq per parameter, and a float32 step counter per tensor
    assert state_bytes(model, opt) == {"params": 112, "grads": 112, "optimizer": 2 * 112 + 2 * 4}


def test_the_table_gives_fsdp_over_ddp_and_the_ideal_per_world_size() -> None:
    ddp = {"params": 400, "grads": 400, "optimizer": 800}
    rows = memory_table(
        {
            4: {"DDP": ddp, "FSDP": {"params": 100, "grads": 100, "optimizer": 200}},
            2: {"DDP": ddp, "FSDP": {"params": 200, "grads": 200, "optimizer": 400}},
        }
    )
    assert [(r["ranks"], r["fsdp_over_ddp"], r["ideal"]) for r in rows] == [(2, 0.5, 0.5), (4, 0.25, 0.25)]
    assert rows[0]["ddp_mib"] == round(1600 / 2**20, 2)


def test_pause_ratios_are_over_the_same_runs_ddp_and_say_what_was_not_measured() -> None:
    ddp = {"loss_3to2_s": 0.5, "kill_2to1_s": 2.0, "gain_1to2_s": "no step at world size 2 within 150 s"}
    fsdp = {"loss_3to2_s": 5.0, "kill_2to1_s": 7.0, "gain_1to2_s": 9.0}
    ddp["loss_3to2_path"], fsdp["loss_3to2_path"] = "InPlace", "InPlaceResharded"
    ratios = pause_ratios(ddp, fsdp)
    assert "loss_3to2_path" not in ratios  # a path is a name, not a time
    assert (ratios["loss_3to2_s"], ratios["kill_2to1_s"]) == (10.0, 3.5)
    assert str(ratios["gain_1to2_s"]).startswith("not comparable")


def test_the_pause_model_has_a_few_million_parameters() -> None:
    n = sum(p.numel() for p in wide_mlp().parameters())
    assert 2_000_000 < n < 5_000_000
    assert wide_mlp()(torch.zeros(2, 3, 8, 8)).shape == (2, 10)

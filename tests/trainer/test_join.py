"""In-place join (join.py) and the state transfer (state_sync.py): decision tables, and a real
tensor-by-tensor transfer between two gloo processes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from etj_trainer.join import plan_admission
from etj_trainer.state_sync import broadcast_state, buckets

ADMISSIONS = {
    "room for all: everyone, oldest first": (["a", "b"], 2, 8, ("a", "b")),
    "room for one": (["a", "b"], 3, 4, ("a",)),
    "at the maximum: nobody (they take the restart path after their wait)": (["a"], 4, 4, ()),
    "nobody waiting": ([], 1, 4, ()),
}


@pytest.mark.parametrize("case", list(ADMISSIONS), ids=list(ADMISSIONS))
def test_plan_admission(case: str) -> None:
    waiting, world, max_ranks, expected = ADMISSIONS[case]
    assert plan_admission(waiting, world, max_ranks) == expected


F32, F64 = torch.float32, torch.float64
BUCKETS = {
    "small tensors of one dtype share a bucket": ([(4, F32), (4, F32), (4, F32)], 16, [[0, 1, 2]]),
    "a bucket closes at the chunk size": ([(8, F32), (8, F32), (8, F32)], 16, [[0, 1], [2]]),
    "a dtype change closes a bucket": ([(4, F32), (8, F64), (4, F32)], 64, [[0], [1], [2]]),
    "a tensor over the chunk size goes alone (sent in slices)": (
        [(4, F32), (100, F32), (4, F32)],
        16,
        [[0], [1], [2]],
    ),
}


@pytest.mark.parametrize("case", list(BUCKETS), ids=list(BUCKETS))
def test_buckets(case: str) -> None:
    sizes, chunk, expected = BUCKETS[case]
    assert buckets(sizes, chunk) == expected


def _state(seed: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(300, generator=g, dtype=F64), "b": torch.randn(3, generator=g, dtype=F64)},
        "optimizer": {"state": {0: {"momentum_buffer": torch.randn(300, generator=g, dtype=F64)}}, "lr": 0.1},
        "step": 7 + seed,
        "rng": torch.randint(0, 255, (16,), dtype=torch.uint8, generator=g),
        "meta": {"resizes": [{"from": 2, "to": 3}]},
    }


def _transfer(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    live = {"w": torch.zeros(300, dtype=F64), "b": torch.zeros(3, dtype=F64)}
    addr = live["w"].data_ptr()
    got = broadcast_state(
        _state(0) if rank == 0 else None,
        0,
        rank,
        lambda path, _s, _d: live.get(path[1]) if path[0] == "model" else None,
        torch.device("cpu"),
        chunk_bytes=800,  # 100 float64: the 300-element tensors go in 3 slices, the small ones packed
    )
    if rank == 1:
        ok = all(
            [
                torch.equal(got["model"]["w"], _state(0)["model"]["w"]),  # type: ignore[index]
                got["model"]["w"].data_ptr() == addr,  # received in place: no second copy of the model
                torch.equal(
                    got["optimizer"]["state"][0]["momentum_buffer"],
                    _state(0)["optimizer"]["state"][0]["momentum_buffer"],  # type: ignore[index]
                ),
                got["step"] == 7 and got["meta"] == {"resizes": [{"from": 2, "to": 3}]},
                torch.equal(got["rng"], _state(0)["rng"]),  # type: ignore[arg-type]
            ]
        )
        Path(out).write_text(str(ok))
    dist.destroy_process_group()


def test_broadcast_state_moves_tensors_in_bounded_slices_into_the_receivers_own_tensors() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_transfer, args=(str(Path(tmp) / "init"), str(Path(tmp) / "ok")), nprocs=2, join=True)
        assert Path(tmp, "ok").read_text() == "True"

"""In-place join (join.py) and the state transfer (state_sync.py): decision tables, and a real
tensor-by-tensor transfer between two gloo processes."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from etj_trainer.resize.join import plan_admission
from etj_trainer.resize.state_sync import broadcast_state, buckets

ADMISSIONS = {
    "room for all: everyone, oldest first": (["a:1", "b:1"], 2, 8, (("a", 1), ("b", 1))),
    "room for one": (["a:1", "b:1"], 3, 4, (("a", 1),)),
    "at the maximum: nobody (they take the restart path after their wait)": (["a:1"], 4, 4, ()),
    "nobody waiting": ([], 1, 4, ()),
    "a node's ranks come together": (["pod-b-7-1:2"], 2, 4, (("pod-b-7-1", 2),)),
    "never part of a node: room for 1 of its 2 ranks admits nobody": (["a:2"], 3, 4, ()),
    "oldest first: a smaller node does not overtake a bigger one": (["a:2", "b:1"], 3, 4, ()),
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


def test_a_nodes_ranks_are_admitted_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in a clean-clone run under load: the two ranks of a joining 2-process pod were admitted at two
    step boundaries (2->3->4) because each queued by itself. Now the node queues once all its ranks are
    warm: an admission at a boundary between the two finds nobody, the next one takes both."""
    import threading
    from datetime import timedelta

    from etj_contract import env as etj_env
    from etj_trainer.core.mac import job_sealer
    from etj_trainer.resize.join import Door, Ticket, ask

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(60))
    monkeypatch.setenv(etj_env.RDZV_ENDPOINT.name, f"127.0.0.1:{master.port}")
    monkeypatch.setenv(etj_env.RDZV_ID.name, "together")
    door = Door.open()
    tickets: dict[int, Ticket | None] = {}

    def joiner(local_rank: int) -> None:
        tickets[local_rank] = ask(wait_s=60, local_rank=local_rank, procs=2, node="pod-b")

    first = threading.Thread(target=joiner, args=(0,))
    first.start()
    prefix = job_sealer().name("etj-join")
    # rank 0 of the node is in: counted warm (today) or queued (before the fix)
    _until(lambda: master.check([f"{prefix}/warm/pod-b"]) or int(master.add(f"{prefix}/n", 0)) > 0)
    early = door.admit("m", 5, world=2, max_ranks=4)  # a step boundary while rank 1 still warms up
    assert (early.joiners, early.new_size) == ((), 2)
    second = threading.Thread(target=joiner, args=(1,))
    second.start()
    _until(lambda: int(master.add(f"{prefix}/n", 0)) > door.admitted)  # the node queued
    late = door.admit("m", 6, world=2, max_ranks=4)
    assert (late.joiners, late.new_size) == (("pod-b",), 4)
    first.join(60)
    second.join(60)
    door.close(shut=True)
    assert tickets == {0: Ticket(late.key, 2, 4, 2), 1: Ticket(late.key, 3, 4, 2)}


def _until(cond: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)

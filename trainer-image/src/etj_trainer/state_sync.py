"""Restoring state when a (new) world forms: newest verified checkpoint wins, and peers share it.

Every rank looks at its own candidates (the node-local /dev/shm copy and the shared PVC copy); the ranks
agree on the newest step with one all-gather, and the rank holding it broadcasts the verified bytes. So
survivors restart from the step they just finished (the local copy), and joiners -- which have no local
copy -- get the same state from a peer instead of an older shared checkpoint.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from etj_trainer.checkpoint import CheckpointStore, decode


def capture_rng() -> dict[str, Any]:
    # Plain containers and tensors only: checkpoints are loaded with weights_only=True.
    np_state: Any = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": [*random.getstate()[1], random.getstate()[0]],
    }


def restore_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    *state, version = rng["python"]
    random.setstate((version, tuple(state), None))


def agree_on_checkpoint(
    store: CheckpointStore, rank: int, world_size: int
) -> tuple[dict[str, Any] | None, int]:
    """Returns (state or None, source rank) on every rank; collective when ``world_size > 1``."""
    local = store.latest()
    my_step = local.step if local is not None else -1
    if world_size == 1 or not dist.is_initialized():
        return (local.state if local else None), rank
    steps = torch.tensor([my_step], dtype=torch.int64)
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(gathered, steps)
    all_steps = [int(t.item()) for t in gathered]
    best = max(all_steps)
    if best < 0:
        return None, 0
    src = all_steps.index(best)  # lowest rank holding the newest step
    obj: list[Any] = [local.blob if (rank == src and local is not None) else None]
    dist.broadcast_object_list(obj, src=src)
    if rank == src and local is not None:
        return local.state, src
    return decode(obj[0]), src

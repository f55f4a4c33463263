"""Restoring state when a (new) world forms: newest verified checkpoint wins, and peers share it.

Every rank looks at its own candidates (the node-local /dev/shm copy and the shared PVC copy); the ranks
agree on the newest step with one all-gather, and the rank holding it broadcasts the verified bytes. So
survivors restart from the step they just finished (the local copy), and joiners -- which have no local
copy -- get the same state from a peer instead of an older shared checkpoint.

``broadcast_state`` moves a live state from one rank to the others without a checkpoint: the small part
(step, sampler, meta, shapes) as one object, the tensors as tensors, packed into buckets of at most
``CHUNK_BYTES`` and received in place into the receiver's own parameters where they fit (so a large model
never needs twice its memory). Crash recovery uses it when survivors disagree on the last committed step;
an in-place join uses it to give the joiner the world's state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from etj_trainer.checkpoint.store import CheckpointStore, LoadedCheckpoint, decode


def agree_on_checkpoint(
    store: CheckpointStore, rank: int, world_size: int
) -> tuple[dict[str, Any] | None, int]:
    """Returns (state or None, source rank) on every rank; collective when ``world_size > 1``.

    The object store is read once per world, not once per rank: each rank offers what its own file
    systems hold, then rank 0 alone downloads from the bucket, and only when the bucket lists a step newer
    than every rank's copy (a restart on fresh nodes). The broadcast below gives it to the others.
    """
    if world_size == 1 or not dist.is_initialized():
        local = store.latest()
        return (local.state if local else None), rank
    local = store.latest_on_node()
    all_steps = _gather_steps(local, world_size)
    if store.shared_objects is not None:
        if rank == 0 and store.newest_object_step() > max(all_steps):
            remote = store.latest_object()  # the newest listed may not verify: then an older one
            if remote is not None and remote.step > _step(local):
                local = remote
        all_steps = _gather_steps(local, world_size)
    best = max(all_steps)
    if best < 0:
        return None, 0
    src = all_steps.index(best)  # lowest rank holding the newest step
    obj: list[Any] = [local.blob if (rank == src and local is not None) else None]
    dist.broadcast_object_list(obj, src=src)
    if rank == src and local is not None:
        return local.state, src
    return decode(obj[0]), src


def _step(checkpoint: LoadedCheckpoint | None) -> int:
    return checkpoint.step if checkpoint is not None else -1


def _gather_steps(checkpoint: LoadedCheckpoint | None, world_size: int) -> list[int]:
    """Every rank's newest step (-1 for none), in rank order."""
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(gathered, torch.tensor([_step(checkpoint)], dtype=torch.int64))
    return [int(t.item()) for t in gathered]


# ---- live state from a peer, tensor by tensor -------------------------------------------------------------

CHUNK_BYTES = 32 << 20  # the most a broadcast packs at once: the extra memory a transfer needs


@dataclass(frozen=True)
class _Ref:
    index: int
    path: tuple[str, ...]


def _split(
    obj: Any, movable: Callable[[torch.Tensor], bool], path: tuple[str, ...] = ()
) -> tuple[Any, list[torch.Tensor]]:
    """``obj`` with every movable tensor replaced by a ``_Ref`` (the skeleton), and those tensors in order."""
    tensors: list[torch.Tensor] = []

    def walk(o: Any, p: tuple[str, ...]) -> Any:
        if isinstance(o, torch.Tensor) and movable(o):
            tensors.append(o)
            return _Ref(len(tensors) - 1, p)
        if isinstance(o, dict):
            return {k: walk(v, (*p, str(k))) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return type(o)(walk(v, (*p, str(i))) for i, v in enumerate(o))
        return o

    return walk(obj, path), tensors


def _join(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(skeleton, _Ref):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        return {k: _join(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_join(v, tensors) for v in skeleton)
    return skeleton


def buckets(sizes: list[tuple[int, torch.dtype]], chunk_bytes: int) -> list[list[int]]:
    """Consecutive tensors of one dtype packed up to ``chunk_bytes``; a bigger tensor goes alone (and is
    sent in chunk-sized slices). Pure: indexes into ``sizes`` (``(bytes, dtype)`` per tensor)."""
    out: list[list[int]] = []
    cur: list[int] = []
    cur_bytes, cur_dtype = 0, None
    for i, (nbytes, dtype) in enumerate(sizes):
        if cur and (dtype != cur_dtype or cur_bytes + nbytes > chunk_bytes):
            out.append(cur)
            cur, cur_bytes = [], 0
        cur.append(i)
        cur_bytes += nbytes
        cur_dtype = dtype
    if cur:
        out.append(cur)
    return out


def _broadcast_tensors(tensors: list[torch.Tensor], src: int, sending: bool, chunk_bytes: int) -> None:
    sizes = [(t.numel() * t.element_size(), t.dtype) for t in tensors]
    for group in buckets(sizes, chunk_bytes):
        if len(group) == 1:
            t = tensors[group[0]]
            flat = t.view(-1) if t.is_contiguous() else None
            if flat is None:
                dist.broadcast(t, src)
                continue
            step = max(1, chunk_bytes // max(1, t.element_size()))
            for start in range(0, flat.numel(), step):
                dist.broadcast(flat[start : start + step], src)  # a view: received in place
            continue
        parts = [tensors[i] for i in group]
        if sending:
            packed = torch.cat([p.reshape(-1) for p in parts])
        else:
            packed = torch.empty(sum(p.numel() for p in parts), dtype=parts[0].dtype, device=parts[0].device)
        dist.broadcast(packed, src)
        if not sending:
            offset = 0
            for p in parts:
                p.copy_(packed[offset : offset + p.numel()].view_as(p))
                offset += p.numel()


def broadcast_state(
    state: dict[str, Any] | None,
    src: int,
    rank: int,
    target: Callable[[tuple[str, ...], tuple[int, ...], torch.dtype], torch.Tensor | None],
    device: torch.device,
    chunk_bytes: int = CHUNK_BYTES,
) -> dict[str, Any]:
    """``src``'s ``state`` on every rank: the small skeleton (step, sampler, meta, shapes) as one object, the
    tensors on ``device`` as tensors, in buckets of at most ``chunk_bytes``.

    A receiver gets each tensor straight into ``target(path, shape, dtype)`` when that returns one (its own
    live parameters: no second copy of the model), else into a fresh tensor. Collective.
    """

    def movable(t: torch.Tensor) -> bool:
        return t.device == device

    header: list[Any] = [None]
    tensors: list[torch.Tensor] = []
    if rank == src:
        assert state is not None
        skeleton, tensors = _split(state, movable)
        header[0] = (skeleton, [(tuple(t.shape), t.dtype) for t in tensors])
    dist.broadcast_object_list(header, src=src)
    skeleton, shapes = header[0]
    if rank != src:
        refs: dict[int, tuple[str, ...]] = {}
        _collect_refs(skeleton, refs)
        for i, (shape, dtype) in enumerate(shapes):
            live = target(refs[i], shape, dtype)
            ok = (
                live is not None
                and tuple(live.shape) == shape
                and live.dtype == dtype
                and live.is_contiguous()
            )
            tensors.append(live if ok else torch.empty(shape, dtype=dtype, device=device))  # type: ignore[arg-type]
    with torch.no_grad():
        _broadcast_tensors(tensors, src, rank == src, chunk_bytes)
    return state if rank == src else _join(skeleton, tensors)  # type: ignore[return-value]


def _collect_refs(skeleton: Any, out: dict[int, tuple[str, ...]]) -> None:
    if isinstance(skeleton, _Ref):
        out[skeleton.index] = skeleton.path
    elif isinstance(skeleton, dict):
        for v in skeleton.values():
            _collect_refs(v, out)
    elif isinstance(skeleton, (list, tuple)):
        for v in skeleton:
            _collect_refs(v, out)


def newest_step(step: int) -> tuple[int, int, list[int]]:
    """(newest committed step in the world, the lowest rank holding it, every rank's step). Collective."""
    world = dist.get_world_size()
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([step], dtype=torch.int64))
    steps = [int(t.item()) for t in gathered]
    best = max(steps)
    return best, steps.index(best), steps

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

Nothing a peer sends is unpickled (core/wire.py): the skeleton travels as tagged JSON bytes, a checkpoint's
bytes as a tensor, decoded with ``torch.load(weights_only=True)`` after its checksum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from etj_trainer.checkpoint.retry import StoreUnreachable
from etj_trainer.checkpoint.store import CheckpointStore, LoadedCheckpoint, decode
from etj_trainer.core import wire


def agree_on_checkpoint(
    store: CheckpointStore, rank: int, world_size: int
) -> tuple[dict[str, Any] | None, int]:
    """Returns (state or None, source rank) on every rank; collective when ``world_size > 1``.

    The object store is read once per world, not once per rank: each rank offers what its own file
    systems hold, then rank 0 alone downloads from the bucket, and only when the bucket lists a step newer
    than every rank's copy (a restart on fresh nodes). The broadcast below gives it to the others. A bucket
    rank 0 cannot list or read (after retry.py's retries) fails every rank with ``StoreUnreachable``: a
    world never restores an older copy, or step 0, while the bucket may hold a newer one.
    """
    if world_size == 1 or not dist.is_initialized():
        local = store.latest()
        return (local.state if local else None), rank
    local = store.latest_on_node()
    all_steps = _gather_steps(_step(local), world_size)
    if store.shared_objects is not None:
        unreachable: StoreUnreachable | None = None
        if rank == 0:
            try:
                if store.newest_object_step() > max(all_steps):
                    remote = store.latest_object()  # the newest listed may not verify: then an older one
                    if remote is not None and remote.step > _step(local):
                        local = remote
            except StoreUnreachable as e:
                unreachable = e
        all_steps = _gather_steps(UNREACHABLE if unreachable else _step(local), world_size)
        if unreachable is not None:
            raise unreachable
        if all_steps[0] == UNREACHABLE:  # every rank fails with the cause, not with a broken collective
            raise StoreUnreachable(f"rank 0 could not read {store.shared_objects} (its log names the error)")
    best = max(all_steps)
    if best < 0:
        return None, 0
    src = all_steps.index(best)  # lowest rank holding the newest step
    blob = wire.broadcast_bytes(local.blob if (rank == src and local is not None) else None, src)
    if rank == src and local is not None:
        return local.state, src
    return decode(blob), src


def _step(checkpoint: LoadedCheckpoint | None) -> int:
    return checkpoint.step if checkpoint is not None else -1


UNREACHABLE = -2  # rank 0's step in the second gather when the object store cannot be read


def _gather_steps(step: int, world_size: int) -> list[int]:
    """Every rank's newest step (-1 for none), in rank order."""
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(gathered, torch.tensor([step], dtype=torch.int64))
    return [int(t.item()) for t in gathered]


# ---- live state from a peer, tensor by tensor -------------------------------------------------------------

CHUNK_BYTES = 32 << 20  # the most a broadcast packs at once: the extra memory a transfer needs


def _split(obj: Any) -> tuple[Any, list[torch.Tensor]]:
    """``obj`` with every tensor replaced by a ``wire.Ref`` (the skeleton), and those tensors in order."""
    tensors: list[torch.Tensor] = []

    def walk(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            tensors.append(o)
            return wire.Ref(len(tensors) - 1)
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return type(o)(walk(v) for v in o)
        return o

    return walk(obj), tensors


def _join(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(skeleton, wire.Ref):
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
    """``src``'s ``state`` on every rank: the small skeleton (step, sampler, meta, shapes) as JSON bytes, the
    tensors as tensors (those on ``device`` there, the rest through the CPU), in buckets of at most
    ``chunk_bytes``.

    A receiver gets each tensor on ``device`` straight into ``target(path, shape, dtype)`` when that returns
    one (its own live parameters: no second copy of the model), else into a fresh tensor. Collective.
    """
    tensors: list[torch.Tensor] = []
    header = b""
    if rank == src:
        assert state is not None
        skeleton, tensors = _split(state)
        on = [t.device == device for t in tensors]
        tensors = [t if o else t.cpu() for t, o in zip(tensors, on, strict=True)]
        header = wire.dumps(
            [skeleton, [[list(t.shape), str(t.dtype), o] for t, o in zip(tensors, on, strict=True)]]
        )
    skeleton, shapes = _header(wire.broadcast_bytes(header if rank == src else None, src))
    if rank != src:
        refs: dict[int, tuple[str, ...]] = {}
        _collect_refs(skeleton, (), refs)
        for i, (shape, dtype, on_device) in enumerate(shapes):
            live = target(refs[i], shape, dtype) if on_device else None
            ok = (
                live is not None
                and tuple(live.shape) == shape
                and live.dtype == dtype
                and live.is_contiguous()
            )
            where = device if on_device else torch.device("cpu")
            tensors.append(live if ok else torch.empty(shape, dtype=dtype, device=where))  # type: ignore[arg-type]
    with torch.no_grad():
        for on_device in (True, False):  # two backends' tensors, never in one bucket
            part = [t for t, (_s, _d, o) in zip(tensors, shapes, strict=True) if o == on_device]
            _broadcast_tensors(part, src, rank == src, chunk_bytes)
    return state if rank == src else _join(skeleton, tensors)  # type: ignore[return-value]


def _header(data: bytes) -> tuple[Any, list[tuple[tuple[int, ...], torch.dtype, bool]]]:
    """The skeleton and the tensors' (shape, dtype, on the device) from a peer's header; ValueError for
    anything this trainer did not send."""
    try:
        skeleton, shapes = wire.loads(data)
        out = []
        for shape, name, on_device in shapes:
            dtype = getattr(torch, str(name).removeprefix("torch."), None)
            if not isinstance(dtype, torch.dtype) or not all(isinstance(n, int) and n >= 0 for n in shape):
                raise ValueError(f"not a tensor this trainer sent: {shape} {name}")
            out.append((tuple(shape), dtype, bool(on_device)))
    except TypeError as e:  # a header of the wrong shape
        raise ValueError(f"not a header this trainer sent: {e}") from e
    return skeleton, out


def _collect_refs(skeleton: Any, path: tuple[str, ...], out: dict[int, tuple[str, ...]]) -> None:
    if isinstance(skeleton, wire.Ref):
        out[skeleton.index] = path
    elif isinstance(skeleton, dict):
        for k, v in skeleton.items():
            _collect_refs(v, (*path, str(k)), out)
    elif isinstance(skeleton, (list, tuple)):
        for i, v in enumerate(skeleton):
            _collect_refs(v, (*path, str(i)), out)


def newest_step(step: int) -> tuple[int, int, list[int]]:
    """(newest committed step in the world, the lowest rank holding it, every rank's step). Collective."""
    world = dist.get_world_size()
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([step], dtype=torch.int64))
    steps = [int(t.item()) for t in gathered]
    best = max(steps)
    return best, steps.index(best), steps

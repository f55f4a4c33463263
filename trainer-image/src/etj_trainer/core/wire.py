"""What ranks send each other besides tensors: bytes and JSON, never pickles.

torch's object collectives (``broadcast_object_list``, ``all_gather_object``) pickle on the sender and
unpickle on the receiver: a peer that is not what it claims (a group formed with a forged ticket, a
process that registered itself under a group's key) runs code in every rank that receives from it. So the
resize paths send bytes as tensors (a length, then the bytes: ``broadcast_bytes``) and structure as JSON
with tagged containers (``dumps``/``loads``), which keep what JSON alone loses -- tuples, and dict keys that
are not strings (an optimizer's state is keyed by parameter index) -- and refuse anything else.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

MAX_BYTES = 1 << 34  # a length a peer announces beyond this is refused before anything is allocated


def broadcast_bytes(data: bytes | None, src: int) -> bytes:
    """``src``'s ``data`` on every rank, as CPU tensors (the group's control backend). Collective."""
    sent = data if dist.get_rank() == src and data is not None else None
    length = torch.tensor([len(sent) if sent is not None else 0], dtype=torch.int64)
    dist.broadcast(length, src)
    n = int(length.item())
    if not 0 <= n <= MAX_BYTES:
        raise ValueError(f"a peer announced {n} bytes")
    buf = torch.frombuffer(bytearray(sent), dtype=torch.uint8) if sent else torch.empty(n, dtype=torch.uint8)
    if n:
        dist.broadcast(buf, src)
    return sent if sent is not None else bytes(buf.numpy().tobytes())


class Ref:
    """A tensor's place in a skeleton: its index in the tensors sent beside it."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref) and other.index == self.index

    def __hash__(self) -> int:
        return hash(self.index)

    def __repr__(self) -> str:
        return f"Ref({self.index})"


_PLAIN = (str, int, float, bool, type(None))


def _tag(o: Any) -> Any:
    if isinstance(o, _PLAIN):
        return o
    if isinstance(o, Ref):
        return {"r": o.index}
    if isinstance(o, dict):
        return {"d": [[_tag(k), _tag(v)] for k, v in o.items()]}
    if isinstance(o, tuple):
        return {"t": [_tag(v) for v in o]}
    if isinstance(o, list):
        return {"l": [_tag(v) for v in o]}
    raise TypeError(
        f"{type(o).__name__} cannot be sent to a peer (plain values, containers and tensors only)"
    )


def _untag(o: Any) -> Any:
    if isinstance(o, _PLAIN):
        return o
    if isinstance(o, dict) and len(o) == 1:
        ((kind, v),) = o.items()
        if kind == "r" and isinstance(v, int) and not isinstance(v, bool):
            return Ref(v)
        if kind in ("t", "l", "d") and isinstance(v, list):
            if kind == "t":
                return tuple(_untag(x) for x in v)
            if kind == "l":
                return [_untag(x) for x in v]
            if all(isinstance(p, list) and len(p) == 2 for p in v):
                return {_hashable(_untag(k)): _untag(x) for k, x in v}
    raise ValueError("not a skeleton this trainer sent")


def _hashable(k: Any) -> Any:
    if isinstance(k, (list, dict)):
        raise ValueError("a dict key that is a container")
    return k


def dumps(skeleton: Any) -> bytes:
    return json.dumps(_tag(skeleton), allow_nan=True).encode()


def loads(data: bytes) -> Any:
    """A skeleton ``dumps`` made; ValueError for anything else (a pickle included: never run)."""
    try:
        return _untag(json.loads(data.decode()))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"not a skeleton this trainer sent: {e}") from e

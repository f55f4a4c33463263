"""The job's replica bounds, operator → running agents and trainers: ``kubectl scale`` reaches them.

A worker pod's environment is fixed when the pod is created, so a change of ``spec.replicas`` while the job
runs would reach only new pods: the running agents would keep the maximum they started with (torch's
rendezvous completes a round at *its* maximum and puts the new pods on the wait list, round after round),
and rank 0 would refuse joiners above it. So the operator POSTs the current bounds to the job's store pod
(``POST /replicas`` with the job's token, like ``/progress``), which keeps them in the job's TCPStore under
``STORE_KEY``; each agent reads them before a rendezvous round, rank 0 before it admits joiners in place.
Until the operator has said anything the bounds from the environment apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

REPLICAS_PATH = "/replicas"
STORE_KEY = "etj/replicas"


class KeyStore(Protocol):
    """The two store operations used (torch.distributed.Store has them)."""

    def check(self, keys: list[str]) -> bool: ...

    def get(self, key: str) -> bytes: ...


@dataclass(frozen=True)
class Replicas:
    """spec.replicas in worker pods."""

    min: int
    max: int

    def to_json(self) -> dict[str, int]:
        return {"min": self.min, "max": self.max}

    @classmethod
    def from_json(cls, raw: Any) -> Replicas | None:
        """The bounds in a request body; None unless both are integers with 1 <= min <= max."""
        if not isinstance(raw, dict):
            return None
        lo, hi = raw.get("min"), raw.get("max")
        if not (type(lo) is int and type(hi) is int and 1 <= lo <= hi):  # bool is not a bound
            return None
        return cls(lo, hi)

    def encode(self) -> str:
        return f"{self.min}:{self.max}"

    @classmethod
    def decode(cls, value: bytes | str) -> Replicas | None:
        text = value.decode() if isinstance(value, bytes) else value
        lo, _, hi = text.partition(":")
        try:
            return cls.from_json({"min": int(lo), "max": int(hi)})
        except ValueError:
            return None


def read(store: KeyStore) -> Replicas | None:
    """The bounds the operator last set on the job's store, or None (not said yet)."""
    if not store.check([STORE_KEY]):
        return None
    return Replicas.decode(store.get(STORE_KEY))

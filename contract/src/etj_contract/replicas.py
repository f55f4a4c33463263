"""The job's replica bounds, operator → running agents and trainers: ``kubectl scale`` reaches them.

A worker pod's environment is fixed when the pod is created, so a change of ``spec.replicas`` while the job
runs would reach only new pods: the running agents would keep the maximum they started with (torch's
rendezvous completes a round at *its* maximum and puts the new pods on the wait list, round after round),
and rank 0 would refuse joiners above it. So the operator POSTs the current bounds to the job's store pod
(``POST /replicas`` with the job's token, like ``/progress``), which keeps them in memory; each agent reads
them (``GET /replicas``, with the token) before a rendezvous round, rank 0 before it admits joiners in
place. Until the operator has said anything the bounds from the environment apply.

Not in the TCPStore: it has no authentication, so a client without the token could set them there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from etj_contract.progress import PROGRESS_PATH

REPLICAS_PATH = "/replicas"


def replicas_url(progress_url: str) -> str:
    """The store pod's ``/replicas`` endpoint, next to its progress endpoint."""
    base = progress_url[: -len(PROGRESS_PATH)] if progress_url.endswith(PROGRESS_PATH) else progress_url
    return base.rstrip("/") + REPLICAS_PATH


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

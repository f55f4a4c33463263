"""Who this process is in the world, and how it is told to stop: shared by the loop API (loop/) and its
in-process resizes (resize/inplace.py), split out of the Job to keep each module to one concern."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from etj_trainer.core import devices, stopping


class StopFlag:
    """Set by SIGTERM; acted on at the next step boundary (never mid-step).

    ``code`` says why (see stopping.py): the pod is leaving, or our agent is restarting us because a node
    joins -- the agent writes that into ETJ_AGENT_STATE_FILE before it signals.
    """

    def __init__(self) -> None:
        self.requested = False
        self.code = stopping.StopCode.RUN

    def request(self, code: stopping.StopCode = stopping.StopCode.LEAVING) -> None:
        self.requested = True
        self.code = code

    def install(self) -> StopFlag:
        global _installed

        def handler(signum: int, _frame: object) -> None:
            restarting = stopping.agent_is_restarting()
            self.request(stopping.StopCode.RESTARTING if restarting else stopping.StopCode.LEAVING)

        signal.signal(signal.SIGTERM, handler)
        _installed = self
        return self


_installed: StopFlag | None = None  # the flag SIGTERM sets in this process (etj-train worker installs it)


def installed() -> StopFlag | None:
    return _installed


@dataclass
class World:
    """This process's place in the current membership of the world."""

    dist_on: bool
    rank: int
    size: int
    local_rank: int
    local_size: int
    device: torch.device

    @classmethod
    def current(cls) -> World:
        dist_on = dist.is_available() and dist.is_initialized()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return cls(
            dist_on=dist_on,
            rank=dist.get_rank() if dist_on else 0,
            size=dist.get_world_size() if dist_on else 1,
            local_rank=local_rank,
            local_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            device=devices.bind(local_rank),
        )


def incarnation(dist_on: bool) -> float:
    """A world-wide id of this membership (rank 0's clock): tags sample-log lines, heartbeats and the store
    keys of a re-form."""
    inc = torch.tensor([time.time()], dtype=torch.float64)  # a tensor, not a pickle (core/wire.py says why)
    if dist_on:
        dist.broadcast(inc, src=0)
    return float(inc.item())

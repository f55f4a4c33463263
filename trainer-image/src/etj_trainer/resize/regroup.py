"""In-process resize: when ranks leave gracefully, the survivors re-form the world without restarting.

A spot notice or a node drain reaches a worker as SIGTERM from its agent. Every rank puts a *stop code*
into the step's closing all-reduce (one slot per rank), so at the same step boundary every rank knows
exactly who is leaving and why. When all the stopping ranks are *leaving* (their pod is going away), the
survivors do not need torch elastic to kill and restart them: they destroy the process group, build a new
one among themselves on the job's external store (``ETJ_RDZV_ENDPOINT``, which outlives any worker) and go
on from the state already in memory. That removes the process restart, the rendezvous round, the
checkpoint restore and the peer broadcast from the pause (bench/resize_pause.py).

The same all-reduce admits joiners in place: rank 0 says ``ADMIT`` while joiners wait (join.py), and old
and new ranks re-form the world together. The restart path stays for everything else: a rank whose *agent*
is restarting it (a joiner that took the rendezvous path, so every agent re-rendezvouses), a crash that
cannot be recovered in place (recover.py), or survivors below the job's minimum (torch elastic's rendezvous
is what waits for capacity). Pure decision logic here; ``reform`` is the I/O.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist

from etj_contract import env as etj_env
from etj_trainer.core import store_client
from etj_trainer.core.mac import job_sealer
from etj_trainer.core.stopping import StopCode, collective_timeout
from etj_trainer.resize import group_sockets


@dataclass(frozen=True)
class Regroup:
    survivors: tuple[int, ...]  # old ranks that go on, in order; new rank = position in this tuple
    in_process: bool  # False: every rank stops and torch elastic restarts the world
    reason: str
    admit: bool = False  # nobody leaves; joiners are admitted (join.py)

    def new_rank(self, old_rank: int) -> int:
        return self.survivors.index(old_rank)

    def describe(self) -> str:
        """The log line of the choice: in place or the restart path, and why."""
        return f"{'in place' if self.in_process else 'restart the world'} ({self.reason})"


def whole_nodes(codes: list[int], procs_per_node: int) -> list[int]:
    """A pod leaves with all its ranks: LEAVING from any rank of a node applies to the node's every rank.

    The agent signals its workers one after another, so a step boundary can fall between two of them; going
    by the first one keeps a leaving pod's other ranks out of the survivors' world. torch elastic numbers a
    node's ranks consecutively (``procs_per_node`` each) and survivors keep their order, so node = rank //
    procs_per_node in every world the job forms.
    """
    if procs_per_node <= 1:
        return list(codes)
    leaving = {r // procs_per_node for r, c in enumerate(codes) if c == StopCode.LEAVING}
    return [
        int(StopCode.LEAVING) if c == StopCode.RUN and r // procs_per_node in leaving else c
        for r, c in enumerate(codes)
    ]


def decide(
    codes: list[int], min_ranks: int, enabled: bool, procs_per_node: int = 1, disabled: str | None = None
) -> Regroup:
    """What the world does after a step in which some ranks asked to stop (``codes[r]`` per old rank).

    ``min_ranks`` is the job's minimum in ranks (replicas.min x processes per pod); ``disabled``: why
    in-process resizes are off, when it is not the default reason (no agent or external store).
    """
    codes = whole_nodes(codes, procs_per_node)
    survivors = tuple(r for r, c in enumerate(codes) if c in (StopCode.RUN, StopCode.ADMIT))
    if not enabled:
        why = disabled or "no etj agent or external store"
        return Regroup(survivors, False, f"in-process resize disabled ({why})")
    if any(c == StopCode.RESTARTING for c in codes):
        return Regroup(survivors, False, "an agent is restarting its workers (a node is joining)")
    if not survivors:
        return Regroup(survivors, False, "every rank is leaving")
    if len(survivors) == len(codes):  # only ADMIT: a leave, if any, goes first (admitted at the next step)
        return Regroup(survivors, True, "admit joiners", admit=True)
    if len(survivors) < min_ranks:
        return Regroup(survivors, False, f"{len(survivors)} surviving ranks < minimum {min_ranks}")
    return Regroup(survivors, True, "graceful leave")


def enabled_from_env() -> bool:
    """Only under ``etj-train worker`` (which sets ETJ_AGENT_STATE_FILE) with an external store."""
    return bool(os.environ.get(etj_env.AGENT_STATE_FILE.name)) and bool(
        os.environ.get(etj_env.RDZV_ENDPOINT.name)
    )


def reform(key: str, new_rank: int, new_world: int) -> None:
    """Replace the default process group with one of ``new_world`` ranks (devices.py's backends), met on the
    external store.

    ``key`` must be the same on every survivor and never reused by this job (old-incarnation id + step).
    The group meets under the job's token-derived namespace (core/mac.py): torch's process-group
    rendezvous values cannot be sealed, so a client without the token must not be able to name them (it
    would register itself as a rank, or a rank's address, and receive or send the world's tensors).
    """
    timeout = collective_timeout()
    if dist.is_initialized():  # (a joiner's first group, or a crash survivor's: recover.py closed it)
        dist.destroy_process_group()
    store = store_client.job_store()
    group_sockets.init(
        store=dist.PrefixStore(job_sealer().name("etj-regroup", key), store),
        rank=new_rank,
        world_size=new_world,
        timeout=timeout,
    )

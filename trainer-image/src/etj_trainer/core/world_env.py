"""torch elastic's environment kept true across in-place resizes (issue 47, rung 2).

torch elastic's agent sets ``RANK``, ``WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``... once, when it
starts a worker; libraries read them from ``os.environ`` whenever they like (Lightning's environment
plugins, torchmetrics, accelerate's ``PartialState``, torchtitan). An in-place resize (a leave, a join, a
recovery) forms a new default group in the same process, so without this the survivors go on reading the
old world and a joiner, which torch's agent never started, has no ``RANK`` at all. Every group a worker
forms with an explicit rank (group_sockets.init) publishes its world here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from etj_contract import env as etj_env


def world_env(rank: int, world_size: int, env: Mapping[str, str]) -> dict[str, str]:
    """What torch elastic would have set for ``rank`` of ``world_size`` (pure).

    Nodes keep consecutive ranks in every world etj forms (regroup.whole_nodes), so a node's index is
    ``rank // LOCAL_WORLD_SIZE``. The group met on the job's store, so that is its MASTER_ADDR/PORT (where
    torch's agent would name the store it shares); without one (a test's world) they stay as they are."""
    local = max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    out = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "GROUP_RANK": str(rank // local),
        "GROUP_WORLD_SIZE": str(max(1, world_size // local)),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
    }
    endpoint = env.get(etj_env.RDZV_ENDPOINT.name)
    if endpoint:
        host, _, port = endpoint.rpartition(":")
        if host and port.isdigit():
            out["MASTER_ADDR"], out["MASTER_PORT"] = host.strip("[]"), port
    return out


def publish(rank: int, world_size: int, env: MutableMapping[str, str] | None = None) -> None:
    """Write ``world_env`` into this process's environment (``os.environ`` unless told otherwise)."""
    target = os.environ if env is None else env
    target.update(world_env(rank, world_size, target))

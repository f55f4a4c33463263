"""Why a rank stops, as the agent, its workers and their peers all read it; the bottom of the trainer.

Shared by the worker side (core/world.py's SIGTERM handler, the loop's commit all-reduce), the in-process
resizes (resize/regroup.py, join.py, recover.py) and the agent (agent/worker.py), so it lives below all of
them: the stop codes every rank puts into a step's closing all-reduce, the agent-state file through which
an agent tells its workers whether a SIGTERM means "leaving" or "restarting", and how long a collective
may wait for a peer that vanished.
"""

from __future__ import annotations

import os
from datetime import timedelta
from enum import IntEnum

from etj_contract import env as etj_env


class StopCode(IntEnum):
    RUN = 0
    LEAVING = 1  # this rank's pod is going away (the agent got SIGTERM)
    RESTARTING = 2  # this rank's agent restarts its workers (membership grows): everyone restarts
    ADMIT = 3  # rank 0 only: joiners are waiting; old + new ranks re-form the world in place (join.py)


AGENT_RESTARTING, AGENT_RUNNING = "restarting", "running"


def write_agent_state(path: str, state: str) -> None:
    """The agent's half of ETJ_AGENT_STATE_FILE: written before it signals its workers."""
    if path:
        with open(path, "w") as f:
            f.write(state)


def agent_is_restarting() -> bool:
    """The workers' half, read by the SIGTERM handler: did our agent say it is restarting us?"""
    path = os.environ.get(etj_env.AGENT_STATE_FILE.name)
    if not path:
        return False
    try:
        with open(path) as f:
            return f.read().strip() == AGENT_RESTARTING
    except OSError:
        return False


def training_done_file(state_file: str) -> str:
    """Beside the agent-state file, the workers' answer: this world has trained its last step. A node that
    waits to join then restarts nothing (elastic_agent.py): the job is finishing, not growing."""
    return f"{state_file}.done" if state_file else ""


def mark_training_done() -> None:
    """The workers' half: written by every rank once its loop has trained the last step (or restored a
    state with none left), before the final checkpoint, the result and whatever the script does after."""
    path = training_done_file(os.environ.get(etj_env.AGENT_STATE_FILE.name, ""))
    if path:
        with open(path, "w") as f:
            f.write("done")


def training_done(state_file: str) -> bool:
    """The agent's half: have this node's workers trained the last step?"""
    path = training_done_file(state_file)
    return bool(path) and os.path.exists(path)


def collective_timeout() -> timedelta:
    """Bounded (ETJ_COLLECTIVE_TIMEOUT_S, default 120 s): a peer that vanished without closing its sockets
    must not hang the survivors for torch's default 30 minutes (pytorch#111646)."""
    return timedelta(seconds=etj_env.COLLECTIVE_TIMEOUT_S.get(os.environ, 120))

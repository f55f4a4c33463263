"""Imported first inside the agent's forkserver (``agent.BASE_PRELOAD``): the forkserver dies with its agent.

Python's forkserver is meant to exit when its client's "alive" pipe closes, but every process it forks
keeps a copy of that pipe's write end (so that it could use the forkserver itself): while a worker lives,
the forkserver never sees its agent go, and the worker's parent -- the forkserver -- never dies. A
SIGKILLed agent (OOM kill, a lost node inside a pod) would leave its workers training on as full ranks, so
the kernel kills the forkserver with the agent instead, and each worker with the forkserver
(``lifetime.die_with_parent`` in ``agent.worker_entry``).
"""

import os

from etj_contract import env as etj_env
from etj_trainer.agent.lifetime import die_with_parent

_agent = etj_env.AGENT_PID.read(os.environ)
if _agent is not None:
    die_with_parent(expected_parent=_agent)

"""Imported only inside the agent's forkserver (``agent.BASE_PRELOAD``): the forkserver ignores SIGTERM.

Workers are children of the forkserver, and the agent learns that a worker ended through the forkserver.
When a pod's whole process group gets SIGTERM (``tini -g``, ``kill -- -PGID``, the local bed's process
nodes), the forkserver used to die at once; the agent then saw its workers as gone, exited, and the runtime
SIGKILLed the still-running worker mid-step -- turning a graceful leave into a crash for everyone (found by
``make demo``). It still dies with the agent (``_forkserver_dies_with_agent``). Forked workers
inherit SIG_IGN until the trainer installs its own handler, so an early SIGTERM cannot kill them either.
"""

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)

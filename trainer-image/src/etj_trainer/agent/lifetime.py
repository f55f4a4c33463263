"""Processes that must not outlive their parent: a worker its forkserver, the forkserver its agent.

Standard library only: the forkserver imports this first of all, before torch.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> None:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux; a no-op elsewhere).

    The kernel tracks the parent *thread* that created this process, so the parent must create it from a
    thread that lives as long as it does (the agent starts its forkserver from its main thread).
    ``expected_parent``: exit at once if the parent is already another process -- it died (and this one
    was re-parented) before the request took effect.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid() if expected_parent is None else expected_parent
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        return
    if os.getppid() != parent:
        os._exit(1)

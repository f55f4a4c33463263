"""The sockets of this process's default process group, so that leaving a failed group really closes them.

A survivor of a crashed peer leaves the failed collective to recover (recover.py); a peer still blocked on
it in that collective fails only when its sockets close. gloo closes a group's sockets when the last
reference to the group goes, and with torch 2.14 a DistributedDataParallel wrapper leaves one behind that we
could not find: after ``destroy_process_group`` and a full collection, with no DDP object left, the blocked
peer stayed blocked until our process exited (a group that never had a DDP wrapper closes at once). Seen on
a loaded CI machine: rank 0 stayed blocked on rank 1 for 47 s and was left out of the recovered world.

So the group's sockets are found the plain way: the socket descriptors that ``init_process_group`` opened
(/proc/self/fd before and after), each with its inode, so a descriptor number reused later by another
socket is never touched. ``shut`` shuts the connected ones down both ways (the peer reads end-of-file at
once; the descriptors stay open and are closed by whoever owns them). Linux only; elsewhere it does
nothing.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch.distributed as dist

from etj_trainer.core import devices, stopping, store_client, world_env

_FD_DIR = "/proc/self/fd"
_owned: frozenset[tuple[int, str]] = frozenset()
# Bound at import: while a script on the loop API runs, torch's name is replaced by a refusal
# (worker_process.refusing_own_process_group); the worker's own groups are still formed here.
_init_process_group = dist.init_process_group


def _sockets() -> set[tuple[int, str]]:
    """(descriptor, "socket:[inode]") for every socket this process has open."""
    found: set[tuple[int, str]] = set()
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"{_FD_DIR}/{name}")
        except OSError:  # closed since listdir
            continue
        if target.startswith("socket:"):
            found.add((int(name), target))
    return found


def init(backend: str | None = None, **kwargs: Any) -> None:
    """``dist.init_process_group``, remembering the sockets it opened. Every group of a worker (the first,
    a regroup, a join, a recovery) is made here, on ``devices.process_group_backend()`` unless a test
    names another ``backend``."""
    global _owned
    before = _sockets()
    _init_process_group(backend or devices.process_group_backend(), **kwargs)
    _owned = frozenset(_sockets() - before)
    if "rank" in kwargs and "world_size" in kwargs:
        world_env.publish(int(kwargs["rank"]), int(kwargs["world_size"]))


def init_first() -> None:
    """A worker's first group, from torch elastic's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT), with
    the bounded collective timeout (core/stopping.py).

    Where the agent shares its rendezvous store (TORCHELASTIC_USE_AGENT_STORE, etj's agents), the client is
    made here as torch's env:// makes it (a client of MASTER_ADDR:MASTER_PORT, keys under "default_pg"),
    but without libuv: env:// makes it with TCPStore's default, which a torch built without libuv refuses
    (core/store_client.py)."""
    timeout = stopping.collective_timeout()
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        init(init_method=store_client.ENV_INIT_METHOD, timeout=timeout)
        return
    store = store_client.client(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout)
    init(
        store=dist.PrefixStore("default_pg", store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )


def shut() -> int:
    """Shut down the sockets the current default group opened (those still open); how many."""
    global _owned
    shut_down = 0
    for fd, _ in _owned & _sockets():
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # closed by its owner since we looked (gloo closes a failed pair's socket)
            continue
        try:
            # not gloo's listener: shutting it down makes its accept thread abort the whole process
            if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                sock.shutdown(socket.SHUT_RDWR)
                shut_down += 1
        except OSError:  # already broken
            pass
        finally:
            sock.detach()  # the descriptor stays its owner's to close
    _owned = frozenset()
    return shut_down

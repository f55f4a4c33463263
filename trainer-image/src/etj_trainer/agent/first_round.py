"""The first world forms at the size already scheduled, not 0 -> 2 -> 4.

torch elastic's rendezvous completes a round once ``min_nodes`` agents are in and ``last_call`` (about a
second here, so that a join is quick) has passed. Agents of one job start seconds apart -- a pod is
scheduled later, one node imports torch slower -- so the first round formed with the fast ones and every
straggler then cost the whole world a restart (seen in ``make demo``: 0 -> 2 -> 4, and in a clean-clone test
run on a loaded machine: 1 -> 2).

So before its first rendezvous each agent counts itself in on the job's store and waits, bounded, until
``ETJ_STARTUP_WORKERS`` agents have arrived: the workers that exist once its own pod's batch exists (the
operator sets it per pod; ``etj-train local`` to its initial node count). The counter only grows, so every
later agent -- a joiner, a replacement, a restarted container -- finds it already reached and goes straight
on; a pod that never starts costs the others at most ``ETJ_STARTUP_WAIT_SECONDS`` and the world forms
without it, exactly as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

DEFAULT_WAIT_SECONDS = 60.0
POLL_SECONDS = 0.05


class CounterStore(Protocol):
    """The one store operation used (torch.distributed.Store has it)."""

    def add(self, key: str, value: int) -> int: ...


@dataclass(frozen=True)
class StartupWait:
    arrived: int  # agents counted in when this one stopped waiting (itself included)
    expected: int
    waited_s: float
    position: int = 0  # this agent's own count-in: past ``expected``, it came after the start-up

    @property
    def complete(self) -> bool:
        return self.arrived >= self.expected

    @property
    def late(self) -> bool:
        """A joiner or a replacement, not one of the start-up's agents: its first round must not wait for
        the start-up's count (the world may have shrunk below it since)."""
        return self.position > self.expected


def arrivals_key(run_id: str) -> str:
    return f"etj/startup/{run_id}/arrived"


def wait_for_startup_peers(
    store: CounterStore,
    run_id: str,
    expected: int,
    bound_s: float = DEFAULT_WAIT_SECONDS,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> StartupWait:
    """Count this agent in, then wait until ``expected`` agents have, or ``bound_s`` has passed."""
    key = arrivals_key(run_id)
    start = clock()
    arrived = position = store.add(key, 1)
    while arrived < expected and clock() - start < bound_s:
        sleep(POLL_SECONDS)
        arrived = store.add(key, 0)  # add 0: a read that does not block on a missing key
    result = StartupWait(arrived, expected, clock() - start, position)
    if not result.complete:
        log.warning(
            "etj start-up: %d of %d workers arrived within %.0f s; forming the first world without the rest",
            arrived,
            expected,
            bound_s,
        )
    return result

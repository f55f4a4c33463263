"""Unreachable is not empty: reading the shared checkpoint store again, with backoff, then failing by name.

A LIST or GET that fails says nothing about what the store holds. Reading it as "no checkpoint" made a
world restarted on fresh nodes while S3 was unreachable start again from step 0 (or from an older local
copy), and the next shared write then pruned the newer checkpoints away. So a read of the store is
retried with exponential backoff for at most ``checkpoint_store_timeout_s`` (ETJ_CHECKPOINT_STORE_TIMEOUT_S)
and then fails with ``StoreUnreachable``, which names the store and the last error: the worker exits and
is restarted, and the job's last error says why.

``next_delay`` is the decision (pure); ``retried`` the loop around one operation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreUnreachable(RuntimeError):
    """The shared checkpoint store could not be read within the retry budget."""


@dataclass(frozen=True)
class Backoff:
    timeout_s: float  # the whole budget: no new try starts after it
    first_s: float = 0.5  # the first wait; each next one doubles
    cap_s: float = 15.0  # the longest single wait


def next_delay(policy: Backoff, attempt: int, elapsed_s: float) -> float | None:
    """Seconds to wait before try ``attempt + 1`` after ``attempt`` failed tries (1-based) took
    ``elapsed_s``; None: give up. The last wait is cut so that the last try starts by the deadline."""
    left = policy.timeout_s - elapsed_s
    if left <= 0:
        return None
    wait: float = min(policy.first_s * 2.0 ** (attempt - 1), policy.cap_s, left)
    return wait


def retried(
    op: Callable[[], T],
    what: str,
    policy: Backoff,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``op()``, tried again after each failure until ``policy`` gives up; then ``StoreUnreachable``."""
    t0 = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return op()
        except Exception as e:  # network, credentials, a 5xx: all "cannot tell what the store holds"
            delay = next_delay(policy, attempt, clock() - t0)
            if delay is None:
                raise StoreUnreachable(
                    f"cannot {what} after {attempt} tries in {clock() - t0:.0f} s "
                    f"(ETJ_CHECKPOINT_STORE_TIMEOUT_S={policy.timeout_s:g}): {type(e).__name__}: {e}"
                ) from e
            log.warning("cannot %s (try %d, again in %.1f s): %s", what, attempt, delay, e)
            sleep(delay)

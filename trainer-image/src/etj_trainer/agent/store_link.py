"""Store loss is a non-event for the agent: train on without the store, then re-form the world on a new one.

torch's c10d rendezvous handler keeps one TCPStore client for its whole life. When the job's store pod is
lost (its node gone, evicted, drained), every call on that client raises, and torch elastic's agent loop,
which asks ``num_nodes_waiting()`` every monitor interval, lets the error escape: every agent exits 1 and
the operator counts one worker failure per pod -- a job with the default budget fails, one store loss.

Yet training does not need the store: the workers' process group has its own store on rank 0's node
(``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``), so nothing has to stop when the rendezvous store goes away.
``ReconnectingRendezvous`` wraps torch's handler so that:

- while the store does not answer, ``num_nodes_waiting()`` says 0 and the workers train on;
- every ``probe_interval`` it tries the endpoint again. The operator replaces a lost store at once behind
  the same Service name, so a fresh lookup of the same endpoint finds the new one. A store that moves off a
  drained node is replaced before it goes (the Service selects the new one only once it is Ready, and the
  old one is deleted after that: etj_operator.decide.plan.store_move), so the first probe after the loss finds
  it. A new store holds no rendezvous state (no round, no participants): every agent must join it again,
  or a joiner would form a world of its own there. So once a store answers, a fresh handler is built on it
  and ``num_nodes_waiting()`` says 1: the agent restarts its workers (they stop at a step boundary with their
  just-in-time local copy, so at most the step in flight is redone) and joins the new store's first round;
- ``next_rendezvous()`` waits out a lost store too (up to the join timeout) instead of raising, so an agent
  that needs a round while the store is away (a peer left, a crash) waits for the new store.

Store errors never reach torch's agent loop, so they are never counted as worker failures, and the agent
knows when a worker failure came with a store loss (``lost``; the crash budget does not count those).
The decision of what to do at each call is ``next_action`` (pure, table-tested); the class is its I/O.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from torch.distributed import DistError
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousTimeoutError

log = logging.getLogger(__name__)

# A lost store, as torch's backend wraps it, or raw from code that uses the store directly.
STORE_ERRORS: tuple[type[Exception], ...] = (RendezvousConnectionError, DistError)


class Action(Enum):
    ASK = "ask"  # the store is there: ask it
    WAIT = "wait"  # the store is away and was probed a moment ago: train on
    PROBE = "probe"  # the store is away: try the endpoint again now
    REFORM = "reform"  # a new store answers: the world must re-form on it


@dataclass(frozen=True)
class LinkState:
    lost_since: float | None = None  # monotonic time the store stopped answering; None: connected
    last_probe: float | None = None
    reform_pending: bool = False  # a fresh handler is up on a new store; no round joined on it yet


def next_action(state: LinkState, now: float, probe_interval: float) -> Action:
    """What ``num_nodes_waiting()`` does now."""
    if state.reform_pending:
        return Action.REFORM
    if state.lost_since is None:
        return Action.ASK
    if state.last_probe is not None and now - state.last_probe < probe_interval:
        return Action.WAIT
    return Action.PROBE


def store_answers(endpoint: str, timeout: float = 1.0) -> bool:
    """Whether something accepts connections at ``host:port`` (resolved afresh: the Service may point
    at a new pod)."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host or endpoint, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


class StoreNeverAnswered(Exception):
    """The job's store did not answer within the start-up bound."""


def build_when_store_answers(
    build: Callable[[], Any],
    endpoint: str,
    within_s: float,
    *,
    probe_interval: float = 0.5,
    report_every_s: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    answers: Callable[[str], bool] = store_answers,
) -> Any:
    """``build()`` (the rendezvous handler and its store client) once the store at ``endpoint`` answers.

    The store pod may start minutes after the workers (a new node, a multi-GB image pull), and a
    replacement worker may start while the store is being replaced. torch's store client gives up after
    its read timeout and the agent would exit 1 -- one worker failure per pod, so a job could fail before
    its first step. Here the agent waits instead, up to ``within_s`` (the job's start-up deadline).
    """
    started = clock()
    reported = started
    while True:
        if answers(endpoint):
            try:
                return build()
            except STORE_ERRORS as e:  # listening but not serving yet (the store process is starting)
                log.info("store at %s answers but the rendezvous cannot use it yet: %s", endpoint, e)
        now = clock()
        if now - started > within_s:
            raise StoreNeverAnswered(f"no rendezvous store at {endpoint} within {within_s:.0f} s")
        if now - reported >= report_every_s:
            reported = now
            waited = f"{now - started:.0f} s"
            print(f"etj-train worker: waiting for the rendezvous store at {endpoint} ({waited})", flush=True)
        time.sleep(probe_interval)


class ReconnectingRendezvous(RendezvousHandler):
    """torch's rendezvous handler, made to outlive its store (see the module docstring)."""

    def __init__(
        self,
        factory: Callable[[], RendezvousHandler],
        endpoint: str,
        *,
        probe_interval: float = 0.5,
        join_timeout: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        answers: Callable[[str], bool] = store_answers,
        first: RendezvousHandler | None = None,
    ) -> None:
        self._factory = factory
        self._endpoint = endpoint
        self._probe_interval = probe_interval
        self._join_timeout = join_timeout
        self._clock = clock
        self._answers = answers
        self._state = LinkState()
        self.inner: RendezvousHandler = first if first is not None else factory()
        self.reconnects = 0

    # --- the store's state ---------------------------------------------------------------------
    @property
    def lost(self) -> bool:
        """The store is away, or a new one is up that no round has been joined on yet."""
        return self._state.lost_since is not None or self._state.reform_pending

    def store_lost(self, error: BaseException) -> None:
        """Record that the store stopped answering (also for errors seen outside this handler)."""
        if self._state.lost_since is None and not self._state.reform_pending:
            print(f"etj-train worker: rendezvous store lost ({error}); training on, waiting", flush=True)
            self._state = LinkState(lost_since=self._clock())
            self._quiet(self.inner)

    @staticmethod
    def _quiet(handler: RendezvousHandler) -> None:
        """Stop a handler's keep-alive thread (torch-private, hence guarded): on a lost store it only logs
        a stack trace a second."""
        with contextlib.suppress(Exception):
            handler._stop_heartbeats()  # type: ignore[attr-defined]

    def _probe(self) -> bool:
        """Try the endpoint; on an answer, a fresh handler on the new store. Whether it worked."""
        now = self._clock()
        self._state = LinkState(self._state.lost_since, now)
        if not self._answers(self._endpoint):
            return False
        try:
            fresh = self._factory()
        except STORE_ERRORS as e:
            log.info("store at %s answers but the rendezvous cannot use it yet: %s", self._endpoint, e)
            return False
        old, self.inner = self.inner, fresh
        self._quiet(old)
        # Until now, not until the probe began: building the handler blocks while torch's TCPStore client
        # retries its connect (an address that accepts but has no store yet), and the store is away as long.
        lost_since = self._state.lost_since
        away = self._clock() - (now if lost_since is None else lost_since)
        self._state = LinkState(reform_pending=True)
        self.reconnects += 1
        print(f"etj-train worker: rendezvous store back after {away:.1f} s; re-forming the world", flush=True)
        return True

    # --- torch's RendezvousHandler -----------------------------------------------------------------
    def num_nodes_waiting(self) -> int:
        action = next_action(self._state, self._clock(), self._probe_interval)
        if action is Action.ASK:
            try:
                return self.inner.num_nodes_waiting()
            except STORE_ERRORS as e:
                self.store_lost(e)
                return 0
        if action is Action.PROBE and self._probe():
            return 1
        return 1 if action is Action.REFORM else 0

    def next_rendezvous(self) -> RendezvousInfo:
        deadline = self._clock() + self._join_timeout
        while True:
            if self._state.lost_since is not None and not self._probe():
                if self._clock() > deadline:
                    raise RendezvousTimeoutError(
                        f"no rendezvous store at {self._endpoint} for the join timeout"
                    )
                time.sleep(self._probe_interval)
                continue
            try:
                info = self.inner.next_rendezvous()
            except STORE_ERRORS as e:
                self.store_lost(e)
                continue
            self._state = LinkState()
            return info

    def get_backend(self) -> str:
        return self.inner.get_backend()

    @property
    def use_agent_store(self) -> bool:
        return self.inner.use_agent_store

    def is_closed(self) -> bool:
        try:
            return self.inner.is_closed()
        except STORE_ERRORS as e:
            self.store_lost(e)
            return False

    def set_closed(self) -> None:
        with contextlib.suppress(*STORE_ERRORS):
            self.inner.set_closed()

    def get_run_id(self) -> str:
        return self.inner.get_run_id()

    def shutdown(self) -> bool:
        try:
            return self.inner.shutdown()
        except STORE_ERRORS as e:
            log.info("rendezvous not closed (its store is away: %s)", e)
            return False

    def __getattr__(self, name: str) -> Any:  # torch's private helpers (e.g. _stop_heartbeats) go inside
        if name == "inner":  # not built yet (the factory raised): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

"""In-place crash recovery: when a rank dies mid-step, the survivors re-form the world and redo the step.

A rank that dies (SIGKILL, a lost node) breaks the step's collectives on every other rank: gloo reports
the closed connection at once (a peer that vanished with its sockets open: at the collective timeout,
ETJ_COLLECTIVE_TIMEOUT_S). The step in
flight never reached its commit point (the stop-code all-reduce comes before the optimizer step), so each
survivor's state in memory is the last committed step.

The survivors then meet on the job's external store under the failed membership's id:

1. each registers (``alive/<old rank>``); every rank also beats a counter on the store every
   ``HEARTBEAT_S`` while it trains, so a survivor can tell a slow peer (still beating) from a dead one
   (silent for ``dead_after``);
2. once every old rank has either registered or gone silent, the first survivor to propose a member list
   wins (one ``compare_set``): every survivor adopts the same list, and one that finds itself left out (too
   slow) falls back to the restart path;
3. the members re-form the process group among themselves (regroup.reform) and agree on the newest
   committed step (state_sync.sync_state: a broadcast only in the rare race where a peer committed the step
   that failed elsewhere); the trainer redoes the step at the new size -- the same global batch, split
   among fewer ranks.

Anything else -- an error that is not a lost peer, fewer members than the job's minimum, a second failure
at the same step -- re-raises, and torch elastic restarts the world from the checkpoints (the fallback),
with the reason logged. Decisions are pure functions (tested by tables); ``Heartbeat`` and ``recover_world``
are the I/O.

Only token holders take part (core/mac.py): the heartbeats and the recovery's records live under the job's
token-derived namespace, and the registrations and the member list are sealed with the token over their
key's name (which carries the membership), so a client without the token can neither keep a dead rank
"alive", nor register a rank, nor write the member list the survivors adopt.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

import torch.distributed as dist

from etj_contract import env as etj_env
from etj_trainer.core import store_client
from etj_trainer.core.mac import job_sealer
from etj_trainer.resize import group_sockets, regroup

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.1  # how often every rank bumps its counter on the store while it trains
DEAD_AFTER_S = 1.0  # a peer whose counter has not moved for this long is gone (ETJ_PEER_DEAD_AFTER_S)
GIVE_UP_S = 30.0  # a recovery still waiting on a beating peer that never registers forms without it

# What gloo (and NCCL, once aborted) say when a peer is gone; anything else is a real error.
_PEER_LOSS_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "read error",
    "write error",
    "timed out",
    "timeout",
    "aborted",
    "abort",
    "socket",
    "no route to host",
    "connection refused",
)


def is_peer_loss(exc: BaseException) -> bool:
    """Does this error mean a peer is gone (recoverable in place), rather than a bug in this rank?"""
    if isinstance(exc, dist.DistStoreError):
        return False  # the external store failing is not a lost peer (and re-forming needs the store)
    if isinstance(exc, dist.DistError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return any(m in text for m in _PEER_LOSS_MARKERS)


def dead_after() -> float:
    return float(etj_env.PEER_DEAD_AFTER_S.get(os.environ, DEAD_AFTER_S))


# ---- pure decisions -----------------------------------------------------------------------------------


def members_after_crash(
    old_size: int, registered: frozenset[int], silent_s: dict[int, float], dead_s: float, waited_s: float
) -> tuple[int, ...] | None:
    """The old ranks that form the new world, or None to keep waiting.

    ``silent_s[r]``: how long rank r's heartbeat has not moved (as seen by the caller). Every unregistered
    rank must have been silent for ``dead_s``; after ``GIVE_UP_S`` the registered ranks go on regardless.
    """
    pending = [r for r in range(old_size) if r not in registered and silent_s.get(r, 0.0) < dead_s]
    if pending and waited_s < GIVE_UP_S:
        return None
    return tuple(sorted(registered))


@dataclass(frozen=True)
class Recovery:
    in_place: bool
    new_rank: int
    new_size: int
    reason: str


def decide_recovery(members: tuple[int, ...], old_rank: int, old_size: int, min_ranks: int) -> Recovery:
    """What this rank does once the member list is agreed (same list on every survivor)."""
    lost = old_size - len(members)
    if old_rank not in members:
        return Recovery(False, -1, 0, "left out of the recovered world (registered too late)")
    if len(members) < min_ranks:
        return Recovery(False, -1, 0, f"{len(members)} surviving ranks < minimum {min_ranks}")
    return Recovery(True, members.index(old_rank), len(members), f"{lost} of {old_size} ranks lost")


def may_recover_again(last_failed_step: int | None, step: int) -> bool:
    """A second failure at the same committed step is not a lost peer we can route around: restart."""
    return last_failed_step != step


# ---- I/O ----------------------------------------------------------------------------------------------


def _client() -> dist.TCPStore:
    return store_client.job_store()


def _hb_key(membership: str, rank: int) -> str:
    return job_sealer().name("etj-hb", f"{membership}/{rank}")


@dataclass
class Heartbeat:
    """This rank's heartbeat on the external store (a counter bumped every ``HEARTBEAT_S`` by a thread).

    It tells the survivors of a crash a slow peer (still beating) from a dead one. It does not *detect* a
    crash: a peer that dies closes its sockets and gloo fails the collective at once. One that vanishes
    with its sockets open (a partitioned node) is bounded by the collective timeout (ETJ_COLLECTIVE_TIMEOUT_S;
    tried: aborting a gloo group from another thread does not unblock the collective in flight, torch 2.14).
    """

    membership: str = ""
    rank: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(cls) -> Heartbeat:
        w = cls()
        threading.Thread(target=w._run, name="etj-heartbeat", daemon=True).start()
        return w

    def enter(self, membership: str, rank: int) -> None:
        """Beat under a new membership's id."""
        with self._lock:
            self.membership, self.rank = membership, rank

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        store = _client()
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                membership, rank = self.membership, self.rank
            try:
                store.add(_hb_key(membership, rank), 1)
            except Exception as e:  # the store is someone else's problem (issue 15b); keep beating
                log.debug("heartbeat: %s", e)


def close_failed_group() -> None:
    """Close this rank's connections of the failed group, so a survivor still blocked on us in the failed
    collective fails now, not at its collective timeout (seen on a loaded CI machine: rank 0 blocked on
    rank 1, which had left the collective to recover, for 47 s, and left out of the recovered world:
    3->1 instead of 3->2). Destroying the group alone does not close them: group_sockets.py says why."""
    group_sockets.shut()
    if dist.is_initialized():
        dist.destroy_process_group()


def recover_world(membership: str, old_rank: int, old_size: int, min_ranks: int) -> Recovery:
    """Agree on the survivors of ``membership`` and re-form the default group among them."""
    t0 = time.monotonic()
    close_failed_group()
    store, sealer = _client(), job_sealer()
    prefix = sealer.name("etj-recover", membership)

    def registered_rank(r: int) -> bool:
        k = f"{prefix}/alive/{r}"
        return bool(store.check([k])) and sealer.open(k, store.get(k)) == "1"

    store.set(f"{prefix}/alive/{old_rank}", sealer.seal(f"{prefix}/alive/{old_rank}", "1"))
    counts: dict[int, tuple[int, float]] = {}
    dead_s = dead_after()
    while True:
        now = time.monotonic()
        registered = frozenset(filter(registered_rank, range(old_size)))
        silent: dict[int, float] = {}
        for r in range(old_size):
            if r in registered:
                continue
            c = int(store.add(_hb_key(membership, r), 0))
            if counts.get(r, (-1, 0.0))[0] != c:
                # first seen or moved: silence counts from now (a rank seen for the first time may have
                # died long ago, but we cannot know; it must stay silent for dead_after under our watch)
                counts[r] = (c, now)
            silent[r] = now - counts[r][1]
        proposal = members_after_crash(old_size, registered, silent, dead_s, now - t0)
        if proposal is not None:
            break
        time.sleep(HEARTBEAT_S / 2)
    mk = f"{prefix}/members"
    agreed = sealer.open(mk, store.compare_set(mk, "", sealer.seal(mk, ",".join(map(str, proposal)))))
    # A list that fails its check is nobody's: this rank is left out (the restart path), never misled.
    members = tuple(int(r) for r in (agreed or "").split(",") if r)
    decision = decide_recovery(members, old_rank, old_size, min_ranks)
    if decision.in_place:
        regroup.reform(f"recover/{membership}", decision.new_rank, decision.new_size)
    print(
        f"etj: crash recovery: members {list(members)} of {old_size} agreed in {time.monotonic() - t0:.2f} s"
        f" -> {'in place' if decision.in_place else 'restart'} ({decision.reason})",
        flush=True,
    )
    return decision


@dataclass(frozen=True)
class Lost:
    """A step failed because a peer is gone; the survivors recover in place (inplace.InPlace.regroup)."""

    error: BaseException


def fallback_reason(exc: BaseException, enabled: bool, last_failed_step: int | None, step: int) -> str | None:
    """Why a failed step cannot be recovered in place (None: it can)."""
    if not enabled:
        return "in-place recovery disabled (no etj agent or external store)"
    if not is_peer_loss(exc):
        return f"not a lost peer: {type(exc).__name__}"
    if not may_recover_again(last_failed_step, step):
        return f"a second failure at step {step}"
    return None


def lost_or_raise(
    exc: BaseException, enabled: bool, last_failed_step: int | None, step: int, since_step_s: float = 0.0
) -> Lost:
    """The trainer's catch of a failed step: a ``Lost`` to recover from, or the error re-raised."""
    reason = fallback_reason(exc, enabled, last_failed_step, step)
    if reason is not None:
        print(f"etj: step {step + 1} failed; restarting the world ({reason})", flush=True)
        raise exc
    print(
        f"etj: step {step + 1} failed {since_step_s:.2f} s after step {step} "
        f"({str(exc).splitlines()[0][:100]}); recovering in place",
        flush=True,
    )
    return Lost(exc)


def watch(enabled: bool, incarnation: float, rank: int) -> Heartbeat | None:
    """Start this rank's heartbeat when in-place recovery is possible."""
    if not enabled:
        return None
    w = Heartbeat.start()
    w.enter(f"{incarnation:.6f}", rank)
    return w


def recover_in_place(lost: Lost, membership: str, rank: int, size: int, min_ranks: int) -> None:
    """Re-form the world among the survivors, or re-raise the step's error (torch elastic restarts)."""
    decision = recover_world(membership, rank, size, min_ranks)
    if not decision.in_place:
        print(f"etj: restarting the world ({decision.reason})", flush=True)
        raise lost.error

"""In-place join: a new node's ranks enter the running world at a step boundary; nobody restarts.

The joiner's agent (agent/worker.py) sees that the job's world has already formed, so instead of joining torch
elastic's rendezvous (which would make every agent restart its workers) it starts its workers itself, from
its warm forkserver. Each joining worker builds its model and opens its data pipeline first, and only then
asks to be admitted: it appends its id to the job's waiting list on the external store and waits for a
ticket. Admission, TorchFT-style, happens at a step boundary of the running world:

1. rank 0's ``Door`` watches the waiting list from a thread (no per-step store traffic); while someone
   waits, rank 0 puts ``StopCode.ADMIT`` into its slot of the step's stop-code all-reduce, so after the
   same step every rank knows a join is due (regroup.decide);
2. rank 0 writes the admission (the new world's size and store key) and one ticket per admitted joiner
   (``compare_set``: a joiner that gave up and withdrew is skipped); the others read the admission;
3. old and new ranks re-form the process group on the external store under the admission's key (the old
   ranks keep their numbers, joiners come after them), and the joiners receive the state from rank 0
   tensor by tensor (state_sync.broadcast_state); the next step runs at the new size.

A joiner not admitted within ``JOIN_WAIT_S`` withdraws and exits ``EXIT_RESIZE``; its agent then joins the
rendezvous (the restart path, the fallback). Pure decisions here (``plan_admission``); the rest is I/O.

Only token holders take part (core/mac.py): every key lives under the job's token-derived namespace and
every value a rank acts on -- a queue entry, a ticket, the size, the admission -- is sealed with the token
over its key's name. A queue entry's seal is the joiner's proof of the token: rank 0 admits only entries
that open, so a client with the store's endpoint and the job's uid but not the token is never given a
ticket, never forms a group with the world and receives no state; and a joiner takes only a ticket that
opens, so nobody can hand it a "world" of their own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from etj_contract import env as etj_env
from etj_trainer.core import stopping, store_client
from etj_trainer.core.mac import Sealer, job_sealer

log = logging.getLogger(__name__)

POLL_S = 0.02  # how often rank 0's door looks at the waiting list (a thread; the step never waits on it)
JOIN_WAIT_S = 120.0  # a joiner not admitted by then withdraws and takes the restart path
JOIN_WAIT_GRACE_S = 30.0  # how much longer a node's other ranks wait for its local rank 0's withdrawal
WITHDRAWN = "withdrawn"


def entry(node: str, procs: int) -> str:
    """A node's line in the waiting list: its id and how many ranks it brings."""
    return f"{node}:{procs}"


def parse_entry(line: str) -> tuple[str, int]:
    node, _, procs = line.rpartition(":")
    return node, int(procs)


def plan_admission(waiting: list[str], world: int, max_ranks: int) -> tuple[tuple[str, int], ...]:
    """Which waiting nodes are admitted now, with their rank counts: oldest first, whole nodes only (a
    pod's ranks come and go together), as far as the job's maximum allows."""
    admitted: list[tuple[str, int]] = []
    room = max_ranks - world
    for node, procs in map(parse_entry, waiting):
        if procs > room:
            break  # the rest wait for room; oldest first, so nobody overtakes a bigger node
        admitted.append((node, procs))
        room -= procs
    return tuple(admitted)


@dataclass(frozen=True)
class Admission:
    key: str  # the store prefix the new world forms under
    old_size: int
    joiners: tuple[str, ...]  # the admitted nodes
    new_size: int


@dataclass(frozen=True)
class Ticket:
    """What a joiner gets: where and as which rank to form the world."""

    key: str
    rank: int
    size: int
    old_size: int  # the world it joins


def _client() -> dist.TCPStore:
    return store_client.job_store()


def _prefix() -> str:
    return job_sealer().name("etj-join")


def joining() -> bool:
    """Was this worker started by its agent to join a running world in place?"""
    return bool(etj_env.JOIN_IN_PLACE.get(os.environ, False))


def door_open(endpoint: str, run_id: str, token: str = "") -> bool:
    """Has a world of this job opened its door to joiners (its rank 0 runs with in-place resizes)? The
    agent's test for "join in place" rather than through the rendezvous: false before the first world."""
    store = store_client.connect(endpoint, timedelta(seconds=60))
    sealer = Sealer.for_job(token, run_id)
    key = sealer.name("etj-join", "open")
    return bool(store.check([key])) and sealer.open(key, store.get(key)) == "1"


@dataclass
class Door:
    """Rank 0's side: a thread that watches the waiting list; ``admit`` at a step boundary."""

    store: dist.TCPStore
    prefix: str
    sealer: Sealer
    admitted: int = 0  # entries of the waiting list already handled (admitted or skipped)
    waiting: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def open(cls) -> Door:
        d = cls(_client(), _prefix(), job_sealer())
        # Where the previous rank 0 (an earlier world of this job) stopped: joiners that queued while the
        # world restarted are still admitted.
        d.admitted = int(d.store.add(f"{d.prefix}/handled", 0))
        d.waiting = int(d.store.add(f"{d.prefix}/n", 0))
        d.store.set(f"{d.prefix}/open", d.sealer.seal(f"{d.prefix}/open", "1"))
        threading.Thread(target=d._run, name="etj-join-door", daemon=True).start()
        return d

    def _run(self) -> None:
        store = _client()  # its own connection: the main thread uses self.store at the step boundary
        while not self._stop.wait(POLL_S):
            try:
                self.waiting = int(store.add(f"{self.prefix}/n", 0))
            except Exception as e:
                log.debug("join door: %s", e)

    @property
    def pending(self) -> bool:
        return self.waiting > self.admitted

    def close(self, shut: bool = False) -> None:
        """Stop watching; ``shut``: no world of this job runs any more (it finished, or restarts through the
        rendezvous), so new agents must take the rendezvous and queued joiners withdraw -- an open door
        with nobody behind it held a below-minimum restart forever (the replay bed's ckpt_restart arm)."""
        self._stop.set()
        if shut:
            with contextlib.suppress(Exception):
                self.store.delete_key(f"{self.prefix}/open")

    def admit(self, membership: str, step: int, world: int, max_ranks: int) -> Admission:
        """Admit who may come (rank 0, at the boundary every rank agreed on); publishes the admission."""
        n = int(self.store.add(f"{self.prefix}/n", 0))
        ids = [e for i in range(self.admitted, n) if (e := self._entry(i)) is not None]  # the token's holders
        key = f"join/{membership}/{step}"
        joiners: list[str] = []
        size = world
        for node, procs in plan_admission(ids, world, max_ranks):
            tk = f"{self.prefix}/ticket/{node}"
            ticket = self.sealer.seal(
                tk, json.dumps({"key": key, "rank": size, "old": world})
            )  # local rank 0's
            if self.store.compare_set(tk, "", ticket).decode() == ticket:
                joiners.append(node)  # else: it withdrew
                size += procs
        # Everyone looked at is handled: one left out for lack of room (the job is at its maximum) is not
        # asked again; it withdraws after JOIN_WAIT_S and takes the restart path.
        self.store.add(f"{self.prefix}/handled", n - self.admitted)
        self.admitted = n
        adm = Admission(key, world, tuple(joiners), size)
        # The final size, now that it is known, for the joiners (their ticket said where, this says how many).
        self._set(f"size/{key}", str(adm.new_size))
        self._set(f"admission/{membership}/{step}", json.dumps([key, world, joiners, adm.new_size]))
        return adm

    def _set(self, suffix: str, value: str) -> None:
        self.store.set(f"{self.prefix}/{suffix}", self.sealer.seal(f"{self.prefix}/{suffix}", value))

    def _entry(self, i: int) -> str | None:
        """Queue entry ``i`` when it opens with the job's token (its joiner's proof); None otherwise."""
        k = f"{self.prefix}/waiting/{i}"
        return self.sealer.open(k, self.store.get(k))


def admission(
    door: Door | None, membership: str, step: int, rank: int, world: int, max_ranks: int
) -> Admission:
    """Every old rank's view of the admission at this boundary (rank 0 decides it)."""
    if rank == 0:
        assert door is not None, "rank 0 asked for an admission without a door"
        return door.admit(membership, step, world, max_ranks)
    store = door.store if door is not None else _client()
    k = f"{_prefix()}/admission/{membership}/{step}"
    store.wait([k])
    opened = job_sealer().open(k, store.get(k))
    if opened is None:  # rank 0 writes it, sealed: this is not rank 0's (the restart path)
        raise RuntimeError("the admission failed its check (not sealed with the job's token)")
    key, old, joiners, new_size = json.loads(opened)
    return Admission(key, int(old), tuple(joiners), int(new_size))


def code(door: Door | None) -> stopping.StopCode:
    """Rank 0's stop code when it has nothing else to say: ADMIT while someone waits."""
    return stopping.StopCode.ADMIT if door is not None and door.pending else stopping.StopCode.RUN


def ask(
    wait_s: float = JOIN_WAIT_S, local_rank: int | None = None, procs: int | None = None, node: str = ""
) -> Ticket | None:
    """The joiner's side (once warm): queue up and wait for a ticket; None if withdrawn after ``wait_s``.

    A node's ranks are admitted together (seen under load: the two ranks of a 2-process pod admitted at
    two step boundaries, 2->3->4): each counts itself warm on the store, the node's local rank 0 queues the
    node once all of them are, and withdraws it if need be; the ticket says where the node's ranks start.
    """
    store, prefix, sealer = _client(), _prefix(), job_sealer()
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if procs is None:
        procs = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    node = (
        node
        or etj_env.JOIN_NODE.get(os.environ, "")
        or f"{os.environ.get(etj_env.WORKER_ID.name, 'worker')}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )
    tk = f"{prefix}/ticket/{node}"
    deadline = time.monotonic() + wait_s

    def waiting_for(done: Callable[[], bool]) -> None:
        # Polled, not one long store.wait: the door may shut meanwhile (the world stopped), and a long
        # wait that times out can leave the connection unusable for the withdrawal below.
        while not done() and store.check([f"{prefix}/open"]) and time.monotonic() < deadline:
            time.sleep(POLL_S * 10)

    store.add(f"{prefix}/warm/{node}", 1)
    if local_rank == 0:
        waiting_for(lambda: int(store.add(f"{prefix}/warm/{node}", 0)) >= procs)
        i = int(store.add(f"{prefix}/n", 1)) - 1
        store.set(f"{prefix}/waiting/{i}", sealer.seal(f"{prefix}/waiting/{i}", entry(node, procs)))
        waiting_for(lambda: store.check([tk]))
        got = store.compare_set(tk, "", WITHDRAWN).decode()
    else:  # the node's local rank 0 decides: admitted, or withdrawn (then it writes WITHDRAWN)
        while not store.check([tk]) and time.monotonic() < deadline + JOIN_WAIT_GRACE_S:
            time.sleep(POLL_S * 10)
        got = store.get(tk).decode() if store.check([tk]) else WITHDRAWN
    opened = sealer.open(tk, got) if got != WITHDRAWN else None  # a ticket not of rank 0's: never taken
    if opened is None:
        why = "the door shut (the world stopped)" if time.monotonic() < deadline else f"{wait_s:.0f} s passed"
        why = why if got == WITHDRAWN else "the ticket failed its check (not sealed with the job's token)"
        print(f"etj: not admitted: {why}; withdrawing", flush=True)
        return None
    t = json.loads(opened)
    sk = f"{prefix}/size/{t['key']}"
    store.wait([sk])
    size = int(sealer.open(sk, store.get(sk)) or -1)
    if size < 0:
        print("etj: not admitted: the size failed its check; withdrawing", flush=True)
        return None
    return Ticket(t["key"], int(t["rank"]) + local_rank, size, int(t["old"]))

"""The relay in front of torch's poll()-based TCPStore server (``store_relay``, issue 26): clients of either
transport see the same store, the connections past the cap are closed at once and free no slot they never
held, and a client that reads none of its responses is dropped instead of stopping the server for all.

In process, on this torch's poll()-based server (``use_libuv=False``, what a torch without libuv runs). The
flood past the descriptor limit, which aborts an unrelayed server, is in test_store_trust.py (a subprocess).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from tests.trainer.polling import wait_for
from torch.distributed import TCPStore

from etj_trainer.service import store_framing, store_relay
from etj_trainer.service.store_server import RunningStore, open_store


def _wait_for(pred: Callable[[], bool], timeout: float = 30.0) -> None:
    wait_for(pred, timeout, every=0.02)


def _start(max_connections: int = 64, **settings: Any) -> tuple[RunningStore, int]:
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    port = listener.getsockname()[1]
    running = open_store(
        "127.0.0.1", port, listener.detach(), libuv=False, max_connections=max_connections, **settings
    )
    assert running.relay is not None
    return running, port


@pytest.fixture
def relayed() -> Iterator[tuple[RunningStore, int]]:
    running, port = _start()
    try:
        yield running, port
    finally:
        running.close()


def _client(port: int, use_libuv: bool = True, seconds: float = 10) -> TCPStore:
    return TCPStore(
        "127.0.0.1",
        port,
        is_master=False,
        wait_for_workers=False,
        use_libuv=use_libuv,
        timeout=timedelta(seconds=seconds),
    )


@pytest.mark.parametrize("use_libuv", [True, False], ids=["libuv-client", "classic-client"])
def test_every_operation_passes_the_relay(relayed: tuple[RunningStore, int], use_libuv: bool) -> None:
    """What tests/chart/test_store_image.py asks of the store image, through the relay."""
    running, port = relayed
    c = _client(port, use_libuv)
    c.set("k", "v1")
    assert c.get("k") == b"v1" and running.store.get("k") == b"v1"
    assert c.add("n", 3) == 3 and c.add("n", 4) == 7
    assert c.compare_set("k", "v1", "v2") == b"v2"
    c.wait(["k"], timedelta(seconds=5))
    assert c.check(["k"])
    c.set("a", "1")
    c.set("b", "2")
    assert c.multi_get(["a", "b"]) == [b"1", b"2"]
    assert c.delete_key("k") and not c.check(["k"])
    # A wait answered later, when another client sets the key: the server's push reaches the waiter.
    other = _client(port, use_libuv)
    woken: list[bool] = []

    def set_later() -> None:
        time.sleep(0.2)
        other.set("late", "x")
        woken.append(True)

    threading.Thread(target=set_later, daemon=True).start()
    c.wait(["late"], timedelta(seconds=10))
    assert c.get("late") == b"x"


def test_past_the_cap_connections_are_closed_and_slots_come_back() -> None:
    running, port = _start(max_connections=2)
    relay = running.relay
    assert relay is not None
    try:
        a, b = _client(port), _client(port)
        a.set("k", "v")
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert extra.recv(1) == b"", "a third connection past a cap of 2 was kept"
        assert relay.refused == 1 and b.get("k") == b"v"
        del a  # its slot is freed once both of its sides are closed
        _wait_for(lambda: relay.active == 1)
        assert _client(port).get("k") == b"v"
    finally:
        running.close()


def test_a_client_that_reads_no_responses_is_dropped_and_the_store_serves_on(
    relayed: tuple[RunningStore, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's poll()-based server sends on blocking sockets from its one thread: a client that asks for a
    large value again and again and reads nothing stopped it in send() for every client (and the relay
    would, if it passed that client's backpressure on to the server). The relay reads every response,
    buffers what the client leaves unread and drops it past ``MAX_PENDING_TO_CLIENT``."""
    running, port = relayed
    relay = running.relay
    assert relay is not None
    sent: list[bytes] = []
    forward = store_relay._Half.data_received

    def record(self: store_relay._Half, data: bytes) -> None:
        if not self.server_side:  # client to server: the handshake, then queries
            sent.append(data)
        forward(self, data)

    monkeypatch.setattr(store_relay._Half, "data_received", record)
    job = _client(port)
    handshake = b"".join(sent)
    job.set("big", b"x" * (1 << 20))
    assert job.check(["big"])  # answered: the set's bytes have all passed
    del sent[:]
    assert job.get("big") == b"x" * (1 << 20)
    get_big = b"".join(sent)  # the bytes of a get, as torch's client sends them
    monkeypatch.undo()

    monkeypatch.setattr(store_relay, "MAX_PENDING_TO_CLIENT", 4 << 20)  # not 64 MiB of the test's memory
    greedy = socket.create_connection(("127.0.0.1", port), timeout=10)
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    greedy.sendall(handshake + get_big * 32)  # 32 MiB of answers; it reads none
    _wait_for(lambda: relay.active == 1)  # dropped: only the job's connection is left
    assert job.get("big") == b"x" * (1 << 20)  # and the server answers everyone else
    greedy.close()


# ---- a client that holds the server (issue 37) -------------------------------------------------------

MAGIC = struct.pack("=I", 0x3C85F7CE)
HANDSHAKE = b"\x00" + MAGIC  # VALIDATE: what torch's client sends first on every connection


def _s(value: bytes) -> bytes:
    return struct.pack("=Q", len(value)) + value


SET_K = b"\x01" + _s(b"k") + _s(b"v")
WAIT_AB = b"\x06" + struct.pack("=Q", 2) + _s(b"a") + _s(b"b")
FRAMING_CASES: dict[str, tuple[bytes, list[int]]] = {
    # bytes sent, how they arrive (chunk sizes) -> every query passes whole, nothing before it is
    "the handshake in one piece": (HANDSHAKE, [5]),
    "the handshake a byte at a time": (HANDSHAKE, [1] * 5),
    "a set split inside its value's length": (HANDSHAKE + SET_K, [5, 12, 8]),
    "a wait on two keys, a byte at a time": (HANDSHAKE + WAIT_AB, [1] * len(HANDSHAKE + WAIT_AB)),
    "three queries in one piece": (HANDSHAKE + SET_K + WAIT_AB, [len(HANDSHAKE + SET_K + WAIT_AB)]),
    "a set and half a wait, then the rest": (HANDSHAKE + SET_K + WAIT_AB, [5 + len(SET_K) + 10, 1000]),
}


@pytest.mark.parametrize("case", list(FRAMING_CASES), ids=list(FRAMING_CASES))
def test_the_relay_passes_whole_queries_only(case: str) -> None:
    sent, chunks = FRAMING_CASES[case]
    ends = {5, 5 + len(SET_K), 5 + len(WAIT_AB), 5 + len(SET_K) + len(WAIT_AB)}  # where a query ends
    framer = store_framing.Framer(1 << 20, now=0.0)
    passed, offset = b"", 0
    for size in chunks:
        passed += framer.feed(sent[offset : offset + size], now=1.0)
        offset += size
        assert len(passed) in ends | {0}, f"{len(passed)} bytes passed: not whole queries"
        assert (framer.started is None) == (len(passed) == min(offset, len(sent)))
    assert passed == sent and framer.pending == 0


UNFRAMED_CASES: dict[str, bytes] = {
    "a type torch's poll() server does not know": HANDSHAKE + b"\x63",
    "a queue query (that server refuses them)": HANDSHAKE + b"\x0e" + _s(b"q"),
    "a value longer than the relay buffers": HANDSHAKE + b"\x01" + _s(b"k") + struct.pack("=Q", 1 << 40),
    "more keys than fit": HANDSHAKE + b"\x0a" + struct.pack("=Q", 1 << 62) + _s(b"a") * 200,
}


@pytest.mark.parametrize("case", list(UNFRAMED_CASES), ids=list(UNFRAMED_CASES))
def test_what_is_not_a_query_is_refused(case: str) -> None:
    with pytest.raises(store_framing.Unframed):
        store_framing.Framer(1 << 10, now=0.0).feed(UNFRAMED_CASES[case], now=0.0)


PARTIAL_CASES: dict[str, bytes] = {
    "the first byte of torch's handshake": HANDSHAKE[:1],
    "one byte of a query after the handshake": HANDSHAKE + SET_K[:1],
    "a set's key, its value withheld": HANDSHAKE + SET_K[:-1],
    "a connection that sends nothing": b"",
}


@pytest.mark.parametrize("case", list(PARTIAL_CASES), ids=list(PARTIAL_CASES))
def test_a_partial_query_holds_no_one_and_is_closed_after_the_deadline(case: str) -> None:
    """The poll() server read a query's first byte, then blocked in recv() for the rest from its one thread:
    every other client, connected or new, waited past its timeout (issue 37). Now the relay passes whole
    queries only, and closes a connection whose query (or handshake) is not whole within the deadline."""
    deadline = 1.0
    running, port = _start(query_deadline_s=deadline)
    relay = running.relay
    assert relay is not None
    try:
        job = _client(port, use_libuv=False, seconds=5)
        job.set("k", "v")
        attacker = socket.create_connection(("127.0.0.1", port), timeout=10)
        attacker.sendall(PARTIAL_CASES[case])
        opened = time.monotonic()
        assert job.get("k") == b"v"  # the job's connection is served meanwhile
        assert _client(port, use_libuv=False, seconds=5).get("k") == b"v"  # and a new one
        assert attacker.recv(1) == b"", "the attacker's connection was kept"
        assert deadline <= time.monotonic() - opened < deadline + 5 and relay.overdue == 1
        assert job.get("k") == b"v"  # a slow query is its own connection's loss only
    finally:
        running.close()


def test_one_address_holds_at_most_its_share_of_the_connections() -> None:
    """A pod that opens connections up to the relay's cap left none to the job (issue 37): each peer address
    gets ``per_source`` of them; the job's clients, from elsewhere, are served."""
    running, port = _start(max_connections=8, per_source=3)
    relay = running.relay
    assert relay is not None
    try:
        flood = []
        for _ in range(10):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))  # another address of this machine: another pod
            s.connect(("127.0.0.1", port))
            s.sendall(HANDSHAKE)
            flood.append(s)
        kept = [s for s in flood if not _closed(s)]
        assert len(kept) == 3, f"{len(kept)} connections kept from one address"
        job = [_client(port) for _ in range(3)]  # from 127.0.0.1: its own share
        job[0].set("k", "v")
        assert all(c.get("k") == b"v" for c in job)
        for s in flood:
            s.close()
    finally:
        running.close()


def _closed(s: socket.socket) -> bool:
    """Did the peer close ``s`` (at once: a refused connection is closed as it is accepted)?"""
    s.settimeout(1.0)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True

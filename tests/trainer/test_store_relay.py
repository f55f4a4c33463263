"""The relay in front of torch's poll()-based TCPStore server (``store_relay``, issue 26): clients of either
transport see the same store, the connections past the cap are closed at once and free no slot they never
held, and a client that reads none of its responses is dropped instead of stopping the server for all.

In process, on this torch's poll()-based server (``use_libuv=False``, what a torch without libuv runs). The
flood past the descriptor limit, which aborts an unrelayed server, is in test_store_trust.py (a subprocess).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from tests.trainer.polling import wait_for
from torch.distributed import TCPStore

from etj_trainer.service import store_relay
from etj_trainer.service.store_server import RunningStore, open_store


def _wait_for(pred: Callable[[], bool], timeout: float = 30.0) -> None:
    wait_for(pred, timeout, every=0.02)


def _start(max_connections: int = 64) -> tuple[RunningStore, int]:
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    port = listener.getsockname()[1]
    running = open_store("127.0.0.1", port, listener.detach(), libuv=False, max_connections=max_connections)
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

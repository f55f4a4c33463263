"""The store cannot be held (issue 37): slow senders without the token do not keep the operator from its
progress read, and the store's readiness probe fails while its TCPStore does not answer.

A real HTTP server, a real TCPStore (torch's poll()-based server behind the store's relay), real sockets as
the attackers; the partial query's cases and the per-address cap are in test_store_relay.py (in process).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta

from tests.trainer.polling import wait_for

from etj_contract.ports import STORE_QUERY_DEADLINE_S, STORE_READY_PATH
from etj_trainer.agent.local_launcher import free_port
from etj_trainer.core import store_client
from etj_trainer.core.progress import get_json
from etj_trainer.service.store_http import CappedHTTPServer, ProgressState, StoreProbe, make_http_server
from etj_trainer.service.store_server import open_store

TOKEN = "the-jobs-token"


@contextlib.contextmanager
def _serving(httpd: CappedHTTPServer) -> Iterator[str]:
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


class _SlowSenders:
    """``n`` connections that send a request line a byte a second and never end their headers (slowloris),
    each opened again as soon as the server drops it; no token."""

    def __init__(self, port: int, n: int) -> None:
        self._port = port
        self._socks = [self._open() for _ in range(n)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _open(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self._port), timeout=5)
        s.sendall(b"GET /progress HTTP/1.1\r\nX-Slow: ")
        return s

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for i, s in enumerate(self._socks):
                try:
                    s.sendall(b"x")
                except OSError:  # dropped by the server: come back
                    s.close()
                    with contextlib.suppress(OSError):
                        self._socks[i] = self._open()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for s in self._socks:
            s.close()


def test_slow_senders_without_the_token_leave_the_operator_its_progress_read() -> None:
    """Before: the server took one of its 256 slots at the accept and held it while the headers came in,
    10 s a byte; 300 slow senders held every slot and the operator's read waited in the backlog for good."""
    httpd = make_http_server("127.0.0.1", 0, ProgressState(), TOKEN)
    with _serving(httpd) as base:
        flood = _SlowSenders(httpd.server_address[1], 300)
        try:
            for _ in range(3):  # while the flood goes on: its connections are dropped, it opens them again
                assert get_json(f"{base}/progress", timeout=5, token=TOKEN) == {}, "no progress read"
            wait_for(lambda: httpd.dropped >= 300, timeout=30)
        finally:
            flood.close()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:  # not listening yet
        return 0


def test_the_readiness_probe_fails_while_the_store_does_not_answer() -> None:
    """The store pod's readiness probe was a TCP connect to the TCPStore's port: it passed while a partial
    query held torch's poll() server and no client was served. ``/readyz`` does a set and a read-back
    through that port."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    port = listener.getsockname()[1]
    running = open_store("127.0.0.1", port, listener.detach(), libuv=False)
    assert running.relay is not None
    httpd = make_http_server("127.0.0.1", 0, ProgressState(), TOKEN, ready=StoreProbe("127.0.0.1", port, 1.0))
    try:
        with _serving(httpd) as base:
            ready = f"{base}{STORE_READY_PATH}"
            assert _status(ready) == 200
            # The server itself held (as from inside the pod, past the relay): a query's first byte.
            holder = socket.create_connection(running.relay.upstream, timeout=10)
            holder.sendall(b"\x00")
            wait_for(lambda: _status(ready) == 503, timeout=30)
            socket.create_connection(("127.0.0.1", port), timeout=5).close()  # what the TCP probe saw: fine
            holder.close()  # the server reads the end of that connection and serves on
            wait_for(lambda: _status(ready) == 200, timeout=30)
    finally:
        running.close()


def test_a_partial_query_holds_no_client_of_the_store_process() -> None:
    """Black box, as an attacker with only the endpoint: ``etj-train store --no-libuv`` (the store image's
    server, behind its relay, default settings); one byte of a query after torch's handshake, then silence.
    Before: every client of that server, connected or new, hung, and a TCP connect still passed."""
    port, http_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "etj_trainer.cli", "store", "--no-libuv", "--host", "127.0.0.1",
           "--port", str(port), "--http-port", str(http_port)]  # fmt: skip
    proc = subprocess.Popen(cmd, env={**os.environ, "ETJ_PROGRESS_TOKEN": TOKEN})
    ready = f"http://127.0.0.1:{http_port}{STORE_READY_PATH}"
    try:
        wait_for(lambda: _status(ready) == 200, timeout=60)
        job = store_client.client("127.0.0.1", port, timedelta(seconds=5))
        job.set("k", "v")
        attacker = socket.create_connection(("127.0.0.1", port), timeout=30)
        attacker.sendall(b"\x00" + struct.pack("=I", 0x3C85F7CE) + b"\x01")  # handshake, a set's first byte
        opened = time.monotonic()
        assert job.get("k") == b"v"
        assert store_client.client("127.0.0.1", port, timedelta(seconds=5)).get("k") == b"v"
        assert _status(ready) == 200
        assert attacker.recv(1) == b"", "the attacker's connection was kept"
        assert time.monotonic() - opened < STORE_QUERY_DEADLINE_S + 5
        assert proc.poll() is None and job.get("k") == b"v"
    finally:
        proc.terminate()
        proc.wait(timeout=30)

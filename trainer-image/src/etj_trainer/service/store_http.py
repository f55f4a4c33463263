"""The store pod's HTTP server: ``/progress``, ``/replicas``, ``/healthz`` and ``/readyz`` (``store_server``).

Split from ``store_server`` for size; what each endpoint does is in that module's docstring.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from torch.distributed import DistError

from etj_contract.ports import (
    STORE_HTTP_HEADER_DEADLINE_S,
    STORE_HTTP_PENDING,
    STORE_READY_PATH,
    STORE_READY_TIMEOUT_S,
)
from etj_contract.progress import (
    MAX_BODY_BYTES,
    PROGRESS_PATH,
    TOKEN_HEADER,
    TOKEN_SCHEME,
    ProgressDoc,
    merge,
)
from etj_contract.replicas import REPLICAS_PATH, Replicas
from etj_trainer.core import store_client

log = logging.getLogger(__name__)

READY_KEY = "etj-store/ready"  # what the readiness probe sets and reads back
# Requests are short (the operator, rank 0, each agent's bounds read before a round); more than this at
# once wait in the listen backlog, then the kernel's SYN retries: delayed, never a thread each.
MAX_HTTP_CONNECTIONS = 256
LISTEN_BACKLOG = 1024


class CappedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, and no client without the token can hold one for long (issue 37).

    The accept loop never waits: a client reading its request line and headers is *pending*, at most
    ``header_deadline_s`` (``service_actions``, twice a second) and at most ``max_pending`` of them, the
    oldest dropped for a new one (a real client sends its headers in one packet, milliseconds after it
    connects: a flood must open ``max_pending`` connections within those to push it out). Once its headers
    are read the token is checked before any body is; ``max_connections`` requests at most are then served
    at once, the rest waiting in their own threads (only token holders and answers of a few bytes get that
    far). Before, a slot was taken at the accept: 256 slow senders without the token held every slot, a
    byte every few seconds each, and the operator stopped reading progress.
    """

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        max_connections: int,
        max_pending: int = STORE_HTTP_PENDING,
        header_deadline_s: float = STORE_HTTP_HEADER_DEADLINE_S,
    ) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self._max_pending = max_pending
        self._header_deadline_s = header_deadline_s
        self._pending: dict[socket.socket, float] = {}  # oldest first: when each was accepted
        self._lock = threading.Lock()
        self._serving = threading.local()
        self.dropped = 0  # pending connections dropped (read by tests)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if len(self._pending) >= self._max_pending:
                self._drop(next(iter(self._pending)))
            self._pending[request] = time.monotonic()
        super().process_request(request, client_address)

    def headers_read(self, request: socket.socket) -> bool:
        """The handler's: ``request`` sent its headers; it now takes a slot (waiting in its own thread).
        False if it was dropped meanwhile (what it read since is the end of the connection, not headers)."""
        with self._lock:
            if self._pending.pop(request, None) is None:
                return False
        self._slots.acquire()
        self._serving.slot = True
        return True

    def holds_slot(self) -> bool:
        return bool(getattr(self._serving, "slot", False))

    def service_actions(self) -> None:
        now = time.monotonic()
        with self._lock:
            for request in [r for r, t in self._pending.items() if now - t > self._header_deadline_s]:
                self._drop(request)

    def _drop(self, request: socket.socket) -> None:
        """Under the lock: end a pending connection; its thread's read returns, and it exits."""
        del self._pending[request]
        self.dropped += 1
        with contextlib.suppress(OSError):  # already gone
            request.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # a client gone mid-answer: no trace
            log.debug("http: %s went away", client_address)
            return
        super().handle_error(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        self._serving.slot = False
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._pending.pop(request, None)
            if self.holds_slot():
                self._slots.release()


class ProgressState:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._doc: ProgressDoc | None = None

    def put(self, doc: dict[str, Any]) -> None:
        with self._lock:
            self._doc = merge(self._doc, ProgressDoc.from_json(doc))

    def get(self) -> dict[str, Any]:
        with self._lock:
            return {} if self._doc is None else self._doc.to_json()


def make_http_server(
    host: str,
    port: int,
    state: ProgressState,
    token: str | None = None,
    set_replicas: Callable[[Replicas], None] | None = None,
    max_connections: int = MAX_HTTP_CONNECTIONS,
    ready: Callable[[], bool] | None = None,
    **capped: Any,
) -> CappedHTTPServer:
    """The progress endpoint and the operator's ``/replicas``; ``token`` (None or empty: none) is required
    on both. ``set_replicas`` is told each accepted bound (the bounds themselves are served from here).
    ``ready``: ``GET /readyz`` (the pod's readiness probe) answers 200 when it is true, else 503 (none: 200).
    ``capped``: ``CappedHTTPServer``'s settings.

    Long because: the handler class closes over the state, the token and the bounds it serves.
    """
    current: list[Replicas] = []
    expected = f"{TOKEN_SCHEME} {token}".encode() if token else None

    class Handler(BaseHTTPRequestHandler):
        # A client that stops sending mid-request must not hold a thread forever.
        timeout = 10.0

        def parse_request(self) -> bool:
            ok = super().parse_request()  # the request line and headers, read
            assert isinstance(self.server, CappedHTTPServer)
            if not self.server.holds_slot() and not self.server.headers_read(self.request):
                self.close_connection = True
                return False
            return ok

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self) -> bool:
            if expected is None:
                return True
            given = (self.headers.get(TOKEN_HEADER) or "").encode()
            if hmac.compare_digest(given, expected):
                return True
            self.close_connection = True  # the body (if any) stays unread
            self._send(401, b'{"error": "missing or wrong token"}')
            return False

        def do_GET(self) -> None:
            if self.path == PROGRESS_PATH:
                if self._authorized():
                    self._send(200, json.dumps(state.get()).encode())
            elif self.path == REPLICAS_PATH:
                if self._authorized():
                    self._send(200, json.dumps(current[-1].to_json() if current else {}).encode())
            elif self.path == STORE_READY_PATH:
                if ready is None or ready():
                    self._send(200, b"ready", "text/plain")
                else:
                    self._send(503, b"the TCPStore does not answer", "text/plain")
            elif self.path == "/healthz":
                self._send(200, b"ok", "text/plain")
            else:
                self._send(404, b"{}")

        def _body(self) -> dict[str, Any] | None:
            """The request's JSON object, or None once an error has been answered."""
            raw = self.headers.get("Content-Length")
            if raw is None or not raw.isdigit():
                self.close_connection = True
                self._send(411, b'{"error": "Content-Length required"}')
                return None
            length = int(raw)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                self._send(413, b'{"error": "body too large"}')
                return None
            try:
                doc = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._send(400, b'{"error": "invalid JSON"}')
                return None
            if not isinstance(doc, dict):
                self._send(400, b'{"error": "expected a JSON object"}')
                return None
            return doc

        def do_POST(self) -> None:
            if self.path not in (PROGRESS_PATH, REPLICAS_PATH):
                self._send(404, b"{}")
                return
            if not self._authorized():
                return
            doc = self._body()
            if doc is None:
                return
            if self.path == PROGRESS_PATH:
                state.put(doc)
            else:
                replicas = Replicas.from_json(doc)
                if replicas is None:
                    self._send(400, b'{"error": "expected {\\"min\\": n, \\"max\\": m}, 1 <= n <= m"}')
                    return
                if set_replicas is not None:
                    set_replicas(replicas)
                current.append(replicas)
                del current[:-1]
            self._send(204, b"")

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return CappedHTTPServer((host, port), Handler, max_connections, **capped)


class StoreProbe:
    """Does the TCPStore answer a set and a read-back through its public port (so through the relay, where
    there is one) within ``timeout_s``? What the pod's readiness probe asks (``GET /readyz``): a TCP connect,
    the probe before, passed while one partial query held the poll() server (issue 37).

    The round trip runs in a thread of its own: torch's client can block past its timeout on a server that
    stopped answering (a ``get`` that times out sends a cancel and waits for its answer unbounded). At most
    one is under way; while it is, the store is not ready. One asked within ``REUSE_S`` of the last gets
    its answer (``/readyz`` needs no token: asked without end, it costs the store a round trip a second).
    """

    REUSE_S = 1.0

    def __init__(self, host: str, port: int, timeout_s: float = STORE_READY_TIMEOUT_S) -> None:
        self._address = (host, port)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._last: tuple[float, bool] = (-self.REUSE_S, False)
        self._trip: threading.Thread | None = None
        self._answer: list[bool] = []

    def __call__(self) -> bool:
        with self._lock:
            at, answer = self._last
            if time.monotonic() - at >= self.REUSE_S:
                answer = self._ask()
                self._last = (time.monotonic(), answer)
            return answer

    def _ask(self) -> bool:
        if self._trip is None or not self._trip.is_alive():
            self._answer = []
            self._trip = threading.Thread(target=self._round_trip, args=(self._answer,), daemon=True)
            self._trip.start()
        self._trip.join(self._timeout_s)
        if not self._answer:
            log.warning("readiness: the TCPStore did not answer within %.1f s", self._timeout_s)
        return self._answer == [True]

    def _round_trip(self, answer: list[bool]) -> None:
        nonce = os.urandom(8).hex()
        try:
            client = store_client.client(*self._address, timedelta(seconds=self._timeout_s))
            client.set(READY_KEY, nonce)
            answer.append(client.compare_set(READY_KEY, nonce, nonce) == nonce.encode())
        except (DistError, RuntimeError) as e:
            log.warning("readiness: the TCPStore refused a round trip: %s", e)
            answer.append(False)

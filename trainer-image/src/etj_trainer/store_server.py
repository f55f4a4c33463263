"""``etj-train store``: the job's rendezvous pod.

Hosts the TCPStore that torch elastic's c10d rendezvous uses (outside every worker, so losing any worker,
rank 0 included, never loses the rendezvous state) and a tiny HTTP server for the progress channel:
``POST /progress`` merges the JSON body into the stored document (``etj_contract.progress.merge``: resize
records accumulate, a finished report stays finished), ``GET /progress`` returns it, ``GET /healthz`` is a
liveness probe. ``POST /replicas`` is the operator's: the job's current replica bounds, kept in the
TCPStore for the running agents and rank 0 (``etj_contract.replicas``: ``kubectl scale`` reaches them).

Every ``/progress`` and ``/replicas`` request requires the job's token (``ETJ_PROGRESS_TOKEN``, from the
job's Secret) as ``Authorization: Bearer <token>``, and bodies over ``MAX_BODY_BYTES`` are refused unread:
any pod the network lets in could otherwise end the job with a forged ``finished`` report, shrink its
world, or exhaust the store's memory (docs/operator.md, "Threat model").
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from torch.distributed import TCPStore

from etj_contract import env as etj_env
from etj_contract.progress import (
    MAX_BODY_BYTES,
    PROGRESS_PATH,
    TOKEN_HEADER,
    TOKEN_SCHEME,
    ProgressDoc,
    merge,
)
from etj_contract.replicas import REPLICAS_PATH, STORE_KEY, Replicas

log = logging.getLogger(__name__)


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
) -> ThreadingHTTPServer:
    """The progress endpoint and the operator's ``/replicas``; ``token`` (None or empty: none) is required
    on both. ``set_replicas`` keeps the bounds the operator POSTs (in the job's TCPStore)."""
    current: list[Replicas] = []
    expected = f"{TOKEN_SCHEME} {token}".encode() if token else None

    class Handler(BaseHTTPRequestHandler):
        # A client that stops sending mid-request must not hold a thread forever.
        timeout = 10.0

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

    return ThreadingHTTPServer((host, port), Handler)


def serve(host: str = "0.0.0.0", port: int = 29400, http_port: int = 29401, token: str | None = None) -> None:
    """Run the store and the progress server on ``host`` until SIGTERM/SIGINT.

    ``token`` defaults to ``$ETJ_PROGRESS_TOKEN`` (the operator sets it from the job's Secret).

    The pod binds its own IP (``--host $(POD_IP)``). TCPStore's libuv server listens on every address
    whatever host it is given, so it gets a socket already bound to ``host`` instead: process-backed pods
    share one machine's network, and two jobs' stores there must not take each other's port.
    """
    listener = socket.create_server((host, port), backlog=1024)  # SO_REUSEADDR: TIME_WAIT is no conflict
    fd = listener.detach()  # the store owns (and closes) it from here
    # wait_for_workers=False: the store must come up before any agent exists and outlive them all.
    store = TCPStore(
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        use_libuv=True,
        master_listen_fd=fd,
    )
    state = ProgressState()
    if token is None:
        token = etj_env.PROGRESS_TOKEN.read(os.environ)
    if not token:
        log.warning("no %s: the progress endpoint accepts any client", etj_env.PROGRESS_TOKEN.name)
    lock = threading.Lock()  # one TCPStore client, used from the HTTP server's threads

    def set_replicas(replicas: Replicas) -> None:
        with lock:
            store.set(STORE_KEY, replicas.encode())

    httpd = make_http_server(host, http_port, state, token, set_replicas)
    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    t = threading.Thread(target=httpd.serve_forever, name="etj-progress-http", daemon=True)
    t.start()
    print(
        f"etj-train store: TCPStore on {host}:{port}, progress on http://{host}:{http_port}/progress",
        flush=True,
    )
    stop.wait()
    httpd.shutdown()
    httpd.server_close()

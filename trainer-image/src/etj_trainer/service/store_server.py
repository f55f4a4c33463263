"""``etj-train store``: the job's rendezvous pod.

Hosts the TCPStore that torch elastic's c10d rendezvous uses (outside every worker, so losing any worker,
rank 0 included, never loses the rendezvous state) and a tiny HTTP server for the progress channel:
``POST /progress`` merges the JSON body into the stored document (``etj_contract.progress.merge``: resize
records accumulate, a finished report stays finished), ``GET /progress`` returns it, ``GET /healthz`` is a
liveness probe. ``POST /replicas`` is the operator's: the job's current replica bounds, kept in memory and
read by the running agents and rank 0 with ``GET /replicas`` (``etj_contract.replicas``: ``kubectl scale``
reaches them). Not in the TCPStore, which any client reaching its port can write.

Every ``/progress`` and ``/replicas`` request requires the job's token (``ETJ_PROGRESS_TOKEN``, from the
job's Secret) as ``Authorization: Bearer <token>``, and bodies over ``MAX_BODY_BYTES`` are refused unread:
any pod the network lets in could otherwise end the job with a forged ``finished`` report, shrink its
world, or exhaust the store's memory (docs/operator.md, "Threat model").

Both endpoints cap their connections. The HTTP server serves at most ``MAX_HTTP_CONNECTIONS`` at once and
leaves the rest in the listen backlog (one thread per connection otherwise: a client opening thousands
would exhaust the pod). The TCPStore's cap comes from the process's descriptor limit (``RLIMIT_NOFILE``,
``--max-open-files``). torch's libuv server, which has no connection setting, accepts and closes new
connections past that limit and serves on. Its poll()-based server (a torch without libuv, as in the store
image) aborts the process there instead, so it listens on loopback behind ``store_relay.StoreRelay``, which
caps the connections under the same limit and closes the rest the way libuv does.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import socket
import threading
from dataclasses import dataclass

from torch.distributed import DistStoreError, TCPStore

from etj_contract import env as etj_env
from etj_contract.ports import (
    STORE_CONNECTIONS_PER_SOURCE,
    STORE_MAX_OPEN_FILES,
    STORE_QUERY_DEADLINE_S,
)
from etj_trainer.service.store_http import (
    LISTEN_BACKLOG,
    MAX_HTTP_CONNECTIONS,
    ProgressState,
    StoreProbe,
    make_http_server,
)
from etj_trainer.service.store_relay import StoreRelay, connection_cap

log = logging.getLogger(__name__)


def cap_open_files(limit: int) -> int:
    """Lower this process's soft RLIMIT_NOFILE to ``limit`` (never above the hard limit, never raised);
    the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(limit, hard) if hard != resource.RLIM_INFINITY else limit
    if soft == resource.RLIM_INFINITY or want < soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        return want
    return soft


@dataclass
class RunningStore:
    """The TCPStore server and, for torch's poll()-based one, the relay that owns the public socket."""

    store: TCPStore
    relay: StoreRelay | None = None

    def close(self) -> None:
        if self.relay is not None:
            self.relay.stop()


def open_store(
    host: str,
    port: int,
    fd: int,
    libuv: bool = True,
    max_connections: int | None = None,
    per_source: int = STORE_CONNECTIONS_PER_SOURCE,
    query_deadline_s: float = STORE_QUERY_DEADLINE_S,
) -> RunningStore:
    """The TCPStore server on the listening socket ``fd``: torch's libuv server where this torch has one
    (and ``libuv``), else its older poll()-based server (Debian's python3-torch, which the small store image
    runs, is built without libuv). Both speak the same protocol to every client
    (tests/chart/test_store_image.py).

    The poll()-based server aborts the process when accept() meets the descriptor limit, so it gets a
    loopback port of its own and a relay serves ``fd``, at most ``max_connections`` at once (default: what
    the descriptor limit leaves, ``store_relay.connection_cap``; ``per_source`` from one address; a query not
    whole ``query_deadline_s`` after its first byte closes its connection). Loopback is the pod's own:
    nothing more is exposed than the TCPStore's and the HTTP server's ports on ``host``.
    """
    # wait_for_workers=False: the store must come up before any agent exists and outlive them all.
    if libuv:
        try:
            return RunningStore(
                TCPStore(
                    host, port, is_master=True, wait_for_workers=False, use_libuv=True, master_listen_fd=fd
                )
            )
        except DistStoreError as e:
            # Refused before the socket is touched ("built without libuv support"): any other error is real.
            if "libuv" not in str(e):
                raise
        log.info("this torch has no libuv TCPStore server: using its poll()-based one behind a relay")
    inner = socket.create_server(("127.0.0.1", 0), backlog=LISTEN_BACKLOG)
    inner_port = inner.getsockname()[1]
    store = TCPStore(
        "127.0.0.1",
        inner_port,
        is_master=True,
        wait_for_workers=False,
        use_libuv=False,
        master_listen_fd=inner.detach(),
    )
    if max_connections is None:  # now that the server's own descriptors are open
        max_connections = connection_cap(_fd_limit(), reserved=MAX_HTTP_CONNECTIONS)
    relay = StoreRelay(
        socket.socket(fileno=fd), ("127.0.0.1", inner_port), max_connections, per_source, query_deadline_s
    )
    relay.start()
    return RunningStore(store, relay)


def _fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def serve(
    host: str = "0.0.0.0",
    port: int = 29400,
    http_port: int = 29401,
    token: str | None = None,
    max_open_files: int = STORE_MAX_OPEN_FILES,
    libuv: bool = True,
) -> None:
    """Run the store and the progress server on ``host`` until SIGTERM/SIGINT.

    ``token`` defaults to ``$ETJ_PROGRESS_TOKEN`` (the operator sets it from the job's Secret). ``libuv``
    False: torch's poll()-based TCPStore server even where libuv is there (as a torch without it runs).

    The pod binds its own IP (``--host $(POD_IP)``). TCPStore's libuv server listens on every address
    whatever host it is given, so it gets a socket already bound to ``host`` instead: process-backed pods
    share one machine's network, and two jobs' stores there must not take each other's port.
    """
    cap_open_files(max_open_files)  # before the store's server starts: its connections count against it
    listener = socket.create_server((host, port), backlog=1024)  # SO_REUSEADDR: TIME_WAIT is no conflict
    # The store (or its relay) owns, and closes, the socket from here.
    running = open_store(host, port, listener.detach(), libuv=libuv)
    state = ProgressState()
    if token is None:
        token = etj_env.PROGRESS_TOKEN.read(os.environ)
    if not token:
        log.warning("no %s: the progress endpoint accepts any client", etj_env.PROGRESS_TOKEN.name)
    httpd = make_http_server(host, http_port, state, token, ready=StoreProbe(host, port))
    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    t = threading.Thread(target=httpd.serve_forever, name="etj-progress-http", daemon=True)
    t.start()
    relayed = (
        f" (poll() server behind a relay, {running.relay.max_connections} connections at most)"
        if running.relay is not None
        else ""
    )
    print(
        f"etj-train store: TCPStore on {host}:{port}{relayed}, "
        f"progress on http://{host}:{http_port}/progress",
        flush=True,
    )
    stop.wait()
    httpd.shutdown()
    httpd.server_close()
    running.close()
    del running  # held until here: the TCPStore server lives as long as its object

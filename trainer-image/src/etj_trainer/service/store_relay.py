"""A connection-capping TCP relay in front of torch's poll()-based TCPStore server (issue 26).

torch built without libuv (Debian's python3-torch, the small store image's) serves the TCPStore with a
single poll() thread that aborts the whole process when ``accept()`` fails: a client opening connections
until the descriptor limit kills the store. Here that server listens on loopback only, and this relay owns
the store's public socket: it accepts every connection itself, closes those past ``max_connections`` at
once (what libuv's server does past the descriptor limit) and splices the others byte for byte to the
server, so clients see the same protocol. Each relayed connection costs three descriptors in the store
process (the client's, the relay's to the server, the server's accepted one): ``connection_cap`` keeps them
under the limit.

It also keeps one client from holding the server or the relay (issue 37):

- whole queries only: the poll() server reads a query with blocking ``recv()``s from its one thread, so the
  first byte of one, then silence, stopped it for every client. The relay buffers each query until it is
  whole (``store_framing``) and only then passes it on; a query (or a new connection's handshake) not whole
  ``query_deadline_s`` after its first byte (its accept) closes the connection;
- no idle deadline beyond that: between queries a connection may be silent as long as it likes, because a
  legitimate one is (a rank blocked in a ``wait`` or ``barrier`` for a whole rendezvous round; a regroup's
  process group, which holds its store client through hours of training and uses it at the next resize;
  torch's client never reconnects, so closing it breaks that rank). A peer that is gone (a node lost
  without a FIN) is found by TCP keepalives (``KEEPALIVE``: about two minutes) and its slot freed;
- ``per_source`` connections at most from one peer address, so one pod cannot take the whole cap.

One asyncio loop in a daemon thread.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import threading
import time
from collections import Counter

from etj_contract.ports import STORE_CONNECTIONS_PER_SOURCE, STORE_QUERY_DEADLINE_S
from etj_trainer.service.store_framing import Framer, Unframed

log = logging.getLogger(__name__)

FDS_PER_CONNECTION = 3
# Descriptors the store process opens besides the relayed connections' (the event loop's, the HTTP listener,
# a log file, a library's): slack on top of what is open when the cap is computed.
FD_HEADROOM = 32
# A client that stops reading its responses: they are buffered here rather than left to block the server's
# send (one blocked send stops the poll() server for every client); past this the client is dropped. Far
# above any value a rendezvous stores (its state is KiBs), so only a client that reads nothing meets it.
MAX_PENDING_TO_CLIENT = 64 << 20
# Connections accepted per wake-up of the loop, so a flood cannot starve the connections already relayed.
ACCEPT_BATCH = 64
ACCEPT_RETRY_S = 0.1  # after EMFILE/ENFILE/ENOBUFS/ENOMEM from accept(): try again later, never abort
# The longest query passed on (its value included): far above what a job stores (KiBs); past it, closed.
MAX_QUERY_BYTES = 16 << 20
# Bytes of unfinished queries the relay holds for all clients together; a query that would pass it is
# closed, so the partial queries of many connections cannot exhaust the pod's memory within their deadline.
MAX_BUFFERED_QUERIES = 128 << 20
# A dead peer: first probe after 60 s of silence, then every 10 s, gone after 6 unanswered.
KEEPALIVE = ((socket.TCP_KEEPIDLE, 60), (socket.TCP_KEEPINTVL, 10), (socket.TCP_KEEPCNT, 6))


def connection_cap(fd_limit: int, reserved: int) -> int:
    """Relayed connections that fit under ``fd_limit`` with ``reserved`` descriptors kept for the rest of
    the process (those open now, the HTTP server's connections); ValueError when not even one does."""
    open_now = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 64
    cap = (fd_limit - open_now - reserved - FD_HEADROOM) // FDS_PER_CONNECTION
    if cap < 1:
        raise ValueError(
            f"a descriptor limit of {fd_limit} leaves no room for TCPStore connections "
            f"({open_now} open, {reserved} reserved, {FD_HEADROOM} headroom, {FDS_PER_CONNECTION} each)"
        )
    return cap


class _Half(asyncio.Protocol):
    """One side of a relayed connection: what it receives is written to its peer."""

    def __init__(self, pair: _Pair, server_side: bool, framer: Framer | None = None) -> None:
        self._pair = pair
        self.server_side = server_side  # the connection to the server: what it receives goes to the client
        self.framer = framer  # the client's side: what it receives passes on as whole queries only
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.peer is not None and self.peer.lost:  # the server closed before the client side opened
            transport.close()

    def data_received(self, data: bytes) -> None:
        peer = self.peer.transport if self.peer is not None else None
        if peer is None or peer.is_closing():
            return
        if self.framer is not None:
            held = self.framer.pending
            try:
                data = self.framer.feed(data, time.monotonic())
            except Unframed as e:
                log.warning("store relay: a client sent what is not a TCPStore query (%s): closed", e)
                self._pair.abort()
                return
            if not self._pair.hold(self.framer.pending - held):
                return
            if not data:
                return
        peer.write(data)
        limit = MAX_PENDING_TO_CLIENT  # read here, not bound at import: tests lower it
        if self.server_side and peer.get_write_buffer_size() > limit:
            log.warning("store relay: a client left over %d bytes unread: dropped", limit)
            peer.abort()

    def eof_received(self) -> bool:
        return False  # close this side; connection_lost closes the other (torch's clients never half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        peer = self.peer.transport if self.peer is not None else None
        if peer is not None:
            peer.close()  # after what is buffered for it
        self._pair.half_closed()

    # Flow control, one direction only. pause_writing: this half's transport has too much to send. The
    # server's side: the server reads slowly, so the client's reads wait. The client's side: never passed on
    # to the server's reads, or the poll() server would block in send() for every client; its backlog is
    # bounded in data_received instead (MAX_PENDING_TO_CLIENT).
    def pause_writing(self) -> None:
        if self.server_side and self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.server_side and self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Pair:
    """A client connection and its connection to the server; the slot is freed once both are closed."""

    def __init__(self, relay: StoreRelay, source: str) -> None:
        self._relay = relay
        self._open = 2
        self.source = source  # the client's address: its connections count against ``per_source``
        self.held = 0  # bytes of its unfinished query in the relay's buffers
        self.client = _Half(self, server_side=False, framer=Framer(MAX_QUERY_BYTES, time.monotonic()))
        self.server = _Half(self, server_side=True)
        self.client.peer, self.server.peer = self.server, self.client

    def half_closed(self) -> None:
        self._open -= 1
        if self._open == 0:
            self.hold(-self.held)
            self._relay.released(self)

    def hold(self, more: int) -> bool:
        """Count ``more`` bytes of partial query held for this client; False (and closed) past the relay's
        budget for them all."""
        self.held += more
        self._relay.buffered += more
        if more > 0 and self._relay.buffered > MAX_BUFFERED_QUERIES:
            log.warning("store relay: partial queries over %d bytes: a client's closed", MAX_BUFFERED_QUERIES)
            self.abort()
            return False
        return True

    def overdue(self, now: float, deadline_s: float) -> bool:
        """Has its query (or its handshake) been arriving for longer than ``deadline_s``?"""
        framer = self.client.framer
        return framer is not None and framer.started is not None and now - framer.started > deadline_s

    def abort(self) -> None:
        for half in (self.client, self.server):
            if half.transport is not None:
                half.transport.abort()


class StoreRelay:
    """Accepts on ``listener``, relays each connection to ``upstream``, ``max_connections`` at most at once.

    Runs in its own thread from ``start()`` until ``stop()``; owns (and closes) ``listener``.
    """

    def __init__(
        self,
        listener: socket.socket,
        upstream: tuple[str, int],
        max_connections: int,
        per_source: int = STORE_CONNECTIONS_PER_SOURCE,
        query_deadline_s: float = STORE_QUERY_DEADLINE_S,
    ) -> None:
        self._listener = listener
        self.upstream = upstream  # the server's loopback address
        self.max_connections = max_connections
        self.per_source = per_source
        self.query_deadline_s = query_deadline_s
        self.active = 0  # read by tests and logs; only the loop's thread writes it
        self.refused = 0
        self.overdue = 0  # connections closed for a query (or handshake) not whole within the deadline
        self.buffered = 0  # bytes of partial queries held, all clients
        self._sources: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="etj-store-relay", daemon=True)
        self._tasks: set[asyncio.Task[None]] = set()
        self._pairs: set[_Pair] = set()

    def start(self) -> None:
        self._listener.setblocking(False)
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._listener.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.add_reader(self._listener, self._accept)
        self._loop.call_soon(self._sweep)
        try:
            self._loop.run_forever()
        finally:
            self._loop.remove_reader(self._listener)
            for task in list(self._tasks):
                task.cancel()
            for pair in list(self._pairs):
                pair.abort()
            self._loop.run_until_complete(asyncio.sleep(0))  # the aborts close their sockets
            self._loop.close()

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("store relay: accept failed: %s", e)
                    continue
                # The descriptor limit itself (something else in the process took the headroom): stop
                # accepting for a moment, the connections in the backlog wait, nothing aborts.
                log.warning("store relay: accept failed (%s): retrying in %.1f s", e, ACCEPT_RETRY_S)
                self._loop.remove_reader(self._listener)
                self._loop.call_later(ACCEPT_RETRY_S, self._loop.add_reader, self._listener, self._accept)
                return
            source = str(addr[0])
            if self.active >= self.max_connections or self._sources[source] >= self.per_source:
                # Past a cap: closed at once, as libuv's server does past the descriptor limit.
                self.refused += 1
                conn.close()
                continue
            self.active += 1
            self._sources[source] += 1
            _keepalive(conn)
            task = self._loop.create_task(self._relay(conn, source))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _sweep(self) -> None:
        """Close the connections whose query (or handshake) is overdue; again in a tenth of the deadline."""
        now = time.monotonic()
        for pair in [p for p in self._pairs if p.overdue(now, self.query_deadline_s)]:
            log.warning("store relay: a query from %s not whole in %.0f s: closed", pair.source,
                        self.query_deadline_s)  # fmt: skip
            self.overdue += 1
            pair.abort()
        self._loop.call_later(max(0.05, self.query_deadline_s / 10), self._sweep)

    async def _relay(self, conn: socket.socket, source: str) -> None:
        pair = _Pair(self, source)
        self._pairs.add(pair)
        try:
            await self._loop.create_connection(lambda: pair.server, *self.upstream)
        except OSError as e:
            log.warning("store relay: the TCPStore server refused a connection: %s", e)
            conn.close()
            self.released(pair)
            return
        try:
            await self._loop.connect_accepted_socket(lambda: pair.client, conn)
        except OSError:
            conn.close()
            pair.half_closed()  # the client side never opened
            if pair.server.transport is not None:
                pair.server.transport.close()  # its connection_lost frees the slot

    def released(self, pair: _Pair) -> None:
        self._pairs.discard(pair)
        self.active -= 1
        self._sources[pair.source] -= 1
        if not self._sources[pair.source]:
            del self._sources[pair.source]


def _keepalive(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in KEEPALIVE:
        conn.setsockopt(socket.IPPROTO_TCP, option, value)

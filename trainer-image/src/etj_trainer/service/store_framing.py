"""torch's TCPStore query framing, client to server, as its poll()-based server reads it (pure).

The relay (``store_relay``) passes a query to that server only once it has all of it: the server reads each
query with blocking ``recv()``s from its one thread, so a query's first byte with the rest never sent stopped
it for every client (issue 37). Framing of torch 2.14 (``TCPStoreBackend.cpp``; the trainer's and the store
image's torch are the same pin): a query is its type byte, then its arguments, each a u64 length and that
many bytes (``S``: a key or a value), an i64 (``Q``), a u32 (``I``), or a u64 count ``N`` of the groups that
follow. A type this table does not know (the queue queries, which that server refuses anyway, or a later
torch's) closes the connection instead of passing an unframed byte on: a torch upgrade that changes the
framing fails loudly in tests/trainer/test_store_relay.py (every operation through the relay), never stalls.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Generator


class Query(enum.IntEnum):
    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18


ARGS: dict[Query, str] = {
    Query.VALIDATE: "I",  # the magic number (torch's first query on every connection)
    Query.SET: "SS",
    Query.COMPARE_SET: "SSS",
    Query.GET: "S",
    Query.ADD: "SQ",
    Query.CHECK: "NS",
    Query.WAIT: "NS",
    Query.GETNUMKEYS: "",
    Query.DELETE_KEY: "S",
    Query.APPEND: "SS",
    Query.MULTI_GET: "NS",
    Query.MULTI_SET: "NSS",
    Query.CANCEL_WAIT: "",
    Query.PING: "I",  # a nonce
    Query.LIST_KEYS: "",
    Query.BARRIER: "SQ",
}
_FIXED = {"Q": 8, "I": 4}
_U64 = struct.Struct("=Q")  # the server's native order, as it reads them


class Unframed(ValueError):
    """Not a query the relay may pass on: an unknown type, or longer than the relay buffers."""


def walk(buf: bytearray, start: int, limit: int) -> Generator[int, None, int]:
    """Reads the query at ``buf[start:]`` as it arrives: yields each length ``buf`` must reach to read on,
    returns the query's end. Unframed for an unknown type or a query longer than ``limit`` bytes."""
    try:
        args = ARGS[Query(buf[start])]
    except (ValueError, KeyError):
        raise Unframed(f"query type {buf[start]}") from None
    pos = start + 1
    groups = 1
    if args.startswith("N"):
        yield pos + 8
        groups, args = _U64.unpack_from(buf, pos)[0], args[1:]
        pos += 8
    for _ in range(groups):  # ends at ``limit``: every group takes bytes
        for arg in args:
            if arg == "S":
                yield pos + 8
                pos += 8 + _U64.unpack_from(buf, pos)[0]
            else:
                pos += _FIXED[arg]
            if pos - start > limit:
                raise Unframed(f"a query of over {limit} bytes")
            yield pos
    return pos


class Framer:
    """A connection's bytes to the server: ``feed`` keeps what is not yet a whole query and returns the
    whole ones. ``started`` is when the query now arriving began (a monotonic time), None between queries."""

    def __init__(self, limit: int, now: float) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._query: Generator[int, None, int] | None = None
        self._need = 0
        self.started: float | None = now  # a new connection owes its handshake

    def feed(self, data: bytes, now: float) -> bytes:
        """Whole queries in the order sent (b"" while one is incomplete); Unframed: close the connection."""
        buf = self._buf
        buf += data
        done = 0  # bytes of buf that are whole queries
        while len(buf) > done:
            if self._query is None:
                self._query, self._need = walk(buf, done, self._limit), done + 1
                self.started = self.started if self.started is not None else now
            if len(buf) < self._need:
                break
            try:
                while len(buf) >= self._need:
                    self._need = next(self._query)
            except StopIteration as end:
                done, self._query, self.started = end.value, None, None
        whole = bytes(buf[:done])
        del buf[:done]
        if self._query is not None and done:
            self._query, self._need = walk(buf, 0, self._limit), 1  # offsets moved: read it again
        return whole

    @property
    def pending(self) -> int:
        """Bytes held: the query still arriving (at most ``limit``)."""
        return len(self._buf)

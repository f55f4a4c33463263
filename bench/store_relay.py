"""What the store's relay costs a TCPStore client (issue 26); prints JSON.

torch's poll()-based TCPStore server (the store image's torch has no libuv) is reached through
``store_relay.StoreRelay``, which caps its connections. Measured against the same server reached directly
(the baseline: the store image before the relay) and torch's libuv server (what the trainer image runs), each
in its own ``etj-train store``-like process, from clients in this process, all in the same run:

- ``ops``: round-trip latency of set, get, add and compare_set, one client, ``--ops`` each per round;
- ``connect``: a new client (connect, torch's handshake) and its first get;
- ``idle``: descriptors and resident memory of the server process per idle connection (``--idle`` of them);
- ``barrier``: ``--clients`` clients (threads, one connection each) meet like a rendezvous round: each adds
  itself to a counter and waits for a key the last one sets; seconds from the first add to all released.

``poll-relay-unframed`` is the relay as it was before issue 37 (bytes passed on as they come, no query
framing, so no partial-query deadline): ``framing_cost`` compares it with ``poll-relay`` (whole queries
only, the deadline's bookkeeping, the per-address cap), the same run, per operation: after - before in
microseconds and after / before.

The servers are measured in turns, round after round (``--rounds``), so load from elsewhere on the machine
falls on each alike. Latencies in microseconds: median, p90, p99 over every sample.

    python bench/store_relay.py --rounds 5 > bench/results/store_relay.json
    docker run --rm -v "$PWD/bench:/bench:ro" ghcr.io/etj-dev/etj-store:dev \
        python3 /bench/store_relay.py --servers poll-direct,poll-relay --classic-client \
        > bench/results/store_relay_image.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import TCPStore

JSON = dict[str, Any]

SERVERS = ("poll-direct", "poll-relay-unframed", "poll-relay", "libuv-direct")
TIMEOUT = timedelta(seconds=30)
HANDSHAKE = b"\x00" + (0x3C85F7CE).to_bytes(4, sys.byteorder)  # VALIDATE and torch's magic number


def serve(kind: str) -> None:
    """The server process: listens on a free loopback port, prints it, runs until stdin closes."""
    from etj_trainer.service.store_server import open_store

    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    port = listener.getsockname()[1]
    fd = listener.detach()
    if kind == "poll-relay-unframed":
        _unframed()
    if kind.startswith("poll-relay"):
        # Every client here comes from 127.0.0.1: no per-address cap (it costs nothing per round trip).
        running: Any = open_store("127.0.0.1", port, fd, libuv=False, per_source=1 << 30)
    else:
        libuv = kind == "libuv-direct"
        running = TCPStore(
            "127.0.0.1", port, is_master=True, wait_for_workers=False, use_libuv=libuv, master_listen_fd=fd
        )
    print(port, flush=True)
    sys.stdin.read()
    del running


def _unframed() -> None:
    """The relay before issue 37: what a client sends passes on as it comes, never held for framing."""
    from etj_trainer.service import store_relay

    init = store_relay._Pair.__init__

    def unframed(pair: store_relay._Pair, relay: store_relay.StoreRelay, source: str) -> None:
        init(pair, relay, source)
        pair.client.framer = None

    store_relay._Pair.__init__ = unframed  # type: ignore[method-assign]


CLIENT_LIBUV = [True]  # the clients' transport: libuv's (the trainer's torch) unless --classic-client


def _client(port: int) -> TCPStore:
    return TCPStore(
        "127.0.0.1",
        port,
        is_master=False,
        wait_for_workers=False,
        use_libuv=CLIENT_LIBUV[0],
        timeout=TIMEOUT,
    )


def _time_us(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t) / 1000)
    return out


def ops_round(port: int, n: int) -> dict[str, list[float]]:
    c = _client(port)
    c.set("k", "v" * 64)
    c.set("n", "0")
    return {
        "set": _time_us(lambda: c.set("k", "v" * 64), n),
        "get": _time_us(lambda: c.get("k"), n),
        "add": _time_us(lambda: c.add("n", 1), n),
        "compare_set": _time_us(lambda: c.compare_set("k", "v" * 64, "v" * 64), n),
    }


def connect_round(port: int, n: int) -> list[float]:
    def connect_and_get() -> None:
        _client(port).get("k")

    return _time_us(connect_and_get, n)


def barrier_round(port: int, clients: list[TCPStore], tag: str) -> float:
    """Seconds for ``clients`` to pass one barrier (a rendezvous round's shape)."""
    n = len(clients)
    start = threading.Barrier(n + 1)
    done = threading.Barrier(n + 1)

    def member(c: TCPStore) -> None:
        start.wait()
        if c.add(f"{tag}/arrived", 1) == n:
            c.set(f"{tag}/go", "1")
        c.wait([f"{tag}/go"])
        done.wait()

    threads = [threading.Thread(target=member, args=(c,), daemon=True) for c in clients]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    done.wait()
    elapsed = time.perf_counter() - t0
    for t in threads:
        t.join()
    return elapsed


def _proc_status(pid: int) -> tuple[int, int]:
    """The process's open descriptors and resident KiB."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return fds, rss


def idle_connections(pid: int, port: int, n: int) -> dict[str, float]:
    """What ``n`` idle connections cost the server process: descriptors and resident memory, each."""
    fds0, rss0 = _proc_status(pid)
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
    for s in socks:  # torch's handshake, as its client sends on connecting: else closed after its deadline
        s.sendall(HANDSHAKE)
    try:
        # Accepted (and relayed on) asynchronously: wait until the count settles.
        last, deadline = -1, time.monotonic() + 60
        while time.monotonic() < deadline:
            fds, rss = _proc_status(pid)
            if fds == last and fds >= fds0 + n:
                break
            last = fds
            time.sleep(0.2)
        return {"fds_each": round((fds - fds0) / n, 2), "rss_kib_each": round((rss - rss0) / n, 2), "n": n}
    finally:
        for s in socks:
            s.close()


def _summary_us(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=100)
    return {
        "median": round(statistics.median(samples), 1),
        "p90": round(q[89], 1),
        "p99": round(q[98], 1),
        "n": len(samples),
    }


def framer_feed_us(n: int) -> dict[str, float]:
    """The framing alone, per query, in the relay's own code (no sockets): median of ``n`` feeds of a
    whole query of each kind, as torch's client sends it (one chunk)."""
    import struct

    from etj_trainer.service.store_framing import Framer

    def s(b: bytes) -> bytes:
        return struct.pack("=Q", len(b)) + b

    queries = {
        "set": b"\x01" + s(b"k") + s(b"v" * 64),
        "get": b"\x06" + struct.pack("=Q", 1) + s(b"k"),  # a get is a wait, then a get: the wait's
        "add": b"\x04" + s(b"n") + struct.pack("=q", 1),
        "compare_set": b"\x02" + s(b"k") + s(b"v" * 64) + s(b"v" * 64),
    }
    framer = Framer(1 << 24, 0.0)
    framer.feed(HANDSHAKE, 0.0)
    out = {}
    for op, q in queries.items():
        samples = []
        for _ in range(n):
            t = time.perf_counter_ns()
            framer.feed(q, 0.0)
            samples.append((time.perf_counter_ns() - t) / 1000)
        out[op] = round(statistics.median(samples), 2)
    return out


def _before_after(before: float, after: float) -> dict[str, float]:
    return {
        "before_us": before,
        "after_us": after,
        "after_minus_before_us": round(after - before, 1),
        "after_over_before": round(after / before, 3),
    }


def _start(kind: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=1000, help="of each operation per round and server")
    ap.add_argument("--connects", type=int, default=50, help="new clients per round and server")
    ap.add_argument("--clients", type=int, default=64, help="barrier members")
    ap.add_argument("--idle", type=int, default=1000, help="idle connections, once per server")
    ap.add_argument(
        "--servers",
        default=",".join(SERVERS),
        help="which, comma-separated (a torch without libuv, as in the store image: poll-direct,poll-relay)",
    )
    ap.add_argument("--classic-client", action="store_true", help="clients without libuv (torch lacks it)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    CLIENT_LIBUV[0] = not ns.classic_client
    if ns.serve:
        serve(ns.serve)
        return 0
    load_before = os.getloadavg()[0]
    report(ns, measure(ns), load_before)
    return 0


def measure(ns: argparse.Namespace) -> JSON:
    """Every round on every server: operations, fresh connections, barriers; idle connections once."""
    kinds = [k for k in SERVERS if k in ns.servers.split(",")]
    assert {"poll-direct", "poll-relay"} <= set(kinds), "the relay and its baseline are always measured"
    servers = {kind: _start(kind) for kind in kinds}
    ops: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
    connects: dict[str, list[float]] = {k: [] for k in kinds}
    barriers: dict[str, list[float]] = {k: [] for k in kinds}
    members = {k: [_client(port) for _ in range(ns.clients)] for k, (_, port) in servers.items()}
    idle: dict[str, dict[str, float]] = {}
    try:
        for kind, (proc, port) in servers.items():
            idle[kind] = idle_connections(proc.pid, port, ns.idle)
        for r in range(ns.rounds):
            for kind, (_, port) in servers.items():
                for op, samples in ops_round(port, ns.ops).items():
                    ops[kind].setdefault(op, []).extend(samples)
                connects[kind].extend(connect_round(port, ns.connects))
                barriers[kind].append(barrier_round(port, members[kind], f"round{r}"))
    finally:
        for proc, _ in servers.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)

    return {
        kind: {
            "ops_us": {op: _summary_us(s) for op, s in ops[kind].items()},
            "connect_and_get_us": _summary_us(connects[kind]),
            "idle_connection": idle[kind],
            "barrier_s": {
                "median": round(statistics.median(barriers[kind]), 4),
                "all": [round(b, 4) for b in barriers[kind]],
                "clients": ns.clients,
            },
        }
        for kind in kinds
    }


def report(ns: argparse.Namespace, results: JSON, load_before: float) -> None:
    """The relay's overhead over the direct server (and framing's cost), with the machine, as JSON."""
    base = results["poll-direct"]
    relay = results["poll-relay"]
    overhead = {
        op: round(relay["ops_us"][op]["median"] - base["ops_us"][op]["median"], 1) for op in base["ops_us"]
    }
    overhead["connect_and_get"] = round(
        relay["connect_and_get_us"]["median"] - base["connect_and_get_us"]["median"], 1
    )
    overhead["barrier"] = round(1e6 * (relay["barrier_s"]["median"] - base["barrier_s"]["median"]), 1)
    framing: dict[str, dict[str, float]] = {}
    if "poll-relay-unframed" in results:
        before = results["poll-relay-unframed"]
        for op in base["ops_us"]:
            framing[op] = _before_after(before["ops_us"][op]["median"], relay["ops_us"][op]["median"])
        framing["connect_and_get"] = _before_after(
            before["connect_and_get_us"]["median"], relay["connect_and_get_us"]["median"]
        )
    machine = {
        "cpus": os.cpu_count(),
        "load_avg_1m": [load_before, os.getloadavg()[0]],  # before and after
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    json.dump(
        {
            "bench": "store_relay",
            "baseline": "poll-direct",
            "machine": machine,
            "params": vars(ns) | {"serve": None},
            "relay_overhead_median_us": overhead,
            "framing_cost": framing,
            "framer_feed_us": framer_feed_us(ns.ops * ns.rounds),
            "results": results,
        },
        sys.stdout,
        indent=2,
    )
    print()


if __name__ == "__main__":
    sys.exit(main())

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

SERVERS = ("poll-direct", "poll-relay", "libuv-direct")
TIMEOUT = timedelta(seconds=30)


def serve(kind: str) -> None:
    """The server process: listens on a free loopback port, prints it, runs until stdin closes."""
    from etj_trainer.service.store_server import open_store

    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    port = listener.getsockname()[1]
    fd = listener.detach()
    if kind == "poll-relay":
        running: Any = open_store("127.0.0.1", port, fd, libuv=False)
    else:
        libuv = kind == "libuv-direct"
        running = TCPStore(
            "127.0.0.1", port, is_master=True, wait_for_workers=False, use_libuv=libuv, master_listen_fd=fd
        )
    print(port, flush=True)
    sys.stdin.read()
    del running


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


def _start(kind: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def main(argv: list[str] | None = None) -> int:
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
    ns = ap.parse_args(argv)
    CLIENT_LIBUV[0] = not ns.classic_client
    if ns.serve:
        serve(ns.serve)
        return 0

    kinds = [k for k in SERVERS if k in ns.servers.split(",")]
    assert {"poll-direct", "poll-relay"} <= set(kinds), "the relay and its baseline are always measured"
    load_before = os.getloadavg()[0]
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

    results = {
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
    base = results["poll-direct"]
    relay = results["poll-relay"]
    overhead = {
        op: round(relay["ops_us"][op]["median"] - base["ops_us"][op]["median"], 1) for op in base["ops_us"]
    }
    overhead["connect_and_get"] = round(
        relay["connect_and_get_us"]["median"] - base["connect_and_get_us"]["median"], 1
    )
    overhead["barrier"] = round(1e6 * (relay["barrier_s"]["median"] - base["barrier_s"]["median"]), 1)
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
            "results": results,
        },
        sys.stdout,
        indent=2,
    )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

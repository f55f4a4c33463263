"""What sealing a store value with the job's token costs a round trip (issue 37, item 1); prints JSON.

The resize protocols' values (join queue entries, tickets, admissions, recovery records) are sealed
(core/mac.py: HMAC-SHA256 over the key's name and the value) before a ``set`` and opened after a ``get``.
Measured against the same set/get of the plain value (the baseline: the protocols before the seal), on one
TCPStore server (torch's libuv server, as the trainer image runs it) and one client in this process, in
alternating turns round after round (``--rounds``) so load from elsewhere falls on both alike. Also the seal
and the open alone (no store). Latencies in microseconds: median, p90, p99 over every sample.

    python bench/store_mac.py --rounds 5 > bench/results/store_mac.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import TCPStore

from etj_trainer.core.mac import Sealer

VALUE = json.dumps({"key": "join/1700000000.000000/1234", "rank": 2, "old": 2})  # a ticket's size


def _time(op: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        op()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _summary(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=100)
    return {
        "median_us": round(statistics.median(samples), 2),
        "p90_us": round(q[89], 2),
        "p99_us": round(q[98], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=2000, help="round trips per arm per round")
    args = ap.parse_args()
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    client = TCPStore(
        "127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30), use_libuv=False
    )
    sealer = Sealer.for_job("the-jobs-token", "bench-uid")
    key = sealer.name("etj-join", "ticket/pod-b")

    def plain() -> None:
        client.set(key, VALUE)
        assert client.get(key).decode() == VALUE

    def sealed() -> None:
        client.set(key, sealer.seal(key, VALUE))
        assert sealer.open(key, client.get(key)) == VALUE

    raw = sealer.seal(key, VALUE).encode()
    arms: dict[str, Callable[[], Any]] = {
        "plain_set_get": plain,
        "sealed_set_get": sealed,
        "seal_only": lambda: sealer.seal(key, VALUE),
        "open_only": lambda: sealer.open(key, raw),
    }
    samples: dict[str, list[float]] = {a: [] for a in arms}
    for op in arms.values():
        _time(op, 200)  # warm up
    for _ in range(args.rounds):
        for arm, op in arms.items():
            samples[arm] += _time(op, args.ops)
    result: dict[str, Any] = {arm: _summary(s) for arm, s in samples.items()}
    base, mac = result["plain_set_get"]["median_us"], result["sealed_set_get"]["median_us"]
    result["ratio_sealed_over_plain_median"] = round(mac / base, 3)
    result["added_us_median"] = round(mac - base, 2)
    result["setup"] = {
        "rounds": args.rounds,
        "ops_per_round": args.ops,
        "value_bytes": len(VALUE),
        "sealed_bytes": len(raw),
        "server": "torch TCPStore (libuv), loopback, client in the same process",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

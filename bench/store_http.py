"""What the store's HTTP server's defences against slow senders cost a request (issue 37); prints JSON.

The server as it was before (``--before-rev``'s ``store_server.py``, read from git: a slot taken at the
accept) and as it is (``store_http``: pending connections dropped after their header deadline, a slot
taken once the headers are in), each in this process, measured in turns in the same run: latency of
``GET /progress`` with the token, ``--requests`` per round, ``--rounds`` rounds. And ``GET /readyz``, the
store pod's readiness probe now (a new TCPStore client, a set and a read-back through the relay).

    python bench/store_http.py > bench/results/store_http.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

TOKEN = "bench-token"


def _module_at(rev: str) -> ModuleType:
    """``store_server`` as it was at ``rev`` (its HTTP server then lived there)."""
    root = Path(__file__).resolve().parent.parent
    path = "trainer-image/src/etj_trainer/service/store_server.py"
    text = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{path}"], check=True,
                          capture_output=True, text=True).stdout  # fmt: skip
    tmp = Path(tempfile.mkdtemp()) / "store_server_before.py"
    tmp.write_text(text)
    spec = importlib.util.spec_from_file_location("store_server_before", tmp)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def _get_us(url: str, token: str | None) -> float:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    t = time.perf_counter_ns()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
        resp.read()
    return (time.perf_counter_ns() - t) / 1000


def _summary(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=100)
    return {"median": round(statistics.median(samples), 1), "p90": round(q[89], 1), "n": len(samples)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--before-rev", default="main")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=300)
    ns = ap.parse_args(argv)

    from etj_trainer.service import store_http
    from etj_trainer.service.store_server import open_store

    before = _module_at(ns.before_rev)
    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    port = listener.getsockname()[1]
    running = open_store("127.0.0.1", port, listener.detach(), libuv=False)
    servers: dict[str, Any] = {
        "before": before.make_http_server("127.0.0.1", 0, before.ProgressState(), TOKEN),
        "after": store_http.make_http_server(
            "127.0.0.1", 0, store_http.ProgressState(), TOKEN, ready=store_http.StoreProbe("127.0.0.1", port)
        ),
    }
    for httpd in servers.values():
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
    samples: dict[str, list[float]] = {k: [] for k in servers}
    ready: list[float] = []
    load_before = os.getloadavg()[0]
    for _ in range(ns.rounds):
        for kind, httpd in servers.items():
            url = f"http://127.0.0.1:{httpd.server_address[1]}/progress"
            samples[kind] += [_get_us(url, TOKEN) for _ in range(ns.requests)]
        ready_url = f"http://127.0.0.1:{servers['after'].server_address[1]}/readyz"
        for _ in range(10):
            time.sleep(store_http.StoreProbe.REUSE_S)  # each one a real round trip, not the cached answer
            ready.append(_get_us(ready_url, None))
    for httpd in servers.values():
        httpd.shutdown()
        httpd.server_close()
    running.close()
    b, a = statistics.median(samples["before"]), statistics.median(samples["after"])
    json.dump(
        {
            "bench": "store_http",
            "before_rev": ns.before_rev,
            "load_avg_1m": [load_before, os.getloadavg()[0]],
            "params": vars(ns),
            "get_progress_us": {k: _summary(v) for k, v in samples.items()},
            "after_minus_before_us": round(a - b, 1),
            "after_over_before": round(a / b, 3),
            "readyz_us": _summary(ready),
        },
        sys.stdout,
        indent=2,
    )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

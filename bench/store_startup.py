"""The rendezvous store's start-up time and size, per image (issue 26); prints JSON.

For each image, ``--runs`` times: ``docker run`` of ``etj-train store`` (the store pod's command), then the
time until the store serves: ``GET /healthz`` on the progress port answers 200 (serve() starts the HTTP
server after the TCPStore is listening), polled on the container's bridge address (no docker-proxy, which
accepts connections before the container listens). Each run ends with a TCPStore client (this venv's torch)
setting and reading a key, so a store that answers HTTP but not TCPStore fails the run. The first image is
the one measured, the others the baselines (the trainer image the store ran before), in the same run.

Sizes: the unpacked size docker reports, and with ``--compressed`` the gzip'd ``docker save`` (what a
registry stores and a node pulls, to within the layer compression level; pull time ≈ that / bandwidth).

    python bench/store_startup.py ghcr.io/etj-dev/etj-store:dev ghcr.io/etj-dev/etj-trainer:dev-cpu --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta
from typing import Any

from etj_contract.ports import PROGRESS_PORT, RDZV_PORT

POLL_S = 0.02


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout.strip()


def _serves(ip: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{ip}:{PROGRESS_PORT}/healthz", timeout=1) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _store_answers(ip: str) -> bool:
    from torch.distributed import TCPStore

    client = TCPStore(ip, RDZV_PORT, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=10))
    client.set("etj-bench", "ok")
    return bool(client.get("etj-bench") == b"ok" and client.add("etj-bench-n", 2) == 2)


def one_run(image: str, timeout_s: float) -> dict[str, Any]:
    """Seconds from ``docker run`` to the store serving (and the part of it ``docker run`` itself took)."""
    t0 = time.monotonic()
    cid = _docker("run", "-d", "--rm", image, "etj-train", "store", "--host", "0.0.0.0")
    started = time.monotonic() - t0
    try:
        ip = _docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", cid)
        while not _serves(ip):
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"{image}: no /healthz after {timeout_s} s; logs: {_docker('logs', cid)}")
            time.sleep(POLL_S)
        serving = time.monotonic() - t0
        return {
            "serving_s": round(serving, 3),
            "docker_run_s": round(started, 3),
            "tcpstore_ok": _store_answers(ip),
        }
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)


def sizes(image: str, compressed: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "size_mb": round(int(_docker("image", "inspect", "-f", "{{.Size}}", image)) / 1e6, 1)
    }
    if compressed:
        # Counted as it streams: a trainer image's archive is gigabytes.
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        gz = subprocess.Popen(["gzip", "-c"], stdin=save.stdout, stdout=subprocess.PIPE)
        assert gz.stdout is not None
        total = 0
        while chunk := gz.stdout.read(1 << 20):
            total += len(chunk)
        if save.wait() or gz.wait():
            raise RuntimeError(f"docker save {image} | gzip failed")
        out["compressed_mb"] = round(total / 1e6, 1)
    torch = subprocess.run(
        ["docker", "run", "--rm", image, "python3", "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    out["torch"] = torch.stdout.strip() or None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("images", nargs="+", help="the store image first, then the baselines")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a store may take to serve")
    ap.add_argument("--compressed", action="store_true", help="also gzip `docker save` (slow for GB images)")
    args = ap.parse_args(argv)
    results = []
    for image in args.images:
        runs = [one_run(image, args.timeout) for _ in range(args.runs)]
        serving = [r["serving_s"] for r in runs]
        results.append(
            {
                "image": image,
                **sizes(image, args.compressed),
                "runs": runs,
                "serving_s_median": statistics.median(serving),
                "serving_s_first": serving[0],
            }
        )
    json.dump({"bench": "store_startup", "results": results}, sys.stdout, indent=2)
    print()
    return 0 if all(r["tcpstore_ok"] for res in results for r in res["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())

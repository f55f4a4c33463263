"""Process-level helpers of the process-node harness: signals, leftovers, readiness probes.

Every pod process carries `ETJ_PROCLET_ROOT=<harness root>` and `ETJ_PROCLET_POD_UID=<uid>` in its
environment. Process groups catch most descendants; the markers catch the rest (daemons that called
setsid, processes a crashed harness left behind), by scanning /proc.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

JSON = dict[str, Any]
MARK_ROOT = "ETJ_PROCLET_ROOT"
MARK_POD = "ETJ_PROCLET_POD_UID"


def probe(ip: str, probe: JSON, ports: dict[str, int]) -> bool:
    """tcpSocket and httpGet readiness probes against the pod's IP; other kinds always pass."""
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        if "tcpSocket" in probe:
            port = _port(probe["tcpSocket"].get("port"), ports)
            with socket.create_connection((ip, port), timeout=timeout):
                return True
        if "httpGet" in probe:
            get = probe["httpGet"]
            url = f"http://{ip}:{_port(get.get('port'), ports)}{get.get('path', '/')}"
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return 200 <= int(resp.status) < 400
    except (OSError, ValueError):
        return False
    return True


def _port(value: Any, ports: dict[str, int]) -> int:
    return ports[value] if isinstance(value, str) and not value.isdigit() else int(value)


def env_name(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name).upper()


def killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def reap_marked(root: str, uid: str | None = None) -> list[int]:
    """SIGKILL every process carrying this harness root's marker (and `uid`'s, if given) in its
    environment: the children that left their process group, and whatever a crashed harness left."""
    wanted = [f"{MARK_ROOT}={root}".encode()]
    if uid:
        wanted.append(f"{MARK_POD}={uid}".encode())
    killed: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(w in environ for w in wanted):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except OSError:
                pass
    # SIGKILL is asynchronous: callers (the harness's stop, a pod's teardown) promise that nothing is left
    # when they return, so wait until the kernel has really ended them (found by a flaky CI run of
    # test_stopping_the_harness_leaves_no_processes).
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(is_running(pid) for pid in killed):
        time.sleep(0.01)
    return killed


def is_running(pid: int) -> bool:
    """Exists and is not a zombie (a zombie has ended; only its parent's wait() is missing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def iter_pids_with_marker(root: Path) -> Iterator[int]:
    """Processes still carrying `root`'s marker (for tests: proves nothing was orphaned)."""
    wanted = f"{MARK_ROOT}={root.resolve()}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat.rsplit(")", 1)[-1].split()[0] == "Z":
                continue
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                yield int(entry.name)
        except OSError:
            continue

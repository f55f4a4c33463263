"""A real S3-compatible server for tests: versitygw (posix backend), built from its Go module into the etj
cache by scripts/setup.sh. Not a mock: the same S3 protocol, signatures and semantics a bucket has."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

VERSITYGW_VERSION = "v1.8.0"  # scripts/setup.sh builds this one
ACCESS, SECRET = "etjtestaccess", "etjtestsecret-0123456789"


def binary() -> Path:
    cache = Path(
        os.environ.get("ETJ_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "etj"
    )
    return cache / f"tools-versitygw-{VERSITYGW_VERSION}" / "versitygw"


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT

    def env(self) -> dict[str, str]:
        """The AWS variables a client (object_store.client_from_env) needs for this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
        }


@contextmanager
def s3_server(root: Path, buckets: tuple[str, ...] = ("etj",)) -> Iterator[S3Server]:
    exe = binary()
    if not exe.is_file():
        pytest.skip(f"{exe} is missing: scripts/setup.sh builds it")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for b in buckets:  # the posix backend's buckets are top-level directories
        (root / b).mkdir(parents=True, exist_ok=True)
    log = open(root.parent / "versitygw.log", "wb")  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(
        [str(exe), "--access", ACCESS, "--secret", SECRET, "--port", f"127.0.0.1:{port}", "posix", str(root)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError as e:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"versitygw did not start: {(root.parent / 'versitygw.log').read_text()}"
                    ) from e
                time.sleep(0.1)
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()

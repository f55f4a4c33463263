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


class S3Process:
    """versitygw serving ``root`` on one port: ``stop()`` and ``start()`` it again on the same port and data
    (an S3 outage mid-run: connections refused while stopped, the same objects after)."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root.parent / "versitygw.log"

    def start(self) -> None:
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [str(binary()), "--access", ACCESS, "--secret", SECRET, "--port", f"127.0.0.1:{self.port}",
                 "posix", str(self.root)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError as e:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"versitygw did not start: {self.log_path.read_text()}") from e
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@contextmanager
def s3_process(root: Path, buckets: tuple[str, ...] = ("etj",)) -> Iterator[tuple[S3Server, S3Process]]:
    """A started versitygw on a free port with ``buckets``, and its handle to stop and start it."""
    if not binary().is_file():
        pytest.skip(f"{binary()} is missing: scripts/setup.sh builds it")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for b in buckets:  # the posix backend's buckets are top-level directories
        (root / b).mkdir(parents=True, exist_ok=True)
    server = S3Process(root, port)
    server.start()
    try:
        yield S3Server(f"http://127.0.0.1:{port}"), server
    finally:
        server.stop()


@contextmanager
def s3_server(root: Path, buckets: tuple[str, ...] = ("etj",)) -> Iterator[S3Server]:
    with s3_process(root, buckets) as (server, _):
        yield server

"""Atomic, verified checkpoints with a fast local copy.

File format: ``ETJCKPT1`` magic, 8-byte little-endian payload length, 32-byte SHA-256 of the payload, then
the ``torch.save`` payload. Written to a temp file in the same directory, fsynced, renamed over the final
name, and the directory fsynced -- so a reader sees either the old file or the complete new one. The
checksum catches what rename cannot (a truncated copy, bit rot, a file written by something else). Loading
walks the checkpoints newest-first and returns the first one that verifies, so a corrupt or partial
checkpoint is never loaded and the previous good one is.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

MAGIC = b"ETJCKPT1"
_HEADER = struct.Struct("<8sQ32s")
_NAME = re.compile(r"^ckpt-(\d{9})\.pt$")


class CorruptCheckpoint(Exception):
    pass


def encode(state: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    return _HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload


def decode(blob: bytes) -> dict[str, Any]:
    if len(blob) < _HEADER.size:
        raise CorruptCheckpoint("shorter than the header")
    magic, length, digest = _HEADER.unpack_from(blob)
    payload = blob[_HEADER.size :]
    if magic != MAGIC:
        raise CorruptCheckpoint("bad magic")
    if len(payload) != length:
        raise CorruptCheckpoint(f"payload is {len(payload)} bytes, header says {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpoint("checksum mismatch")
    # weights_only: a checkpoint holds only tensors and plain containers/numbers, never pickled code, so
    # loading one from a shared volume cannot execute anything.
    state: dict[str, Any] = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    return state


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    # The rename is only durable once the directory entry is on disk.
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"ckpt-{step:09d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) newest first; temp files and foreign names are ignored."""
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = _NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found, reverse=True)


@dataclass
class LoadedCheckpoint:
    step: int
    path: Path
    blob: bytes  # the verified file, so it can be sent to peers without re-encoding
    state: dict[str, Any]


def load_latest(directory: Path) -> LoadedCheckpoint | None:
    """Newest checkpoint in ``directory`` that verifies; corrupt ones are logged and skipped."""
    for step, path in list_checkpoints(directory):
        try:
            blob = path.read_bytes()
            state = decode(blob)
        except (OSError, CorruptCheckpoint, RuntimeError, EOFError) as e:
            log.warning("skipping unusable checkpoint %s: %s", path, e)
            continue
        return LoadedCheckpoint(step=step, path=path, blob=blob, state=state)
    return None


def prune(directory: Path, keep: int) -> None:
    for _, path in list_checkpoints(directory)[keep:]:
        path.unlink(missing_ok=True)


class CheckpointStore:
    """A shared (PVC) directory written on an interval / on demand, plus an optional fast local copy."""

    def __init__(self, shared_dir: Path | None, local_dir: Path | None, keep: int = 3) -> None:
        self.shared_dir = shared_dir
        self.local_dir = local_dir
        self.keep = keep

    def save(self, state: dict[str, Any], step: int, shared: bool, local: bool = True) -> bytes:
        blob = encode(state)
        for directory, wanted in ((self.local_dir, local), (self.shared_dir, shared)):
            if directory is not None and wanted:
                write_atomic(checkpoint_path(directory, step), blob)
                prune(directory, self.keep)
        return blob

    def latest(self) -> LoadedCheckpoint | None:
        """Newest verified checkpoint across the local and the shared copy."""
        candidates = [c for d in (self.local_dir, self.shared_dir) if d is not None if (c := load_latest(d))]
        return max(candidates, key=lambda c: c.step, default=None)

"""Atomic, verified checkpoints with a fast local copy.

File format: ``ETJCKPT1`` magic, 8-byte little-endian payload length, 32-byte SHA-256 of the payload, then
the ``torch.save`` payload. Written to a temp file in the same directory, fsynced, renamed over the final
name, and the directory fsynced -- so a reader sees either the old file or the complete new one. The
checksum catches what rename cannot (a truncated copy, bit rot, a file written by something else). Loading
walks the checkpoints newest-first and returns the first one that verifies, so a corrupt or partial
checkpoint is never loaded and the previous good one is.

``StateWriter`` keeps checkpoints off the step's path: the node-local copy is written synchronously only
when the process stops (a stop at a step boundary, the end, a failed collective), and otherwise as a
periodic snapshot -- tensors copied to CPU memory at a step boundary, encoded and written by a background
thread -- as is the shared copy on its step interval. A step pays nothing but, once per interval, one
memory copy of the state.

The shared copy goes to a directory (a PVC) or, with ``checkpoint_uri``, to an S3-compatible object store
(object_store.py): same names, same format, same newest-verified-wins rule.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from etj_trainer.checkpoint.retry import Backoff, retried

if TYPE_CHECKING:
    from etj_trainer.checkpoint.object_store import ObjectDir
    from etj_trainer.config import TrainConfig

log = logging.getLogger(__name__)

MAGIC = b"ETJCKPT1"
_HEADER = struct.Struct("<8sQ32s")
_NAME = re.compile(r"^ckpt-(\d{9})\.pt$")


class CorruptCheckpoint(Exception):
    pass


class SharedWriteFailed(Exception):
    """The shared copy (PVC or object store) of a checkpoint was not written: it is not durable."""


class CheckpointNotDurable(RuntimeError):
    """Too many shared writes failed in a row: the job stops rather than train on without a durable copy."""


DEFAULT_POLICY = Backoff(120.0)  # TrainConfig.checkpoint_store_timeout_s's default


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


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:09d}.pt"


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / checkpoint_name(step)


def _steps(names: list[str]) -> list[tuple[int, str]]:
    """(step, name) of the checkpoint names among ``names``, newest first (temp and foreign names out)."""
    return sorted(((int(m.group(1)), n) for n in names if (m := _NAME.match(n))), reverse=True)


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) newest first; temp files and foreign names are ignored."""
    if not directory.is_dir():
        return []
    return [(step, directory / name) for step, name in _steps([p.name for p in directory.iterdir()])]


@dataclass
class LoadedCheckpoint:
    step: int
    path: Path | str  # a file, or an object's s3:// URI
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


def load_latest_object(objects: ObjectDir, policy: Backoff) -> LoadedCheckpoint | None:
    """``load_latest`` for an object store: the newest object that verifies. A LIST or GET that fails is
    tried again (retry.py) and then raises ``StoreUnreachable``: never "no checkpoint", never an older one
    in place of a newer that could not be read. A corrupt object, or one pruned since the LIST, is skipped."""
    found = retried(lambda: _steps(objects.names()), f"list the checkpoints in {objects}", policy)
    for step, name in found:
        blob = retried(partial(objects.read_if_present, name), f"read {objects}{name}", policy)
        if blob is None:
            continue
        try:
            state = decode(blob)
        except (CorruptCheckpoint, RuntimeError, EOFError) as e:
            log.warning("skipping unusable checkpoint %s%s: %s", objects, name, e)
            continue
        return LoadedCheckpoint(step=step, path=f"{objects}{name}", blob=blob, state=state)
    return None


def prune_objects(objects: ObjectDir, keep: int) -> None:
    for _, name in _steps(objects.names())[keep:]:
        objects.delete(name)


class CheckpointStore:
    """A shared copy (a PVC directory, or an object store) written on an interval / on demand, plus an
    optional fast local copy."""

    def __init__(
        self,
        shared_dir: Path | None,
        local_dir: Path | None,
        keep: int = 3,
        shared_objects: ObjectDir | None = None,
        policy: Backoff = DEFAULT_POLICY,
    ) -> None:
        self.shared_dir = None if shared_objects is not None else shared_dir
        self.shared_objects = shared_objects
        self.local_dir = local_dir
        self.keep = keep
        self.policy = policy  # how long a read of the object store is retried before it fails

    @classmethod
    def for_config(cls, cfg: TrainConfig) -> CheckpointStore:
        objects = None
        if cfg.checkpoint_uri:
            from etj_trainer.checkpoint.object_store import ObjectDir

            objects = ObjectDir(cfg.checkpoint_uri)
        policy = Backoff(cfg.checkpoint_store_timeout_s)
        return cls(cfg.checkpoint_dir, cfg.local_checkpoint_dir, cfg.checkpoint_keep, objects, policy)

    @property
    def durable(self) -> bool:
        return self.shared_dir is not None or self.shared_objects is not None

    def save(self, state: dict[str, Any], step: int, shared: bool, local: bool = True) -> bytes:
        """Write ``step``'s checkpoint; ``SharedWriteFailed`` when its shared copy was not written (the
        local copy, first, is then written anyway)."""
        blob = encode(state)
        if self.local_dir is not None and local:
            write_atomic(checkpoint_path(self.local_dir, step), blob)
            prune(self.local_dir, self.keep)
        if shared and self.durable:
            try:
                self._write_shared(step, blob)
            except Exception as e:  # the caller counts it (StateWriter) or raises it (the final write)
                raise SharedWriteFailed(f"{self.shared_location(step)}: {type(e).__name__}: {e}") from e
            try:
                self._prune_shared()
            except Exception as e:  # the checkpoint is durable; an old one more stays until the next prune
                log.warning("could not prune old checkpoints: %s", e)
        return blob

    def _write_shared(self, step: int, blob: bytes) -> None:
        if self.shared_objects is not None:
            self.shared_objects.write(checkpoint_name(step), blob)
        elif self.shared_dir is not None:
            write_atomic(checkpoint_path(self.shared_dir, step), blob)

    def _prune_shared(self) -> None:
        if self.shared_objects is not None:
            prune_objects(self.shared_objects, self.keep)
        elif self.shared_dir is not None:
            prune(self.shared_dir, self.keep)

    def shared_location(self, step: int) -> str:
        """Where the shared copy of ``step`` is (status.lastCheckpoint.path): an s3:// URI or a file."""
        if self.shared_objects is not None:
            return f"{self.shared_objects}{checkpoint_name(step)}"
        return str(checkpoint_path(self.shared_dir, step)) if self.shared_dir is not None else ""

    def latest(self) -> LoadedCheckpoint | None:
        """Newest verified checkpoint across the local and the shared copy."""
        candidates = [c for c in (self.latest_on_node(), self.latest_object()) if c is not None]
        return max(candidates, key=lambda c: c.step, default=None)

    def latest_on_node(self) -> LoadedCheckpoint | None:
        """Newest verified checkpoint among the copies a file system holds (local, PVC): no download."""
        candidates = [c for d in (self.local_dir, self.shared_dir) if d is not None if (c := load_latest(d))]
        return max(candidates, key=lambda c: c.step, default=None)

    def latest_object(self) -> LoadedCheckpoint | None:
        """Newest verified checkpoint in the object store (downloaded and decoded); None without one."""
        if self.shared_objects is None:
            return None
        return load_latest_object(self.shared_objects, self.policy)

    def newest_object_step(self) -> int:
        """The newest step the object store lists (a LIST, nothing downloaded); -1 for none. Unreachable
        raises ``StoreUnreachable`` after the retries (retry.py): it is not "none"."""
        objects = self.shared_objects
        if objects is None:
            return -1
        found = retried(lambda: _steps(objects.names()), f"list the checkpoints in {objects}", self.policy)
        return found[0][0] if found else -1


def cpu_copy(obj: Any) -> Any:
    """A copy of a state (nested dicts/lists/tuples) whose tensors are detached CPU copies (a snapshot that
    training may go on mutating beside)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(cpu_copy(v) for v in obj)
    return obj


class StateWriter:
    """Writes a ``CheckpointStore`` without making the steps wait.

    ``background`` copies the state to CPU memory on the calling thread (the only cost a step sees: one
    memory copy, once per interval) and encodes and writes it on a daemon thread; ``now`` writes
    synchronously, after any write in flight so that files land in step order -- the stop, finish and
    failure paths use it. ``local_due`` says when the periodic node-local snapshot is due: every
    ``local_interval_s`` seconds, stretched so that snapshots take at most ``budget`` of the time (a slow
    disk or a busy CPU makes them rarer, not the training slower). So a process killed without running an
    exit path (SIGKILL) leaves a local copy at most ``max(local_interval_s, last snapshot's time /
    budget)`` old, plus the step in progress.
    """

    def __init__(self, store: CheckpointStore, local_interval_s: float, budget: float = 0.01) -> None:
        self.store = store
        self.local_interval_s = local_interval_s
        self.budget = budget
        self._last_local = time.monotonic()
        self._snapshot_s = 0.0  # wall time of the last background write, copy included
        self._thread: threading.Thread | None = None
        self.written: list[tuple[int, bool, bool]] = []  # (step, shared, local) in write order
        # What the operator is told (status.lastCheckpoint, condition CheckpointDurable): the newest shared
        # write confirmed written {step, path, time}, and the shared writes that failed since, with the
        # newest one's error. Set by the writer thread, read at step boundaries.
        self.durable: dict[str, Any] | None = None
        self.failed_writes = 0
        self.shared_error: str | None = None

    def local_due(self) -> bool:
        if self.store.local_dir is None or self.local_interval_s <= 0:
            return False
        interval = max(self.local_interval_s, self._snapshot_s / self.budget)
        return time.monotonic() - self._last_local >= interval

    def background(
        self, make_state: Callable[[], dict[str, Any]], step: int, shared: bool, local: bool
    ) -> None:
        self.wait()
        t0 = time.monotonic()
        state = cpu_copy(make_state())
        if local:
            self._last_local = t0
        self._thread = threading.Thread(
            target=self._write_logged,
            args=(state, step, shared, local, t0),
            name="etj-state-writer",
            daemon=True,
        )
        self._thread.start()

    def now(self, state: dict[str, Any], step: int, shared: bool, local: bool) -> None:
        self.wait()
        self._write(state, step, shared, local)
        if local:
            self._last_local = time.monotonic()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _write(self, state: dict[str, Any], step: int, shared: bool, local: bool) -> None:
        shared = shared and self.store.durable
        if not (shared or (local and self.store.local_dir is not None)):
            return
        try:
            self.store.save(state, step, shared=shared, local=local)
        except SharedWriteFailed as e:
            self.failed_writes, self.shared_error = self.failed_writes + 1, str(e)
            raise
        if shared:
            self.durable = {"step": step, "path": self.store.shared_location(step), "time": time.time()}
            self.failed_writes, self.shared_error = 0, None
        self.written.append((step, shared, local))

    def check_failures(self, max_failed_writes: int) -> None:
        """Rank 0 at a step boundary: ``CheckpointNotDurable`` once more than ``max_failed_writes`` shared
        writes failed in a row (spec.checkpoint.maxFailedWrites). Until then training goes on with the
        node-local copies, and the progress reports carry the error."""
        if self.failed_writes > max_failed_writes:
            raise CheckpointNotDurable(
                f"{self.failed_writes} shared checkpoint writes failed in a row "
                f"(checkpoint.maxFailedWrites {max_failed_writes}); the newest: {self.shared_error}"
            )

    def _write_logged(self, state: dict[str, Any], step: int, shared: bool, local: bool, t0: float) -> None:
        try:
            self._write(state, step, shared, local)
        except Exception as e:  # a failed background write must not kill training; the next one may work
            log.warning("checkpoint of step %d not written: %s", step, e)
        self._snapshot_s = time.monotonic() - t0

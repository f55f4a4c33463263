"""Sharded checkpoints (``parallelism`` FSDP or HSDP): torch.distributed.checkpoint (DCP) directories.

A sharded state is tied to its world size in memory, not on disk: DCP writes each rank's shards with their
place in the full tensors (``.metadata``), and a load plans the reads for the loading world's own shards,
so a checkpoint written by 2 ranks loads at 1, 3 or 4 (resharding on load). Layout, beside the DDP files
(store.py's ``ckpt-<step>.pt``, unchanged) in the same directory::

    dcp-<step:09d>/.metadata           DCP's plan of the whole state (rank 0)
    dcp-<step:09d>/__<rank>_0.distcp   each rank's shards
    dcp-<step:09d>/etj-state.pt        the rest (sampler, step, RNG, meta...), store.py's verified format

Every rank writes into ``.dcp-<step>.tmp`` and rank 0 renames it once DCP's save returned (its last
collective gathers every rank's write results, so all shards are on disk); a reader only ever sees complete
directories. The directory must be one every rank sees (a PVC): DCP has no object-store writer in torch,
and a node-local copy would hold only that node's shards.

Anything read from the volume is data, never code (the house rule store.py's ``weights_only`` load keeps):
DCP unpickles ``.metadata`` with a plain ``pickle.load`` (``FileSystemReader.read_metadata``, torch 2.14)
and loads non-tensor values with ``torch.load(weights_only=False)`` (``DefaultLoadPlanner.load_bytes``).
``SafeReader`` unpickles the metadata through an allow-list of DCP's own classes, and ``SafePlanner``
loads the values with ``weights_only=True``.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from etj_trainer.checkpoint.store import decode, encode, write_atomic

STATE_FILE = "etj-state.pt"
_DIR = re.compile(r"^dcp-(\d{9})$")

# Every global a DCP .metadata of torch 2.14 names (recorded from real saves of model and optimizer
# states); torch's dtypes, layouts and memory formats are checked by type below.
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_DCP_CLASSES = (
    "Metadata", "StorageMeta", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata",
    "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING",
)  # fmt: skip
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {(_DCP_METADATA, name) for name in _DCP_CLASSES}
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),  # a name -> torch.layout lookup
        ("torch", "Size"),
        ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
        ("pathlib", "PurePosixPath"),
    }
)
_TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)


class ShardedCheckpointFailed(RuntimeError):
    """DCP's save or load failed on some rank. DCP raises a ``CheckpointException``, a BaseException that
    the loop's failure handling (``except Exception``) would not see; this carries its text."""


class MetadataRefused(pickle.UnpicklingError):
    """A checkpoint's .metadata names something other than DCP's own metadata: it is not loaded."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), _TORCH_VALUES):
            return getattr(torch, name)
        raise MetadataRefused(
            f"checkpoint metadata names {module}.{name}, which is not DCP metadata: refused (a checkpoint "
            "is data, never code)"
        )


def read_metadata(stream: io.BufferedIOBase | Any) -> Metadata:
    """A DCP ``.metadata`` unpickled through the allow-list; ``MetadataRefused`` for anything else."""
    metadata = _MetadataUnpickler(stream).load()
    if not isinstance(metadata, Metadata):
        raise MetadataRefused(f"checkpoint metadata is a {type(metadata).__name__}, not a DCP Metadata")
    return metadata


class SafeReader(FileSystemReader):
    """torch's ``FileSystemReader`` with ``read_metadata`` through the allow-list (the same steps else)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = read_metadata(stream)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, whose non-tensor values (an optimizer's param_groups) load with
    ``weights_only=True``: plain containers and numbers, never a pickled callable."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def directory_name(step: int) -> str:
    return f"dcp-{step:09d}"


def list_sharded(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of the complete sharded checkpoints in ``directory``, newest first."""
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in directory.iterdir()
        if (m := _DIR.match(p.name)) and (p / ".metadata").is_file() and (p / STATE_FILE).is_file()
    ]
    return sorted(found, reverse=True)


def save(
    directory: Path, step: int, tensors: dict[str, Any], rest: dict[str, Any], rank: int, keep: int
) -> Path:
    """Every rank of the world (a collective): ``tensors`` (DTensor state dicts) with DCP, ``rest`` by
    rank 0 in store.py's verified format, renamed into place once complete; the newest ``keep`` stay.
    ``ShardedCheckpointFailed`` on every rank when the shards were not written; on rank 0 alone when
    only its last part (the rest, the rename) failed."""
    on = dist.is_available() and dist.is_initialized()
    final = directory / directory_name(step)
    tmp = directory / f".{final.name}.tmp"
    error = ""
    if rank == 0:  # a write that died half way left this: start clean
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        except OSError as e:
            error = f": {e}"
    failed = torch.tensor([1.0 if error else 0.0])
    if on:
        # a barrier that says whether rank 0 could prepare: no rank writes into tmp before it exists, and
        # none goes into DCP's collectives (to wait there for rank 0) when it could not
        dist.all_reduce(failed)
    if failed.item():
        raise ShardedCheckpointFailed(f"saving {final}: rank 0 could not prepare {tmp}{error}")
    try:
        dcp.save(tensors, storage_writer=FileSystemWriter(tmp, sync_files=True), no_dist=not on)
        if rank == 0:
            write_atomic(tmp / STATE_FILE, encode(rest))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            _fsync_dir(directory)
    except (CheckpointException, OSError) as e:
        raise ShardedCheckpointFailed(f"saving {final}: {e}") from e
    if rank == 0:
        for _, old in list_sharded(directory)[keep:]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load(path: Path, tensors: dict[str, Any]) -> dict[str, Any]:
    """Load ``path`` into ``tensors`` in place (this world's DTensor state dicts: DCP reads each rank's
    own shards, whatever the world that wrote them); returns the rest (sampler, step, RNG, meta...)."""
    on = dist.is_available() and dist.is_initialized()
    # Read once here first: DCP's load would wrap a refusal in its CheckpointException of every rank
    SafeReader(path).read_metadata()
    try:
        dcp.load(tensors, storage_reader=SafeReader(path), planner=SafePlanner(), no_dist=not on)
    except CheckpointException as e:
        raise ShardedCheckpointFailed(f"loading {path}: {e}") from e
    return decode((path / STATE_FILE).read_bytes())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

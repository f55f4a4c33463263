"""DALI image-classification input, sharded by the elastic sampler through ``fn.external_source``.

Readers' own ``shard_id``/``num_shards`` cannot express "the remaining samples of this epoch, re-split over
a new world size", so the encoded bytes are fed by ``external_source`` from the index stream the elastic
sampler assigns to this rank; decoding, resizing and normalisation stay in DALI ("mixed" nvJPEG decoding
when CUDA is present, DALI's CPU operators with ``device_id=None`` when not).

Augmentation ("standard": random-resized crop + flip) is *drawn* in Python from (seed, epoch, sample id)
(augment.py) and fed next to the bytes, so DALI only applies it: ``fn.decoders.image_slice`` decodes just
the window (normalised anchor/shape), ``fn.resize`` scales it to the training size and
``fn.crop_mirror_normalize(mirror=...)`` flips. No DALI RNG is used, so the same sample gets the same crop on
whichever rank of whichever world size. Without augmentation (and for validation) images are resized so
the shorter side is ``val_resize`` and center-cropped to ``image_size``.

The pipeline's batch size is the largest micro-batch the trainer will feed (``max_batch``), so a
``microBatchSize`` above DALI's usual 256 works.

Two on-disk layouts: a folder tree ``<class>/<file>.jpg`` (class index = sorted folder order) and a
webdataset-style ``.tar`` (``<key>.jpg`` + ``<key>.cls``), read by offset from an mmap without unpacking.

A sample that does not decode fails the pipeline with an error that names no sample ("nvImageCodec failure:
'#3'", then "Current pipeline object is no longer valid"): the last line of the trainer's log, which the
operator shows as the cause (issue 15), would say nothing useful. So on a pipeline error the samples fed
since the last good batch are decoded once more with Pillow and the first that fails is named
(``CorruptImageError``: its file, or tar member, and sample id).
"""

from __future__ import annotations

import io
import mmap
import tarfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from etj_trainer.data.specs import IMAGE_SUFFIXES
from etj_trainer.data.stream import MEAN, STD, Augmenter, StreamItem, unpack


class CorruptImageError(ValueError):
    """A sample's encoded bytes do not decode (a truncated or corrupt JPEG, say)."""


@dataclass
class SampleTable:
    """Where each sample's encoded bytes live; the row number is the sample id the sampler uses."""

    labels: np.ndarray
    paths: list[Path] | None = None  # folder layout
    tar_path: Path | None = None  # packed layout
    offsets: np.ndarray | None = None
    sizes: np.ndarray | None = None
    names: list[str] | None = None  # packed layout: each sample's member name

    def where(self, i: int) -> str:
        """Where sample ``i`` lives, for an error message."""
        if self.paths is not None:
            return str(self.paths[i])
        return f"{self.tar_path}:{self.names[i] if self.names else i}"

    def __len__(self) -> int:
        return len(self.labels)


def list_folder_samples(root: Path) -> SampleTable:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise FileNotFoundError(f"{root}: expected one sub-folder per class")
    paths, labels = [], []
    for ci, c in enumerate(classes):
        for f in sorted((root / c).iterdir()):
            if f.suffix.lower() in IMAGE_SUFFIXES:
                paths.append(f)
                labels.append(ci)
    return SampleTable(labels=np.asarray(labels, dtype=np.int64), paths=paths)


def list_tar_samples(path: Path) -> SampleTable:
    images: dict[str, tuple[int, int]] = {}
    members: dict[str, str] = {}
    labels: dict[str, int] = {}
    with tarfile.open(path, "r:") as tar:
        for m in tar:
            if not m.isfile():
                continue
            key, _, ext = m.name.rpartition(".")
            if "." + ext.lower() in IMAGE_SUFFIXES:
                images[key] = (m.offset_data, m.size)
                members[key] = m.name
            elif ext == "cls":
                f = tar.extractfile(m)
                assert f is not None
                labels[key] = int(f.read().decode().strip())
    keys = sorted(images)
    missing = [k for k in keys if k not in labels]
    if missing:
        raise ValueError(f"{path}: {len(missing)} images without a .cls label, e.g. {missing[:3]}")
    return SampleTable(
        labels=np.asarray([labels[k] for k in keys], dtype=np.int64),
        tar_path=path,
        offsets=np.asarray([images[k][0] for k in keys], dtype=np.int64),
        sizes=np.asarray([images[k][1] for k in keys], dtype=np.int64),
        names=[members[k] for k in keys],
    )


class DaliImageSource:
    def __init__(
        self,
        table: SampleTable,
        image_size: int,
        dtype: torch.dtype = torch.float32,
        threads: int = 2,
        max_batch: int = 256,
        use_gpu: bool | None = None,
        augment: Augmenter | None = None,
        val_resize: int = 0,
    ) -> None:
        self.table = table
        self.augment = augment or Augmenter()
        self.val_resize = val_resize or image_size
        self.num_samples = len(table)
        self.image_size = image_size
        self.sample_shape: tuple[int, ...] = (3, image_size, image_size)
        self.dtype = dtype
        self.threads = threads
        self.max_batch = max_batch
        self.use_gpu = torch.cuda.is_available() if use_gpu is None else use_gpu
        self._mm: mmap.mmap | None = None
        # the sample ids fed to the pipeline and not yet returned in a batch (prefetch runs ahead)
        self._in_flight: deque[list[int]] = deque()
        if table.tar_path is not None:
            with open(table.tar_path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def _encoded(self, i: int) -> np.ndarray:
        if self._mm is not None:
            assert self.table.offsets is not None and self.table.sizes is not None
            off, size = int(self.table.offsets[i]), int(self.table.sizes[i])
            return np.frombuffer(self._mm[off : off + size], dtype=np.uint8)
        assert self.table.paths is not None
        return np.fromfile(self.table.paths[i], dtype=np.uint8)

    def _feed(self, index_stream: Iterator[StreamItem]) -> Iterator[tuple[list[np.ndarray], ...]]:
        for item in index_stream:
            m = unpack(item)
            idx = m.ids
            if len(idx) > self.max_batch:
                raise ValueError(
                    f"micro-batch of {len(idx)} exceeds the pipeline's max batch {self.max_batch}"
                )
            self._in_flight.append([int(i) for i in idx])
            jpegs = [self._encoded(int(i)) for i in idx]
            labels = [np.asarray([self.table.labels[int(i)]], dtype=np.int64) for i in idx]
            if not self.augment.on:
                yield jpegs, labels
                continue
            c = self.augment.crops(m)
            yield (
                jpegs,
                labels,
                list(c.anchor),
                list(c.shape),
                [np.asarray(f, dtype=np.int32) for f in c.flip],
            )

    def build_pipeline(self, index_stream: Iterator[StreamItem]) -> Any:
        import importlib

        # DALI's type stubs do not cover its generated operator/enum modules; treat them as dynamic.
        fn: Any = importlib.import_module("nvidia.dali.fn")
        types: Any = importlib.import_module("nvidia.dali.types")
        pipeline_def: Any = importlib.import_module("nvidia.dali").pipeline_def

        device_id = torch.cuda.current_device() if self.use_gpu else None
        size = self.image_size
        decode_on = "mixed" if self.use_gpu else "cpu"
        norm = {
            "dtype": types.FLOAT,
            "output_layout": "CHW",
            "mean": [MEAN * 255] * 3,
            "std": [STD * 255] * 3,
        }

        @pipeline_def(  # type: ignore[untyped-decorator]  # DALI is untyped (imported as Any above)
            batch_size=self.max_batch,
            num_threads=self.threads,
            device_id=device_id,
            prefetch_queue_depth=2,
            exec_dynamic=True,
        )
        def pipe() -> tuple[Any, Any]:
            if self.augment.on:
                jpegs, labels, anchor, shape, flip = fn.external_source(
                    source=self._feed(index_stream),
                    num_outputs=5,
                    batch=True,
                    dtype=[types.UINT8, types.INT64, types.FLOAT, types.FLOAT, types.INT32],
                )
                images = fn.decoders.image_slice(
                    jpegs,
                    anchor,
                    shape,
                    device=decode_on,
                    output_type=types.RGB,
                    normalized_anchor=True,
                    normalized_shape=True,
                    axis_names="WH",
                )
                images = fn.resize(images, resize_x=size, resize_y=size)
                return fn.crop_mirror_normalize(images, mirror=flip, **norm), labels
            jpegs, labels = fn.external_source(
                source=self._feed(index_stream), num_outputs=2, batch=True, dtype=[types.UINT8, types.INT64]
            )
            images = fn.decoders.image(jpegs, device=decode_on, output_type=types.RGB)
            images = fn.resize(images, resize_shorter=self.val_resize)
            return fn.crop_mirror_normalize(images, crop=(size, size), **norm), labels

        p = pipe()
        p.build()
        return p

    def batches(self, index_stream: Iterator[StreamItem]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        self._in_flight.clear()
        p = self.build_pipeline(index_stream)
        it = None
        try:
            while True:
                try:
                    if it is None:  # its constructor already runs the pipeline (prefetch)
                        it = DALIGenericIterator([p], ["images", "labels"], auto_reset=False)
                    out = next(it)
                except StopIteration:
                    return
                except RuntimeError as e:
                    self._name_the_corrupt_sample(e)
                    raise
                if self._in_flight:
                    self._in_flight.popleft()
                d = out[0]
                yield d["images"].to(self.dtype), d["labels"].reshape(-1)
        finally:
            del it, p

    def _name_the_corrupt_sample(self, error: RuntimeError) -> None:
        """Raise ``CorruptImageError`` for the first in-flight sample that Pillow cannot decode either."""
        from PIL import Image

        for ids in self._in_flight:
            for i in ids:
                try:
                    with Image.open(io.BytesIO(self._encoded(i).tobytes())) as img:
                        img.load()
                except (OSError, SyntaxError, ValueError) as bad:
                    raise CorruptImageError(
                        f"sample {i} ({self.table.where(i)}) does not decode ({type(bad).__name__})"
                    ) from error

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None

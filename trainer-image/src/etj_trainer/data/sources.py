"""Batch sources: what turns a stream of sample-index batches into ``(images, labels)`` tensors.

The trainer hands a source the exact, lookahead-able stream of micro-batch indices that the elastic sampler
assigns to this rank. The world size is fixed for one stream: the trainer derives a new stream for every
membership of the world (a join restarts the workers; a graceful leave re-forms the world in place,
resize/), so a source may prefetch freely and a resize re-shards it simply through the new stream.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from etj_contract import env as etj_env
from etj_trainer.data.augment import apply_to_tensors
from etj_trainer.data.stream import MEAN, STD, Augmenter, BatchSource, StreamItem, unpack


class TensorSource:
    """In-memory samples: exact and deterministic, used by equivalence tests and benchmarks.

    ``convert`` turns a stored batch into model input (e.g. uint8 -> normalised float, so a large data set
    is held compactly); augmentation is applied after it, per sample, as on the DALI path.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        augment: Augmenter | None = None,
        convert: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.images = images
        self.labels = labels
        self.num_samples = len(labels)
        self.augment = augment or Augmenter()
        self.convert = convert
        self.sample_shape: tuple[int, ...] = tuple(self._convert(images[:1]).shape[1:])

    def _convert(self, x: torch.Tensor) -> torch.Tensor:
        return self.convert(x) if self.convert is not None else x

    def batches(self, index_stream: Iterator[StreamItem]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for item in index_stream:
            m = unpack(item)
            t = torch.from_numpy(np.ascontiguousarray(m.ids))
            x = self._convert(self.images[t])
            if self.augment.on:
                x = apply_to_tensors(x, self.augment.crops(m))
            yield x, self.labels[t]

    def close(self) -> None:
        pass


def grey_to_input(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """uint8 ``(n, H, W)`` grey images -> normalised 3-channel float, like the decoded JPEGs."""

    def convert(x: torch.Tensor) -> torch.Tensor:
        return x.to(dtype).div(255.0).sub(MEAN).div(STD).unsqueeze(1).expand(-1, 3, -1, -1).contiguous()

    return convert


def digits_tensor_source(
    split: str, dtype: torch.dtype = torch.float32, augment: Augmenter | None = None
) -> TensorSource:
    from etj_trainer.data.digits import digits_split

    images, labels = digits_split()[split]
    x = grey_to_input(dtype)(torch.from_numpy(images))
    return TensorSource(x, torch.from_numpy(labels), augment)


def fashion_mnist_tensor_source(
    split: str, dtype: torch.dtype = torch.float32, augment: Augmenter | None = None
) -> TensorSource:
    """Fashion-MNIST from the Debian package's idx files, held as uint8 and converted per batch."""
    from etj_trainer.data.fashion_mnist import load_split

    images, labels = load_split(split)
    return TensorSource(
        torch.from_numpy(images), torch.from_numpy(labels), augment, convert=grey_to_input(dtype)
    )


def synthetic_images(
    n: int, image_size: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` seeded random ``3 x S x S`` images and labels in 0..9 (benchmarks: the model's speed, no I/O)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, image_size, image_size, generator=g, dtype=torch.float32).to(dtype)
    return images, torch.randint(0, 10, (n,), generator=g)


def synthetic_tensor_source(
    split: str, n: int, image_size: int, dtype: torch.dtype = torch.float32, augment: Augmenter | None = None
) -> TensorSource:
    return TensorSource(*synthetic_images(n, image_size, 0 if split == "train" else 1, dtype), augment)


def digits_cache_dir() -> Path:
    return etj_env.DATA_CACHE.get(os.environ, Path("/tmp/etj-data")) / "digits"


def ensure_digits(image_size: int = 32) -> Path:
    """Write the digits JPEGs once per machine (atomic via a temp dir + rename)."""
    from etj_trainer.data.digits import make_digits

    out = digits_cache_dir()
    if not (out / "val.tar").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".digits-{os.getpid()}")
        make_digits(tmp, image_size=image_size)
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp.rename(out)
        except OSError:  # another process won the race; its copy is identical
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return out


def open_source(
    spec: str,
    split: str,
    image_size: int,
    dtype: torch.dtype,
    threads: int = 2,
    *,
    augment: Augmenter | None = None,
    max_batch: int = 256,
    val_resize: int = 0,
) -> BatchSource:
    """``digits-tensor`` | ``fashion-mnist-tensor`` | ``synthetic-tensor[:N]`` (N random images of
    ``image_size``, benchmarks) | ``digits`` | a folder tree (``<class>/<file>.jpg``,
    or its parent with ``train``/``val``) | a webdataset-style ``.tar``.

    ``augment`` applies to this split (pass it for training only); ``max_batch`` is the largest micro-batch
    the stream will ask for; ``val_resize`` is the shorter side images are resized to before the center
    crop when not augmenting (0: ``image_size``).
    """
    if spec == "digits-tensor":
        return digits_tensor_source(split, dtype, augment)
    if spec.startswith("synthetic-tensor"):
        _, _, n = spec.partition(":")
        return synthetic_tensor_source(split, int(n or 1024), image_size, dtype, augment)
    if spec == "fashion-mnist-tensor":
        return fashion_mnist_tensor_source(split, dtype, augment)
    if spec == "digits":
        path = ensure_digits(image_size) / split
    else:
        path = Path(spec)
        if path.is_dir() and (path / split).is_dir():
            path = path / split
        elif path.is_dir() and (path.parent / f"{split}.tar").exists() and split == "val":
            path = path.parent / "val.tar"
    from etj_trainer.data.dali_input import DaliImageSource, list_folder_samples, list_tar_samples

    samples = list_tar_samples(path) if path.suffix == ".tar" else list_folder_samples(path)
    return DaliImageSource(
        samples,
        image_size=image_size,
        dtype=dtype,
        threads=threads,
        max_batch=max_batch,
        augment=augment,
        val_resize=val_resize,
    )

"""Batch sources: what turns a stream of sample-index batches into ``(images, labels)`` tensors.

The trainer hands a source the exact, lookahead-able stream of micro-batch indices that the elastic sampler
assigns to this rank. The world size is fixed for one stream: the trainer derives a new stream for every
membership of the world (a join restarts the workers; a graceful leave re-forms the world in place,
regroup.py), so a source may prefetch freely and a resize re-shards it simply through the new stream.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from etj_contract import env as etj_env

MEAN, STD = 0.5, 0.25  # digits are grey scale; the same constants are used by the DALI path


class BatchSource(Protocol):
    num_samples: int
    sample_shape: tuple[int, ...]  # C, H, W: lets a rank with an empty share build an empty batch

    def batches(self, index_stream: Iterator[np.ndarray]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def close(self) -> None: ...


class TensorSource:
    """In-memory samples: exact and deterministic, used by equivalence tests and benchmarks."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images = images
        self.labels = labels
        self.num_samples = len(labels)
        self.sample_shape: tuple[int, ...] = tuple(images.shape[1:])

    def batches(self, index_stream: Iterator[np.ndarray]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for idx in index_stream:
            t = torch.from_numpy(idx)
            yield self.images[t], self.labels[t]

    def close(self) -> None:
        pass


def digits_tensor_source(split: str, dtype: torch.dtype = torch.float32) -> TensorSource:
    from etj_trainer.digits import digits_split

    images, labels = digits_split()[split]
    x = torch.from_numpy(images).to(dtype).div(255.0).sub(MEAN).div(STD)
    x = x.unsqueeze(1).expand(-1, 3, -1, -1).contiguous()  # 3 channels, like the decoded JPEGs
    return TensorSource(x, torch.from_numpy(labels))


def digits_cache_dir() -> Path:
    return etj_env.DATA_CACHE.get(os.environ, Path("/tmp/etj-data")) / "digits"


def ensure_digits(image_size: int = 32) -> Path:
    """Write the digits JPEGs once per machine (atomic via a temp dir + rename)."""
    from etj_trainer.digits import make_digits

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


def open_source(spec: str, split: str, image_size: int, dtype: torch.dtype, threads: int = 2) -> BatchSource:
    """``digits-tensor`` | ``digits`` | a folder tree (``<class>/<file>.jpg``, or its parent with
    ``train``/``val``) | a webdataset-style ``.tar``."""
    if spec == "digits-tensor":
        return digits_tensor_source(split, dtype)
    if spec == "digits":
        path = ensure_digits(image_size) / split
    else:
        path = Path(spec)
        if path.is_dir() and (path / split).is_dir():
            path = path / split
        elif path.is_dir() and (path.parent / f"{split}.tar").exists() and split == "val":
            path = path.parent / "val.tar"
    from etj_trainer.dali_input import DaliImageSource, list_folder_samples, list_tar_samples

    samples = list_tar_samples(path) if path.suffix == ".tar" else list_folder_samples(path)
    return DaliImageSource(samples, image_size=image_size, dtype=dtype, threads=threads)

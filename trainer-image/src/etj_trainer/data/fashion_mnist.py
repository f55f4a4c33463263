"""Fashion-MNIST (Xiao et al. 2017; 60,000 + 10,000 28x28 grey images, 10 classes) from Debian's package.

``dataset-fashion-mnist`` ships the original idx files under /usr/share/datasets/fashion-mnist; nothing is
downloaded at run time. ``prepare(DIR)`` writes ``DIR/train.tar`` and ``DIR/val.tar`` in the trainer's
packed format (JPEG + ``.cls``; the official test split is the validation set); ``load_split`` gives the
raw arrays for the in-memory ``fashion-mnist-tensor`` source.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from etj_trainer.data.packed import grey_jpeg, write_tar

PACKAGE = "dataset-fashion-mnist"
INSTALL = f"apt-get update && apt-get install -y {PACKAGE}"
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "val": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


class MissingDataset(RuntimeError):
    pass


def data_dir() -> Path:
    return Path(os.environ.get("ETJ_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))


def available() -> bool:
    return all((data_dir() / f).is_file() for pair in FILES.values() for f in pair)


def _idx(path: Path) -> np.ndarray:
    """An idx file (big-endian magic: 0x0000, type 0x08 = uint8, ndim; then the dims)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[:3] != b"\0\0\x08":
        raise ValueError(f"{path}: not an unsigned-byte idx file")
    ndim = raw[3]
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims).copy()  # writable


def load_split(split: str) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [N, 28, 28], labels int64 [N])`` for ``train`` or ``val``."""
    if not available():
        raise MissingDataset(f"Fashion-MNIST not found in {data_dir()}: install it with `{INSTALL}`")
    images, labels = FILES[split]
    return _idx(data_dir() / images), _idx(data_dir() / labels).astype(np.int64)


def prepare(out_dir: Path, image_size: int | None = None, limit: int = 0) -> dict[str, int]:
    """Write ``out_dir/{train,val}.tar``; returns the sample count of each (``limit``: first N per split)."""
    counts = {}
    for split in FILES:
        images, labels = load_split(split)
        if limit > 0:
            images, labels = images[:limit], labels[:limit]
        counts[split] = write_tar(
            Path(out_dir) / f"{split}.tar",
            (
                (f"{i:05d}", grey_jpeg(img, image_size), int(y))
                for i, (img, y) in enumerate(zip(images, labels, strict=True))
            ),
        )
    return counts

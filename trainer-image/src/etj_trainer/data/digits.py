"""The test dataset: scikit-learn's digits (1,797 real 8x8 scans), written out as JPEG files.

``make_digits(out)`` writes ``out/{train,val}/<class>/<id>.jpg`` (a folder tree) and ``out/train.tar`` /
``out/val.tar`` (webdataset-style packed shards: ``<id>.jpg`` + ``<id>.cls``). The train/val split is fixed
(seeded permutation, 80/20) so every run and every test sees the same split.
"""

from __future__ import annotations

import os
import tarfile
import zipfile
from pathlib import Path

import numpy as np

from etj_contract import env as etj_env
from etj_trainer.data.packed import add_sample, grey_jpeg

VAL_FRACTION = 0.2
SPLIT_SEED = 1234


def digits_split() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train": (images uint8 [N,8,8] 0..255, labels [N]), "val": ...}``, fixed split.

    Cached as one .npz under ``$ETJ_DATA_CACHE`` (default /tmp/etj-data): importing scikit-learn costs a
    worker about a second at every restart, the cached arrays a few milliseconds.
    """
    cache = etj_env.DATA_CACHE.get(os.environ, Path("/tmp/etj-data")) / f"digits-split-{SPLIT_SEED}.npz"
    try:
        with np.load(cache) as z:
            return {s: (z[f"{s}_x"], z[f"{s}_y"]) for s in ("train", "val")}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        pass  # not cached yet (or a torn file): build it
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.clip(d.images * (255.0 / 16.0), 0, 255).astype(np.uint8)
    labels = d.target.astype(np.int64)
    perm = np.random.default_rng(SPLIT_SEED).permutation(len(labels))
    n_val = int(len(labels) * VAL_FRACTION)
    val, train = perm[:n_val], perm[n_val:]
    out = {"train": (images[train], labels[train]), "val": (images[val], labels[val])}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, **{f"{s}_{k}": a for s, (x, y) in out.items() for k, a in (("x", x), ("y", y))})
        os.replace(tmp, cache)  # atomic: concurrent workers never read a half-written cache
    except OSError:
        pass  # a read-only cache dir only costs the slow path
    return out


def make_digits(out_dir: Path, image_size: int = 32) -> dict[str, int]:
    """Write the digits dataset as JPEG folder trees and tar shards; returns sample counts."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, (images, labels) in digits_split().items():
        root = out_dir / split
        with tarfile.open(out_dir / f"{split}.tar", "w") as tar:
            for i, (img, label) in enumerate(zip(images, labels, strict=True)):
                # Upscale before JPEG: 8x8 blocks at 8x8 pixels would be destroyed by chroma/quantisation.
                data = grey_jpeg(img, image_size)
                path = root / str(int(label)) / f"{i:05d}.jpg"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                add_sample(tar, f"{i:05d}", data, int(label))
        counts[split] = len(labels)
    return counts

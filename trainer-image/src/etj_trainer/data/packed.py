"""The trainer's packed format (webdataset-style ``.tar``: ``<key>.jpg`` + ``<key>.cls``), atomically."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np


def grey_jpeg(img: np.ndarray, size: int | None = None, quality: int = 95) -> bytes:
    """A uint8 grey image as an RGB JPEG (DALI decodes RGB), optionally resized to ``size`` first."""
    from PIL import Image

    pil = Image.fromarray(img, mode="L")
    if size is not None and pil.size != (size, size):
        pil = pil.resize((size, size), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    pil.convert("RGB").save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def add_sample(tar: tarfile.TarFile, key: str, jpeg: bytes, label: int) -> None:
    for name, payload in ((f"{key}.jpg", jpeg), (f"{key}.cls", str(int(label)).encode())):
        info = tarfile.TarInfo(name)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))


def write_tar(path: Path, samples: Iterable[tuple[str, bytes, int]]) -> int:
    """Write ``(key, jpeg, label)`` samples to ``path`` via a temp file + rename; returns the count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    n = 0
    with tarfile.open(tmp, "w") as tar:
        for key, jpeg, label in samples:
            add_sample(tar, key, jpeg, label)
            n += 1
    os.replace(tmp, path)
    return n

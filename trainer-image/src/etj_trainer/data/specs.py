"""What a data spec names, checked before anything opens it (standard library only: the agent checks its
job's inputs before it imports torch, agent/preflight.py). ``sources.open_source`` opens them."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

BUILT_IN = ("digits", "digits-tensor", "fashion-mnist-tensor", "synthetic-tensor[:N]")


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")  # what data/dali_input.py takes for an image


def data_problem(spec: str, split: str = "train") -> str | None:
    """What is wrong with a data spec before anything opens it (None: it looks usable): no data at all,
    a path that does not exist or cannot be read, or one that holds no image (issue 37: empty class
    folders or an empty tar passed here and crash-looped on "dataset_size must be positive").
    ``split``: the sub-folder ``open_source`` prefers when the folder has one."""
    if not spec:
        return f"no data set named: one of {', '.join(BUILT_IN)}, a folder tree or a .tar"
    if spec in ("digits", "digits-tensor", "fashion-mnist-tensor"):
        return None
    if spec.startswith("synthetic-tensor"):
        n = spec.partition(":")[2]
        return None if not n or (n.isdigit() and int(n) > 0) else f"{spec!r}: N must be a positive number"
    path = Path(spec)
    if not path.exists():
        return f"{spec}: no such file or directory (nor one of {', '.join(BUILT_IN)})"
    if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
        return f"{spec}: not readable by this user"
    if path.is_file() and path.suffix != ".tar":
        return f"{spec}: a file that is not a .tar"
    return _tar_problem(path) if path.is_file() else _folder_problem(path, split)


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES


def _tar_problem(path: Path) -> str | None:
    """A tar with at least one image member (it stops at the first: a large tar is not read through)."""
    try:
        with tarfile.open(path, "r:") as tar:
            if any(m.isfile() and _is_image(m.name) for m in tar):
                return None
    except (tarfile.TarError, OSError) as e:
        return f"{path}: not a readable tar ({e})"
    return f"{path}: a tar with no image members ({', '.join(IMAGE_SUFFIXES)})"


def _folder_problem(path: Path, split: str) -> str | None:
    """A folder tree ``<class>/<image>`` (or its parent, with ``<split>/``) with at least one image."""
    root = path / split if (path / split).is_dir() else path
    try:
        classes = [d for d in root.iterdir() if d.is_dir()]
        if not classes:
            return f"{root}: no class folders (expected <class>/<image> under it)"
        if any(f.is_file() and _is_image(f.name) for d in classes for f in d.iterdir()):
            return None
    except OSError as e:
        return f"{root}: not readable ({e})"
    return f"{root}: no images ({', '.join(IMAGE_SUFFIXES)}) in its {len(classes)} class folders"

"""What a data spec names, checked before anything opens it (standard library only: the agent checks its
job's inputs before it imports torch, agent/preflight.py). ``sources.open_source`` opens them."""

from __future__ import annotations

import os
from pathlib import Path

BUILT_IN = ("digits", "digits-tensor", "fashion-mnist-tensor", "synthetic-tensor[:N]")


def data_problem(spec: str) -> str | None:
    """What is wrong with a data spec before anything opens it (None: it looks usable): no data at all,
    or a path that does not exist or cannot be read. ``open_source`` reads the samples themselves."""
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
    return None

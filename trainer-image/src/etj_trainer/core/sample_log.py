"""Per-rank log of the sample ids each step trained on, and the exactly-once checker for it.

A step can be logged twice when a process dies after the step but before its checkpoint and the step is
redone after restore; every line carries the incarnation (a world-wide id broadcast by rank 0 at start-up),
and for each step the checker keeps only the entries of the latest incarnation that ran it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np


class SampleLog:
    def __init__(self, directory: Path, rank: int, incarnation: float) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.incarnation = incarnation
        self.rank = rank
        self._f = open(directory / f"samples-{incarnation:.6f}-rank{rank}.jsonl", "a", buffering=1)  # noqa: SIM115

    def write(self, epoch: int, step: int, world: int, ids: np.ndarray, lr: float | None = None) -> None:
        rec: dict[str, Any] = {
            "inc": self.incarnation,
            "epoch": epoch,
            "step": step,
            "rank": self.rank,
            "world": world,
            "ids": [int(i) for i in ids],
        }
        if lr is not None:
            rec["lr"] = lr  # the LR the step trained with (schedule x Dynamic SGD multiplier)
        self._f.write(json.dumps(rec) + "\n")


def _latest_per_step(directory: Path) -> dict[int, list[dict[str, Any]]]:
    """Each step's records from the latest incarnation that ran it (a redone step counts once)."""
    by_step: dict[int, dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for f in sorted(directory.glob("samples-*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                by_step[rec["step"]][rec["inc"]].append(rec)
    return {step: runs[max(runs)] for step, runs in by_step.items()}


def consumed_per_epoch(directory: Path) -> dict[int, list[int]]:
    """Sample ids per epoch, counting each step once (its latest incarnation, all of that run's ranks)."""
    out: dict[int, list[int]] = defaultdict(list)
    for recs in _latest_per_step(directory).values():
        for rec in recs:
            out[rec["epoch"]].extend(rec["ids"])
    return dict(out)


def lr_per_step(directory: Path) -> dict[int, float]:
    """The LR each step trained with (every rank logs the same value; rank order does not matter)."""
    return {step: float(recs[0]["lr"]) for step, recs in sorted(_latest_per_step(directory).items())}

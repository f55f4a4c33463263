"""Spot capacity traces → capacity over time (pure).

A trace (`skypilot-org/spot-traces`, the NSDI'24 "Can't Be Late" data set; format in the README of
``../shared/spot-traces``) is ``{"metadata": {"gap_seconds": 300}, "data": [n0, n1, ...]}``: how many spot
instances of a request were running at each tick. Here it becomes a step function of spot node counts,
scaled to the size of the bed (4 local process nodes, or 16 modelled 8-GPU nodes) and placed on a
(compressed) clock.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRACES_ENV = "ETJ_SPOT_TRACES"


@dataclass(frozen=True)
class Trace:
    name: str
    gap_s: float  # seconds between two data points
    counts: tuple[int, ...]  # spot instances running at each tick

    @property
    def peak(self) -> int:
        return max(self.counts, default=0)

    @property
    def duration_s(self) -> float:
        return self.gap_s * len(self.counts)

    def count_at(self, t_s: float) -> int:
        """The count in force ``t_s`` trace-seconds after tick 0 (the trace wraps around at its end)."""
        return self.counts[int(t_s // self.gap_s) % len(self.counts)]

    def window(self, start: int, length: int | None = None) -> Trace:
        """The ticks from ``start`` on (wrapping), ``length`` of them (default: all)."""
        n = len(self.counts)
        length = n if length is None else length
        counts = tuple(self.counts[(start + i) % n] for i in range(length))
        return Trace(f"{self.name}@{start}", self.gap_s, counts)


def parse_trace(name: str, doc: dict[str, object]) -> Trace:
    meta = doc.get("metadata") or {}
    gap = float(meta.get("gap_seconds", 300)) if isinstance(meta, dict) else 300.0
    data = doc.get("data")
    if not isinstance(data, list) or not data:
        raise ValueError(f"{name}: no 'data' list")
    counts = tuple(int(x) for x in data)
    if any(c < 0 for c in counts) or gap <= 0:
        raise ValueError(f"{name}: negative counts or gap")
    return Trace(name, gap, counts)


def load_trace(path: Path) -> Trace:
    return parse_trace(path.stem, json.loads(path.read_text()))


def traces_dir(explicit: Path | None = None) -> Path:
    """Where the traces are: the argument, ``$ETJ_SPOT_TRACES``, or ``../shared/spot-traces`` beside the
    repository (where CI puts them, next to the clone)."""
    for candidate in (explicit, os.environ.get(TRACES_ENV), REPO.parent / "shared" / "spot-traces"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    raise FileNotFoundError(
        f"no spot traces: pass a directory, set {TRACES_ENV}, or put them in "
        f"{REPO.parent / 'shared' / 'spot-traces'}"
    )


def all_traces(directory: Path | None = None) -> list[Trace]:
    return [load_trace(p) for p in sorted(traces_dir(directory).glob("*.json"))]


def resolve_trace(arg: str, directory: Path | None = None) -> Trace:
    """A trace file path, or a file name / stem inside the traces directory."""
    path = Path(arg)
    if path.is_file():
        return load_trace(path)
    base = traces_dir(directory)
    for candidate in (base / arg, base / f"{arg}.json"):
        if candidate.is_file():
            return load_trace(candidate)
    raise FileNotFoundError(f"no trace {arg!r} (looked in {base})")


def scale_count(count: int, trace_peak: int, nodes: int) -> int:
    """``count`` of a ``trace_peak``-instance request as a share of ``nodes`` nodes, rounded half up (so a
    full request is every node and none is none)."""
    if trace_peak <= 0:
        return 0
    return min(nodes, math.floor(count * nodes / trace_peak + 0.5))


def scaled(trace: Trace, nodes: int, peak: int | None = None) -> Trace:
    """The trace with its counts mapped onto ``nodes`` nodes (``peak``: the request size, default the
    trace's own maximum: 16 for the availability traces, 4 for the preemption ones)."""
    top = peak if peak is not None else trace.peak
    return Trace(trace.name, trace.gap_s, tuple(scale_count(c, top, nodes) for c in trace.counts))


def changes(counts: Sequence[int]) -> int:
    return sum(1 for a, b in itertools.pairwise(counts) if a != b)


def busiest_window(counts: Sequence[int], length: int) -> int:
    """The start tick of the ``length``-tick window with the most capacity changes (the first such one):
    where a short replay sees the most interruptions and returns."""
    if length >= len(counts):
        return 0
    diffs = [1 if a != b else 0 for a, b in itertools.pairwise(counts)]
    current = sum(diffs[: length - 1])
    best, best_at = current, 0
    for start in range(1, len(counts) - length + 1):
        current += diffs[start + length - 2] - diffs[start - 1]
        if current > best:
            best, best_at = current, start
    return best_at


@dataclass(frozen=True)
class Step:
    """From ``t_s`` (seconds on the replay's clock) on, ``spot`` spot nodes are offered."""

    t_s: float
    spot: int


def schedule(trace: Trace, time_scale: float, horizon_s: float) -> Iterator[Step]:
    """The trace on a clock running ``time_scale`` times faster, as the steps where the count changes, from
    0 up to ``horizon_s`` (wrapping around the trace's end)."""
    tick_s = trace.gap_s / time_scale
    previous: int | None = None
    i = 0
    while i * tick_s < horizon_s:
        count = trace.counts[i % len(trace.counts)]
        if count != previous:
            yield Step(i * tick_s, count)
            previous = count
        i += 1

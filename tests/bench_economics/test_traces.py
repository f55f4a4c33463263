"""Trace parsing and the capacity step function (bench/economics/traces.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.economics.traces import (
    Step,
    Trace,
    busiest_window,
    changes,
    parse_trace,
    resolve_trace,
    scale_count,
    scaled,
    schedule,
    traces_dir,
)


def test_parse_reads_gap_and_counts() -> None:
    trace = parse_trace("t", {"metadata": {"gap_seconds": 60}, "data": [0, 3, 4]})
    assert trace == Trace("t", 60.0, (0, 3, 4))
    assert trace.peak == 4 and trace.duration_s == 180


@pytest.mark.parametrize(
    "doc",
    [
        {"metadata": {"gap_seconds": 300}, "data": []},
        {"metadata": {"gap_seconds": 300}},
        {"metadata": {"gap_seconds": 300}, "data": [1, -1]},
        {"metadata": {"gap_seconds": 0}, "data": [1]},
    ],
    ids=["empty", "no-data", "negative", "zero-gap"],
)
def test_parse_rejects_broken_traces(doc: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        parse_trace("bad", doc)


# (count, trace peak, nodes) → nodes in service
SCALE_CASES = {
    "full request is every node": (16, 16, 3, 3),
    "none is none": (0, 16, 3, 0),
    "half rounds half up": (8, 16, 3, 2),  # 1.5 → 2
    "a sixteenth of 3 rounds to none": (1, 16, 3, 0),
    "3 of 4 on 3 nodes": (3, 4, 3, 2),  # 2.25 → 2
    "1 of 4 on 3 nodes": (1, 4, 3, 1),  # 0.75 → 1
    "same size is identity": (3, 4, 4, 3),
    "above the peak is capped": (20, 16, 3, 3),
    "4-node trace onto 16 nodes": (1, 4, 16, 4),
}


@pytest.mark.parametrize("case", SCALE_CASES)
def test_scale_count(case: str) -> None:
    count, peak, nodes, want = SCALE_CASES[case]
    assert scale_count(count, peak, nodes) == want


def test_scaled_uses_the_trace_peak_unless_given() -> None:
    trace = Trace("t", 300, (0, 2, 4))
    assert scaled(trace, 2).counts == (0, 1, 2)
    assert scaled(trace, 2, peak=8).counts == (0, 1, 1)  # 0.5 → 1, 1 → 1


BUSIEST_CASES = {
    "flat trace starts at 0": ([4, 4, 4, 4, 4], 3, 0),
    "changes at the end": ([4, 4, 4, 4, 1, 4], 3, 3),
    "first of two equal windows": ([1, 2, 2, 2, 1, 2], 2, 0),
    "window longer than the trace": ([1, 2, 1], 10, 0),
    "middle burst": ([0, 0, 0, 1, 0, 1, 1, 1, 1], 4, 2),
}


@pytest.mark.parametrize("case", BUSIEST_CASES)
def test_busiest_window(case: str) -> None:
    counts, length, want = BUSIEST_CASES[case]
    got = busiest_window(counts, length)
    assert got == want
    # and it really is the maximum, by brute force
    if length < len(counts):
        best = max(changes(counts[s : s + length]) for s in range(len(counts) - length + 1))
        assert changes(counts[got : got + length]) == best


def test_schedule_compresses_time_and_keeps_only_changes() -> None:
    trace = Trace("t", 300, (2, 2, 0, 3))
    # x60: a tick is 5 s; 30 s covers 6 ticks, wrapping after the 4th
    assert list(schedule(trace, 60, 30)) == [Step(0, 2), Step(10, 0), Step(15, 3), Step(20, 2)]


def test_window_wraps_around() -> None:
    trace = Trace("t", 300, (1, 2, 3))
    assert trace.window(2, 4).counts == (3, 1, 2, 3)
    assert trace.count_at(300 * 4) == 2


def test_traces_are_found_beside_the_repository_or_by_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine.json").write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [1, 0]}))
    assert traces_dir(tmp_path) == tmp_path
    monkeypatch.setenv("ETJ_SPOT_TRACES", str(tmp_path))
    assert resolve_trace("mine").counts == (1, 0)
    assert resolve_trace(str(tmp_path / "mine.json")).name == "mine"
    with pytest.raises(FileNotFoundError):
        resolve_trace("absent")


def test_the_shared_traces_parse() -> None:
    try:
        base = traces_dir()
    except FileNotFoundError:
        pytest.skip("no ../shared/spot-traces beside this checkout")
    traces = [resolve_trace(p.name) for p in sorted(base.glob("*.json"))]
    assert traces, base
    for trace in traces:
        assert trace.gap_s == 300 and len(trace.counts) > 1000 and trace.peak in (4, 16), trace.name

"""Cost and goodput from observations (bench/economics/accounting.py)."""

from __future__ import annotations

import pytest
from bench.economics.accounting import (
    INFRA_RECOVERY,
    OTHER,
    PROGRAM_STARTUP,
    SCALE_UP,
    SLICE_DOWN,
    TRAINING_PREP,
    WASTED,
    NodeSpan,
    Poll,
    Prices,
    cost,
    goodput,
    node_seconds,
)


def test_node_seconds_clip_to_the_job() -> None:
    spans = [
        NodeSpan("od", "on-demand", -5.0),  # made before submission: billed from 0
        NodeSpan("s1", "spot", 10.0, 30.0),
        NodeSpan("s2", "spot", 50.0, 200.0),  # outlives the job: billed to its end
    ]
    assert node_seconds(spans, 100.0) == {"spot": 70.0, "on-demand": 100.0}


def test_cost_scales_compressed_seconds() -> None:
    prices = Prices(spot=1.0, on_demand=3.0)
    # 60 s on a x60 clock is an hour
    assert cost({"spot": 60.0, "on-demand": 60.0}, prices, 60.0) == pytest.approx(4.0)


def _polls(rows: list[tuple[float, int, int | None]]) -> list[Poll]:
    return [Poll(t, w, s) for t, w, s in rows]


# name → (polls as (t, world, step), min world, end, expected productive s, expected badput by cause)
Case = tuple[list[tuple[float, int, int | None]], int, float, float, dict[str, float]]
CASES: dict[str, Case] = {
    "steady run: startup then all productive": (
        [(0, 0, None), (5, 2, None), (10, 2, 0), (20, 2, 10), (30, 2, 20)],
        1,
        30,
        20.0,
        {PROGRAM_STARTUP: 10.0},
    ),
    "elastic slice-down stalls 4 s": (
        # 1 s/step at 2, 2 s/step at 1; the world drops at 20, steps resume by 26
        [(0, 2, 0), (10, 2, 10), (20, 2, 20), (22, 1, 20), (26, 1, 22), (36, 1, 27)],
        1,
        36,
        10 + 10 + 4 + 10,
        {SLICE_DOWN: 2.0},
    ),
    "scale-up stall": (
        [(0, 1, 0), (10, 1, 5), (20, 1, 10), (21, 2, 10), (25, 2, 14), (35, 2, 24)],
        1,
        35,
        10 + 10 + 4 + 10,
        {SCALE_UP: 1.0},
    ),
    "fixed-size job waits below its size, restarts from an older checkpoint": (
        # 1 s/step at 2; interrupted at 20 (world 1 < min 2), back at 40, restart stalls 5 s, redoes 3 steps
        [(0, 2, 0), (10, 2, 10), (20, 2, 20), (21, 1, 20), (40, 2, 20), (45, 2, 17), (55, 2, 27)],
        2,
        55,
        20 + 7,
        {INFRA_RECOVERY: 20.0, TRAINING_PREP: 5.0, WASTED: 3.0},
    ),
    "time after the last poll is the finish": (
        [(0, 1, 0), (10, 1, 10)],
        1,
        13,
        10.0,
        {OTHER: 3.0},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_goodput(case: str) -> None:
    rows, min_world, end, productive, badput = CASES[case]
    gp = goodput(_polls(rows), min_world, end)
    assert gp.productive_s == pytest.approx(productive)
    got = {k: v for k, v in gp.badput_s.items() if v > 1e-9}
    assert got == pytest.approx(badput)
    # every second is accounted for exactly once
    assert gp.productive_s + sum(gp.badput_s.values()) == pytest.approx(end)
    assert gp.goodput == pytest.approx(productive / end)


def test_polls_that_repeat_the_last_progress_are_not_badput() -> None:
    # Progress reaches the status every 2 s, the poll runs every second: 1 s/step throughout.
    rows: list[tuple[float, int, int | None]] = [(0, 2, 0)]
    for t in range(1, 21):
        rows.append((float(t), 2, (t // 2) * 2))
    gp = goodput(_polls(rows), 1, 20)
    assert gp.ideal_step_s == {2: pytest.approx(1.0)}
    assert gp.productive_s == pytest.approx(20.0)


def test_a_stopped_job_is_waiting_even_when_its_world_size_is_stale() -> None:
    # The status keeps the last world trained at while the job waits (phase Pending): the wait is
    # infrastructure recovery, the re-forming a restart.
    rows = [
        Poll(0, 0, None),
        Poll(10, 3, 0),
        Poll(20, 3, 10),
        Poll(21, 3, 10, waiting=True),
        Poll(50, 3, 10, waiting=True),
        Poll(51, 3, 10),
        Poll(60, 3, 12),
        Poll(70, 3, 22),
    ]
    gp = goodput(rows, 3, 70)
    assert gp.badput_s[INFRA_RECOVERY] == pytest.approx(31.0)  # 20→51: the wait until capacity came
    assert gp.badput_s[TRAINING_PREP] == pytest.approx(7.0)  # 51→60 less the 2 steps trained
    assert gp.productive_s == pytest.approx(22.0)

"""The deadline policy (decide/deadline/policy.py), as named tables of cases: progress in, on-demand count
out."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from etj_operator.decide.deadline.policy import (
    DeadlineInputs,
    Throughput,
    Why,
    decide,
    line_slack_s,
    margin_s,
)

# 10 workers max; one worker trains 100 samples/s alone, 90 % per worker beyond one (so 10 -> 900/s).
RATE = Throughput(per_worker=100.0, efficiency=0.9)
TOTAL = 900_000.0  # 1,000 s at 10 workers
# Margin: 120 s start-up + 10 s resize + 30 s interval = 160 s.
BASE = DeadlineInputs(
    samples_done=0.0,
    samples_total=TOTAL,
    elapsed_s=0.0,
    time_left_s=2000.0,
    spot=10,
    on_demand=0,
    max_workers=10,
    max_on_demand=10,
    rate=RATE,
    resize_s=10.0,
    on_demand_startup_s=120.0,
)


def at(fraction_done: float, elapsed: float, deadline: float = 2000.0, **kw: object) -> DeadlineInputs:
    """The job ``elapsed`` s after its start, ``fraction_done`` of it done, deadline at ``deadline``."""
    return replace(
        BASE, samples_done=TOTAL * fraction_done, elapsed_s=elapsed, time_left_s=deadline - elapsed, **kw
    )  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    name: str
    inp: DeadlineInputs
    on_demand: int
    why: Why


CASES = [
    Case("all spot, on the line: no on-demand", at(0.0, 0.0, spot=10), 0, Why.AHEAD),
    Case(
        "ahead of the line with no spot at all: wait for spot (cheap slack)",
        at(0.5, 600.0, spot=0),
        0,
        Why.AHEAD,
    ),
    # Half the spot, behind the line (30 % done at 40 % of the time): 1,040 s usable (1,200 left less the
    # 160 s margin) for 630,000 samples needs 606/s: 5 spot = 450/s, 7 workers = 630/s -> 2 on-demand.
    Case(
        "behind with half the spot: the on-demand that make up the rate",
        at(0.3, 800.0, spot=5),
        2,
        Why.BEHIND,
    ),
    # Behind but only a little is missing: 45 % done at 50 % of the time, 6 spot; 840 s usable for
    # 495,000 samples needs 590/s: 6 spot = 540/s, 7 workers = 630/s -> one on-demand worker.
    Case("slightly behind: the fewest on-demand that catch up", at(0.45, 1000.0, spot=6), 1, Why.BEHIND),
    # 20 % left needs 200 s on all 10 on-demand; 200 + 160 margin >= 350 s left: the safety net.
    Case(
        "no spot, near the deadline: safety net, every on-demand worker",
        at(0.8, 1650.0, spot=0),
        10,
        Why.SAFETY_NET,
    ),
    # Spot is back and fills the world 350 s before the deadline: 5 of the 10 on-demand workers go; 5 stay,
    # enough to finish in time should spot vanish again (5 train 120 s while the other 5 start, 6 resizes).
    Case(
        "spot back near the deadline: keep only what the safety net needs",
        at(0.8, 1650.0, spot=10, on_demand=10),
        5,
        Why.SAFETY_NET,
    ),
    Case(
        "deadline already out of reach: every on-demand worker, reported unreachable",
        at(0.5, 1800.0, spot=0),
        10,
        Why.CANNOT_MEET,
    ),
    # 3 on-demand workers need 630,000 / 270 = 2,333 s, more than the 1,200 left: all 3, and say so.
    Case(
        "cap of 3 on-demand too few: all 3, unreachable",
        at(0.3, 800.0, spot=0, max_on_demand=3),
        3,
        Why.CANNOT_MEET,
    ),
    Case("cap 0: deadline only reported", at(0.3, 800.0, spot=0, max_on_demand=0), 0, Why.ON_DEMAND_DISABLED),
    # Spot came back and fills the world: the 4 on-demand workers have no room and leave first.
    Case(
        "spot returns and fills the world: on-demand leaves",
        at(0.6, 1000.0, spot=10, on_demand=4),
        0,
        Why.AHEAD,
    ),
    # Ahead by 0.52*2000-1000 = 40 s only (< margin 160 + resize 10): releasing could not be undone in time.
    Case(
        "ahead by less than the margin: keep on-demand (no thrash)",
        at(0.52, 1000.0, spot=5, on_demand=5),
        5,
        Why.HOLD,
    ),
    # Ahead by 0.7*2000-1000 = 400 s with 5 spot + 5 on-demand: enough slack to let them go.
    Case("well ahead: release on-demand", at(0.7, 1000.0, spot=5, on_demand=5), 0, Why.AHEAD),
    # A long job 99 % done, 760 s behind its line, 240 s left, one spot worker: 9,000 samples need 113/s
    # (2 workers) but that one worker finishes in 90 s; new ones would only start in 120 s: do not ask.
    Case(
        "nearly done and behind: adding does not pay back",
        at(0.99, 99_760.0, deadline=100_000.0, spot=1, max_on_demand=10),
        0,
        Why.HOLD,
    ),
    Case(
        "finished: the on-demand workers stay until they exit by themselves",
        at(1.0, 900.0, spot=0, on_demand=3),
        3,
        Why.FINISHED,
    ),
    Case(
        "no rate measured yet: keep what the job has",
        at(0.2, 300.0, on_demand=2, rate=Throughput(0.0)),
        2,
        Why.NO_RATE,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_decide(case: Case) -> None:
    got = decide(case.inp)
    assert (got.on_demand, got.why) == (case.on_demand, case.why), got


def test_margin_covers_startup_resize_and_interval() -> None:
    assert margin_s(BASE) == 120.0 + 10.0 + 30.0


@pytest.mark.parametrize(
    ("name", "fraction", "elapsed", "slack"),
    [
        ("on the line", 0.5, 1000.0, 0.0),
        ("ahead", 0.6, 1000.0, 200.0),
        ("behind", 0.25, 1000.0, -500.0),
    ],
)
def test_line_slack(name: str, fraction: float, elapsed: float, slack: float) -> None:
    assert line_slack_s(at(fraction, elapsed)) == pytest.approx(slack), name


def test_projected_finish_uses_the_chosen_world() -> None:
    got = decide(at(0.5, 600.0, spot=0))  # ahead, no spot: nothing trains
    assert math.isinf(got.projected_finish_s)
    got = decide(at(0.5, 1000.0, spot=10))  # 450,000 left at 900/s
    assert got.projected_finish_s == pytest.approx(500.0)


def test_measured_rate_wins_over_the_model() -> None:
    rate = Throughput(per_worker=100.0, efficiency=0.9, measured={10: 450.0})
    assert rate.at(10) == 450.0 and rate.at(5) == pytest.approx(450.0)
    # 630,000 samples left: 1,400 s at the measured 450/s, not the model's 700 s at 900/s.
    got = decide(at(0.3, 800.0, deadline=3000.0, spot=10, rate=rate))
    assert (got.on_demand, got.why) == (0, Why.AHEAD)
    assert got.projected_finish_s == pytest.approx(0.7 * TOTAL / 450.0)
    # The same job measured that slow at 10 workers, with the deadline 2,000 s out, cannot make it at all.
    assert decide(at(0.3, 800.0, spot=10, rate=rate)).why == Why.CANNOT_MEET


def test_decision_is_monotone_in_spot_when_behind() -> None:
    """Less spot never asks for fewer on-demand workers (same progress, same deadline)."""
    asks = [decide(at(0.4, 1000.0, spot=s)).on_demand for s in range(11)]
    assert asks == sorted(asks, reverse=True), asks

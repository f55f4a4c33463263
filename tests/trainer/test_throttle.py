"""The CPU throttles: how short a step may be (TrainConfig.step_floor_s), as a named table.

``ETJ_RANK_SAMPLES_PER_SECOND`` makes the world's rate grow with its size (a rank's share of a fixed global
batch shrinks as the world grows), which the deadline bench on the bed needs: on two shared cores more
worker processes do not train faster by themselves.
"""

from __future__ import annotations

import pytest

from etj_contract import env
from etj_trainer.config import TrainConfig

CASES = {
    "no throttle": (0.0, 0.0, 32, 0.0),
    "a fixed floor only": (0.5, 0.0, 32, 0.5),
    "per rank: 32 samples at 64/s": (0.0, 64.0, 32, 0.5),
    "per rank: a world of 4 shares 64 samples, 16 each": (0.0, 64.0, 16, 0.25),
    "the longer of the two": (0.4, 64.0, 16, 0.4),
    "an empty share (an epoch's tail) waits only for the fixed floor": (0.1, 64.0, 0, 0.1),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_step_floor(case: str) -> None:
    min_step, rank_rate, share, floor = CASES[case]
    cfg = TrainConfig(min_step_seconds=min_step, rank_samples_per_second=rank_rate)
    assert cfg.step_floor_s(share) == pytest.approx(floor)


def test_the_world_rate_grows_with_its_size() -> None:
    """Global batch 64 at 32 samples/s per rank: 32/s alone, 64/s with two, 128/s with four."""
    cfg = TrainConfig(rank_samples_per_second=32.0)
    rates = {w: 64 / cfg.step_floor_s(64 // w) for w in (1, 2, 4)}
    assert rates == pytest.approx({1: 32.0, 2: 64.0, 4: 128.0})


def test_the_environment_sets_it() -> None:
    assert env.RANK_SAMPLES_PER_SECOND.field == "rank_samples_per_second"
    cfg = TrainConfig.from_env({"ETJ_RANK_SAMPLES_PER_SECOND": "48"})
    assert cfg.rank_samples_per_second == 48.0

"""A step's sample record exists before the step can commit (regression: bench/chaos.py found skipped ids).

A rank killed right after the all-reduce that commits a step used to die before logging it, so the
exactly-once check saw a committed step with a rank's samples missing. The stop code is read exactly once
per step, to build that all-reduce's input, so a flag that raises on its N-th read kills the process
deterministically at step N's commit point.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from etj_trainer.classifier.trainer import StopFlag, train
from etj_trainer.config import TrainConfig
from etj_trainer.core.stopping import StopCode

DIE_AT_STEP = 7


class Killed(Exception):
    pass


class DiesAtTheCollective(StopFlag):
    def __init__(self) -> None:  # no super().__init__: `code` is a property here
        self.reads = 0
        self.requested = False

    @property  # type: ignore[override]
    def code(self) -> StopCode:
        self.reads += 1
        if self.reads == DIE_AT_STEP:
            raise Killed
        return StopCode.RUN


def test_the_record_of_a_step_is_written_before_the_step_commits(
    tiny_cfg: TrainConfig, tmp_path: Path
) -> None:
    log_dir = tmp_path / "samples"
    with pytest.raises(Killed):
        train(replace(tiny_cfg, sample_log_dir=log_dir, max_steps=20), stop=DiesAtTheCollective())
    records = [json.loads(line) for f in log_dir.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert sorted(r["step"] for r in records) == list(range(1, DIE_AT_STEP + 1))
    assert all(r["epoch"] == 0 and len(r["ids"]) == tiny_cfg.global_batch_size for r in records)

"""bench/kueue_preemption.py's pure parts: the baseline's step lines, what its eviction cost, the etj job's
resizes and the table of docs/kueue.md. The bed run itself is the bench (docs/kueue.md, "Measured")."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench.kueue_preemption_report import (
    BASELINE_LOOP,
    StepLine,
    baseline_report,
    etj_report,
    parse_steps,
    proclet_started_at,
    rejoin_parts,
    table,
)

LOG = """100.0 start 0
100.5 step 1
101.0 step 2
101.5 step 3
oops
200.0 start 2
200.5 step 3
"""


def test_step_lines_are_parsed_and_junk_skipped() -> None:
    lines = parse_steps(LOG)
    assert lines[0] == StepLine(100.0, "start", 0) and lines[-1] == StepLine(200.5, "step", 3)
    assert len(lines) == 6


BASELINE = {
    "evicted after step 3, resumed from the checkpoint at 2: one step lost": (
        150.0,
        190.0,
        {
            "measured": True,
            "last_step_before": 3,
            "resumed_from": 2,
            "steps_lost": 1,
            "pods_started_after_freed_s": 10.0,
            "pause_s": 99.0,
            "restart_s": 10.5,
        },
    ),
    "no restart after the eviction: not measured": (
        250.0,
        260.0,
        {"measured": False, "why": "no step before the eviction or no restart after it"},
    ),
}


@pytest.mark.parametrize("case", BASELINE)
def test_baseline_report(case: str) -> None:
    evicted, freed, want = BASELINE[case]
    assert baseline_report(parse_steps(LOG), evicted_at=evicted, freed_at=freed) == want


HISTORY = [
    {"to": 3, "_t": 50.0, "reason": "CapacityAdded", "pauseSeconds": 2.0},
    {"to": 2, "_t": 101.0, "reason": "KueuePreempted", "pauseSeconds": 0.4, "stepsLost": 0},
    {"to": 3, "_t": 135.0, "reason": "CapacityAdded", "pauseSeconds": 1.5, "stepsLost": 0},
]


def test_etj_report_takes_the_resizes_after_the_preemption_and_after_the_quota_freed() -> None:
    got = etj_report(HISTORY, preempted_at=100.0, freed_at=130.0, failures=0)
    assert got["shrink"] == {"reason": "KueuePreempted", "world_at_s": 1.0, "pause_s": 0.4, "steps_lost": 0}
    assert got["grow"] == {"reason": "CapacityAdded", "world_at_s": 5.0, "pause_s": 1.5, "steps_lost": 0}
    assert etj_report(HISTORY[:2], preempted_at=100.0, freed_at=130.0, failures=0)["grow"] == {
        "measured": False
    }


def test_the_table_has_both_arms_in_one_row_each() -> None:
    etj = etj_report(HISTORY, preempted_at=100.0, freed_at=130.0, failures=0)
    report = {
        "hold_s": 30.0,
        "etj": {**etj, "preemptor_running_s": 1.2, "net_steps_during_hold": 25},
        "baseline": {
            "preemptor_running_s": 1.9,
            "net_steps_during_hold": -10,
            "evicted": baseline_report(parse_steps(LOG), evicted_at=150.0, freed_at=190.0),
            "failed_pods": 0,
        },
    }
    text = table(report)
    assert "| preemptor created -> its pod Running (s) | 1.2 | 1.9 |" in text
    assert "| steps lost | 0 | 1 |" in text
    assert "| net training steps while the preemptor held the GPU (30.0 s) | 25 | -10 |" in text
    assert "| quota freed -> training at 3 workers again (s) | 5.0 | 10.5 |" in text


def test_the_baseline_loop_steps_checkpoints_and_resumes(tmp_path: Path) -> None:
    """The baseline's pod command, run for real for a moment: it steps, pod 0 checkpoints, a restart
    resumes from the checkpoint."""
    cmd = [sys.executable, "-c", BASELINE_LOOP, str(tmp_path), "0.01", "5"]
    env = {"JOB_COMPLETION_INDEX": "0", "PATH": "/usr/bin:/bin"}
    log = tmp_path / "steps-0.log"

    def steps_since_start(n: int) -> int:
        lines = parse_steps(log.read_text()) if log.exists() else []
        starts = [i for i, x in enumerate(lines) if x.kind == "start"]
        return len(lines) - starts[n] - 1 if len(starts) > n else -1

    for run in range(2):
        proc = subprocess.Popen(cmd, env=env)
        while steps_since_start(run) < 6:
            assert proc.poll() is None
            time.sleep(0.01)
        proc.kill()
        proc.wait()
    lines = parse_steps((tmp_path / "steps-0.log").read_text())
    starts = [x.step for x in lines if x.kind == "start"]
    assert starts[0] == 0 and starts[1] >= 5 and starts[1] % 5 == 0, starts
    assert int((tmp_path / "checkpoint").read_text()) % 5 == 0


def test_the_rejoin_is_split_at_the_new_workers_process_start_and_its_join(tmp_path: Path) -> None:
    old, new = tmp_path / "demo-cpu-worker-2-aaaa", tmp_path / "demo-cpu-worker-2-bbbb"
    for d, start in ((old, "2026-11-29T13:30:15Z"), (new, "2026-11-29T13:32:17Z")):
        d.mkdir()
        (d / "trainer.log").write_text(f"--- proclet: start ['etj-train', 'worker'] at {start}\n")
    with (new / "trainer.log").open("a") as f:
        f.write("etj-train worker: joining the running world in place at 1795959178.203\n")
    started = proclet_started_at(new / "trainer.log")
    assert started == 1795959137.0
    assert rejoin_parts([old, new], freed_at=1795959135.5) == {"process_started_s": 1.5, "joining_s": 42.7}
    assert rejoin_parts([old], freed_at=1795959135.5) == {}
    assert proclet_started_at(tmp_path / "none.log") is None

"""The spot replay end to end on the local bed: a short synthetic trace, all three arms, real operator and
trainer on process-backed nodes (bench/spot_replay.py). A couple of minutes on two cores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench.spot_replay import parse_args, replay

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
REPO = Path(__file__).resolve().parents[2]

# 5-minute ticks; at x30 a tick is 10 s: two spot nodes; one goes at 30 s (training has started by then)
# for two ticks, then both are back.
TRACE = {"metadata": {"gap_seconds": 300}, "data": [2, 2, 2, 1, 1, 2, 2, 2, 2, 2, 2, 2] * 4}


@pytest.fixture(scope="module")
def report(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("replay")
    trace = base / "synthetic.json"
    trace.write_text(json.dumps(TRACE))
    # A floor under the training time: the drop at 30 s must land while the job trains (on a lightly
    # loaded machine the 2 epochs used to finish first and no interruption happened).
    job = yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    job["spec"]["trainer"]["env"].append({"name": "ETJ_MIN_STEP_SECONDS", "value": "0.8"})
    manifest = base / "job.yaml"
    manifest.write_text(yaml.safe_dump(job))
    args = parse_args(
        [
            str(trace),
            "--time-scale=30",
            "--on-demand=1",
            "--spot-nodes=2",
            "--epochs=2",
            "--start=0",
            "--arm-timeout=400",
            f"--manifest={manifest}",
            f"--out={base / 'replay.json'}",
        ]
    )
    return replay(Path(cluster.kubeconfig), args, base / "run")


def test_every_arm_finishes_with_every_sample_once(report: dict[str, Any]) -> None:
    arms = report["arms"]
    assert set(arms) == {"etj", "ckpt_restart", "on_demand"}
    for name, arm in arms.items():
        assert arm["finished"], (name, arm["phase"], arm["run_dir"])
        assert arm["exactly_once"], (name, arm["sample_problems"])
        assert arm["accuracy"] is not None, name


def test_the_spot_nodes_follow_the_trace(report: dict[str, Any]) -> None:
    etj = report["arms"]["etj"]
    notices = [e for e in etj["events"] if "interruption notice" in e["what"]]
    assert notices, etj["events"]
    assert report["arms"]["on_demand"]["node_seconds"]["spot"] == 0
    assert etj["node_seconds"]["spot"] > 0 and etj["node_seconds"]["on-demand"] > 0


def test_cost_time_and_goodput_are_reported(report: dict[str, Any]) -> None:
    for arm in report["arms"].values():
        # every second of the run is productive or one kind of badput
        accounted = arm["productive_s"] + sum(arm["badput_s"].values())
        assert accounted == pytest.approx(arm["wall_s"], abs=0.5)
        assert 0 < arm["goodput"] <= 1 and arm["cost_usd"] > 0
    for key in ("etj_vs_on_demand", "etj_vs_ckpt_restart"):
        assert report["ratios"][key]["cost"] > 0 and report["ratios"][key]["time"] > 0
    assert Path(report["plot"]).is_file()

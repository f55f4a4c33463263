"""The replay's arms and ratios (bench/spot_replay.py), without a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from bench.economics.traces import Trace
from bench.spot_replay import arm_specs, job_manifest, ratios

REPO = Path(__file__).resolve().parents[2]


def test_the_three_arms_share_the_trace_and_differ_in_elasticity_and_nodes() -> None:
    trace = Trace("t", 300, (16, 8, 0))
    etj, ckpt, od = arm_specs(trace, on_demand=1, spot_nodes=3, arms=["etj", "ckpt_restart", "on_demand"])
    assert (etj.replicas_min, etj.replicas_max, etj.on_demand) == (1, 4, 1)
    assert etj.trace is not None and etj.trace.counts == (3, 2, 0)  # scaled to 3 spot nodes
    # the fixed-size job on spot: all 3 spot nodes, spot only, its store on a node of its own
    assert (ckpt.replicas_min, ckpt.replicas_max, ckpt.on_demand) == (3, 3, 0)
    assert ckpt.worker_types == ("spot",) and ckpt.store_node and ckpt.trace == etj.trace
    # the on-demand cluster of the same peak size, no spot
    assert (od.replicas_min, od.replicas_max, od.on_demand, od.trace) == (4, 4, 4, None)


def test_the_job_is_the_demo_job_with_the_arm_s_size_and_capacity_types() -> None:
    base: dict[str, Any] = yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    (ckpt,) = arm_specs(Trace("t", 300, (4,)), 1, 3, ["ckpt_restart"])
    job = job_manifest(base, ckpt, epochs=5)
    assert job["spec"]["replicas"] == {"min": 3, "max": 3}
    assert job["spec"]["placement"]["capacityTypes"] == ["spot"]
    assert job["spec"]["training"]["epochs"] == 5
    assert job["spec"]["training"]["seed"] == base["spec"]["training"]["seed"]
    assert base["spec"]["replicas"] == {"min": 1, "max": 4}  # the base is not modified


def test_ratios_are_etj_over_each_baseline() -> None:
    arms = {
        "etj": {"cost_usd": 2.0, "wall_s": 150.0, "finished": True},
        "ckpt_restart": {"cost_usd": 4.0, "wall_s": 300.0, "finished": False},
        "on_demand": {"cost_usd": 8.0, "wall_s": 100.0, "finished": True},
    }
    assert ratios(arms) == {
        "etj_vs_on_demand": {"cost": 0.25, "time": 1.5, "baseline_finished": True},
        "etj_vs_ckpt_restart": {"cost": 0.5, "time": 0.5, "baseline_finished": False},
    }

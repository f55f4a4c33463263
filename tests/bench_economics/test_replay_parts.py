"""The replay's arms and ratios (bench/spot_replay.py), without a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from bench.economics.provisioner import OnDemandProvisioner, Scaling
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


def test_the_on_demand_stand_in_autoscaler() -> None:
    """Karpenter's contract on the bed (bench/economics/provisioner.py): pending on-demand pods get nodes
    after the delay, never twice for the same pods; an empty node goes after idle_s, a busy one never."""
    p = OnDemandProvisioner(delay_s=3.0, idle_s=5.0)
    steps = [
        # (now, pending, nodes {name: busy}) -> (launch, remove)
        ("nothing pending: nothing happens", 0.0, 0, {}, Scaling()),
        ("two pods pending: two nodes asked for, none up yet", 1.0, 2, {}, Scaling()),
        ("still pending before the delay: no second order", 2.0, 2, {}, Scaling()),
        ("the delay has passed: both come up", 4.0, 2, {}, Scaling(launch=2)),
        ("nodes up, pods not bound yet: no new order", 5.0, 2, {"od-1": False, "od-2": False}, Scaling()),
        ("both bound", 6.0, 0, {"od-1": True, "od-2": True}, Scaling()),
        (
            "one released (its worker left): idle, not yet gone",
            7.0,
            0,
            {"od-1": True, "od-2": False},
            Scaling(),
        ),
        ("idle for 5 s: consolidated", 12.0, 0, {"od-1": True, "od-2": False}, Scaling(remove=("od-2",))),
        ("a busy node is never removed", 30.0, 0, {"od-1": True}, Scaling()),
    ]
    for what, now, pending, nodes, want in steps:
        assert p.step(now, pending, nodes) == want, what


def test_an_empty_node_a_pending_pod_can_take_is_kept() -> None:
    p = OnDemandProvisioner(delay_s=3.0, idle_s=1.0)
    assert p.step(0.0, 0, {"od-1": False}) == Scaling()
    assert p.step(10.0, 1, {"od-1": False}) == Scaling()  # idle long enough, but a pod is about to bind
    assert p.step(11.0, 0, {"od-1": False}) == Scaling(remove=("od-1",))

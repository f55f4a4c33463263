"""The job model and simulator (bench/economics/simulate.py), by named cases on tiny traces.

Units are chosen so the arithmetic is visible: one node trains 1 sample/s, perfect scaling, ticks of 100 s.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from bench.economics.accounting import (
    INFRA_RECOVERY,
    PROGRAM_STARTUP,
    SCALE_UP,
    SLICE_DOWN,
    TRAINING_PREP,
    WASTED,
    Prices,
)
from bench.economics.simulate import (
    Cluster,
    JobModel,
    Outcome,
    simulate_ckpt_restart,
    simulate_etj,
    simulate_on_demand,
)
from bench.economics.traces import Trace

JOB = JobModel(
    samples=600.0,
    node_throughput=1.0,
    scaling_efficiency=1.0,
    startup_s=10.0,
    leave_stall_s=2.0,
    join_stall_s=3.0,
    node_ready_s=20.0,
    restart_s=30.0,
    checkpoint_every_s=50.0,
)
# 1 on-demand node + up to 2 spot nodes; spot costs 1 $/h, on-demand 3 $/h
CLUSTER = Cluster(floor=1, max_spot=2, prices=Prices(spot=1.0, on_demand=3.0))


def trace(*counts: int) -> Trace:
    return Trace("t", 100.0, counts)


def total(o: Outcome) -> float:
    return o.productive_s + sum(o.badput_s.values())


def test_on_demand_is_startup_plus_work_at_full_size() -> None:
    o = simulate_on_demand(JOB, CLUSTER, 3)
    assert o.finished and o.time_s == pytest.approx(10 + 200)
    assert o.cost_usd == pytest.approx(3 * 210 * 3.0 / 3600)
    assert o.goodput == pytest.approx(200 / 210)


# name → (trace counts, expected time, expected badput by cause, expected spot node-seconds)
ETJ_CASES = {
    "full spot throughout: like on-demand, cheaper": (
        (2, 2, 2, 2),
        210.0,
        {PROGRAM_STARTUP: 10.0},
        2 * 210.0,
    ),
    # 10 s startup + 90 s at 3 (270); tick 1 at 2 nodes: 2 s stall, 98 s (196); 134 left at 2 → 67 s
    "one spot node lost for good": (
        (2, 1, 1, 1),
        100 + 100 + 67.0,
        {PROGRAM_STARTUP: 10.0, SLICE_DOWN: 2.0},
        200 + 167,
    ),
    # no spot at all: the floor trains alone: 10 + 600
    "no spot: the floor alone": ((0, 0, 0, 0, 0, 0, 0), 610.0, {PROGRAM_STARTUP: 10.0}, 0.0),
    # spot back after one tick: 100 s at 1 node (90 trained), then 20 s not ready (20), then join stall 3,
    # then 3 nodes: 490 left → 163.33 s
    "capacity returns: ready after 20 s, then a join stall": (
        (0, 2, 2, 2, 2),
        100 + 20 + 3 + 490 / 3,
        {PROGRAM_STARTUP: 10.0, SCALE_UP: 3.0},
        2 * (20 + 3 + 490 / 3),
    ),
}


@pytest.mark.parametrize("case", ETJ_CASES)
def test_etj(case: str) -> None:
    counts, time_s, badput, spot_s = ETJ_CASES[case]
    o = simulate_etj(trace(*counts), 0, JOB, CLUSTER, horizon_ticks=len(counts))
    assert o.finished
    assert o.time_s == pytest.approx(time_s)
    assert {k: v for k, v in o.badput_s.items() if v} == pytest.approx(badput)
    assert o.node_s["spot"] == pytest.approx(spot_s)
    assert o.node_s["on-demand"] == pytest.approx(time_s)  # the floor, throughout
    assert total(o) == pytest.approx(o.time_s)


def test_etj_with_no_node_at_all_waits() -> None:
    no_floor = replace(CLUSTER, floor=0)
    o = simulate_etj(trace(0, 2, 2, 2, 2, 2), 0, JOB, no_floor, horizon_ticks=6)
    # 100 s waiting, 20 s for the nodes to be ready, 3 s to resume, 10 s startup never served? (startup is
    # served first, when it can train): 10 + 3 stall, then 600 / 2 = 300 s
    assert o.badput_s[INFRA_RECOVERY] == pytest.approx(120.0)
    assert o.time_s == pytest.approx(120 + 10 + 3 + 300)
    assert total(o) == pytest.approx(o.time_s)


def test_ckpt_restart_waits_for_its_size_and_loses_work_since_the_checkpoint() -> None:
    # 2 spot nodes, 2 samples/s. Tick 0: 10 s startup, 90 s training (checkpoint at 50 s: 100 samples
    # kept); tick 1: a node gone → stop, 40 s of work (80 samples) lost, wait; tick 2: back, 20 s until
    # ready, 30 s restart, 50 s training (200); ticks 3-4: 400 more.
    o = simulate_ckpt_restart(trace(2, 1, 2, 2, 2, 2), 0, JOB, CLUSTER, 2, horizon_ticks=6)
    assert o.finished and o.interruptions == 1
    assert o.badput_s[WASTED] == pytest.approx(40.0)
    assert o.badput_s[INFRA_RECOVERY] == pytest.approx(100 + 20)
    assert o.badput_s[TRAINING_PREP] == pytest.approx(30.0)
    assert o.badput_s[PROGRAM_STARTUP] == pytest.approx(10.0)
    assert o.time_s == pytest.approx(500.0)
    assert o.productive_s == pytest.approx(300.0)
    assert total(o) == pytest.approx(o.time_s)
    assert o.node_s == pytest.approx({"spot": 100 * 2 + 100 * 1 + 300 * 2, "on-demand": 0.0})


def test_ckpt_restart_never_finishes_without_its_size() -> None:
    o = simulate_ckpt_restart(trace(1, 1, 1), 0, JOB, CLUSTER, 2, horizon_ticks=3)
    assert not o.finished and o.productive_s == 0
    assert o.cost_usd == pytest.approx(300 / 3600)  # the node it holds while it waits is billed
    assert o.idle_cost_usd == pytest.approx(o.cost_usd)


def test_ckpt_restart_idle_nodes_are_counted_apart() -> None:
    # waits a tick with 1 of its 2 nodes, then 20 s for the second to be ready: 100 + 2 * 20 node-s idle
    o = simulate_ckpt_restart(trace(1, 2, 2, 2, 2, 2, 2, 2), 0, JOB, CLUSTER, 2, horizon_ticks=8)
    assert o.finished
    assert o.idle_spot_s == pytest.approx(140.0)
    assert o.badput_s[TRAINING_PREP] == 0  # the first start is start-up, not a restart

"""The deadline arms (bench/economics/deadline_sim.py) and their report, by named cases on tiny traces.

One node trains 1 sample/s, perfect scaling, ticks of 100 s, 2 spot + up to 4 on-demand nodes (peak 4).
"""

from __future__ import annotations

import pytest
from bench.economics.accounting import Prices
from bench.economics.deadline_report import cheapest_meeting_all, trace_report
from bench.economics.deadline_sim import DeadlineJob, simulate_deadline, simulate_up_whole, spot_ready
from bench.economics.simulate import Cluster, JobModel, simulate_on_demand
from bench.economics.traces import Trace

JOB = JobModel(
    samples=2000.0,
    node_throughput=1.0,
    scaling_efficiency=1.0,
    startup_s=10.0,
    leave_stall_s=2.0,
    join_stall_s=3.0,
    node_ready_s=20.0,
    restart_s=30.0,
    checkpoint_every_s=100.0,
)
CLUSTER = Cluster(floor=2, max_spot=4, prices=Prices(spot=1.0, on_demand=3.0))  # peak 6
ON_DEMAND = simulate_on_demand(JOB, CLUSTER, CLUSTER.peak)  # 10 s + 2000/6 s


def trace(*counts: int) -> Trace:
    return Trace("t", 100.0, counts)


def test_spot_ready_lags_new_nodes_by_their_start_up() -> None:
    t = trace(1, 3, 0)
    assert spot_ready(t, 0, 50.0, 20.0) == (1, 1)
    assert spot_ready(t, 0, 110.0, 20.0) == (3, 1)  # two new nodes, not ready yet
    assert spot_ready(t, 0, 130.0, 20.0) == (3, 3)
    assert spot_ready(t, 0, 200.0, 20.0) == (0, 0)  # a loss is immediate


@pytest.mark.parametrize(
    ("name", "counts", "factor", "max_on_demand", "met", "uses_on_demand", "uses_spot"),
    [
        ("spot throughout, loose deadline: spot only", (4,) * 20, 3.0, 6, True, False, True),
        ("no spot at all: on-demand carries it", (0,) * 20, 1.25, 6, True, True, False),
        (
            "spot vanishes after one tick: on-demand added in time",
            (4, 0, 0, 0, 0, 0),
            1.25,
            6,
            True,
            True,
            True,
        ),
        ("cap of 1 on-demand cannot save a spotless job", (0,) * 20, 1.25, 1, False, True, False),
    ],
)
def test_deadline_arm(
    name: str,
    counts: tuple[int, ...],
    factor: float,
    max_on_demand: int,
    met: bool,
    uses_on_demand: bool,
    uses_spot: bool,
) -> None:
    deadline = factor * ON_DEMAND.time_s
    out = simulate_deadline(
        trace(*counts), 0, JOB, CLUSTER, DeadlineJob(deadline, max_on_demand, 10.0), 5000.0
    )
    assert (out.finished and out.time_s <= deadline) == met, (name, out.time_s, deadline)
    assert (out.node_s["on-demand"] > 0) == uses_on_demand, (name, out.node_s)
    assert (out.node_s["spot"] > 0) == uses_spot, (name, out.node_s)


def test_deadline_arm_cheaper_than_on_demand_with_spot_and_releases_it_first() -> None:
    """Spot for a tick, gone for two, back: on-demand comes in while it is gone and leaves when it is back."""
    counts = (4, 0, 0, 4, 4, 4, 4, 4)
    deadline = 1.5 * ON_DEMAND.time_s
    out = simulate_deadline(trace(*counts), 0, JOB, CLUSTER, DeadlineJob(deadline, 6, 10.0), 5000.0)
    assert out.finished and out.time_s <= deadline
    assert out.cost_usd < ON_DEMAND.cost_usd
    assert out.node_s["on-demand"] > 0 and out.node_s["spot"] > 0


def test_up_whole_goes_on_demand_when_spot_is_gone() -> None:
    deadline = 1.5 * ON_DEMAND.time_s
    out = simulate_up_whole(trace(*(0,) * 20), 0, JOB, CLUSTER, DeadlineJob(deadline, 6, 10.0), 5000.0)
    assert out.finished and out.node_s["spot"] == 0 and out.node_s["on-demand"] > 0


def test_up_whole_stays_on_spot_while_ahead() -> None:
    deadline = 3.0 * ON_DEMAND.time_s  # 4 spot nodes alone take 1.5x the on-demand time: always ahead
    out = simulate_up_whole(trace(*(4,) * 20), 0, JOB, CLUSTER, DeadlineJob(deadline, 6, 10.0), 5000.0)
    assert out.finished and out.node_s["on-demand"] == 0 and out.time_s <= deadline


def test_report_names_the_cheapest_arm_meeting_every_deadline() -> None:
    report = trace_report(trace(4, 0, 0, 4, 4, 4, 0, 4), JOB, CLUSTER, 2, [0, 2, 4], [1.25, 1.5])
    for f in ("1.25", "1.5"):
        arms = report["deadlines"][f]["arms"]
        assert arms["on_demand"]["met"] == 3 and arms["on_demand"]["cost_rel_mean"] == 1.0
        assert report["deadlines"][f]["cheapest_meeting_all"] == cheapest_meeting_all(arms)
    arms = {
        "a": {"met": 2, "runs": 2, "cost_rel_mean": 0.9},
        "b": {"met": 1, "runs": 2, "cost_rel_mean": 0.1},
    }
    assert cheapest_meeting_all(arms) == "a"
    assert cheapest_meeting_all({"b": arms["b"]}) is None


def test_up_whole_starts_on_demand_without_a_switch_when_too_tight_for_spot() -> None:
    """At 1.1x there is no time for spot: it starts on the on-demand cluster and takes its time exactly."""
    deadline = 1.1 * ON_DEMAND.time_s
    out = simulate_up_whole(trace(*(4,) * 20), 0, JOB, CLUSTER, DeadlineJob(deadline, 6, 10.0), 5000.0)
    assert out.finished and out.time_s == pytest.approx(ON_DEMAND.time_s) and out.node_s["spot"] == 0

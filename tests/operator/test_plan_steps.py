"""The planner's steps one at a time (decide/plan/*_steps.py): each takes what it reads and returns what it
decides, never the plan itself; and the small pure helpers the steps share, as named tables. The whole chain
is tested by tests/operator/test_planner.py."""

from __future__ import annotations

import inspect
from dataclasses import replace
from types import ModuleType
from typing import get_type_hints

import pytest

from etj_operator.decide.plan import create_steps, deadline_steps, drain_steps, judge_steps, status_step
from etj_operator.decide.plan.model import JobPods, Plan, StepResult
from etj_operator.decide.plan.slots import free_slots, next_rendezvous_index
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason
from tests.operator.factories import cluster, job, observe, spec, started, store, worker

STEP_MODULES: tuple[ModuleType, ...] = (drain_steps, judge_steps, deadline_steps, create_steps, status_step)


def _steps() -> list[tuple[str, object]]:
    return [
        (f"{m.__name__.rpartition('.')[2]}.{name}", fn)
        for m in STEP_MODULES
        for name, fn in inspect.getmembers(m, inspect.isfunction)
        if fn.__module__ == m.__name__ and not name.startswith("_")
    ]


@pytest.mark.parametrize("name,step", _steps(), ids=[n for n, _ in _steps()])
def test_a_step_declares_what_it_reads_and_returns_what_it_decides(name: str, step: object) -> None:
    hints = get_type_hints(step)
    returned = hints.pop("return")
    assert Plan not in hints.values(), f"{name} is given the plan: it should be given what it reads"
    assert returned is not None and returned is not Plan, f"{name} should return its decision"


def test_the_draining_and_judging_steps_return_step_results() -> None:
    # Their drains, Events and wake-ups are merged by Plan.take, in the planner's order.
    for name, step in _steps():
        if name.startswith(("drain_steps.", "judge_steps.")) and name != "judge_steps.count_failures":
            returned = get_type_hints(step)["return"]
            assert issubclass(returned, StepResult), name


FREE_SLOTS: dict[str, tuple[list[int], int, list[int], list[int]]] = {
    # name: (slots pods hold, how many wanted, also taken, expected)
    "no pods: the lowest slots": ([], 3, [], [0, 1, 2]),
    "gaps are filled first": ([0, 2], 2, [], [1, 3]),
    "slots taken by this round's other creates are skipped": ([0], 2, [1], [2, 3]),
    "none wanted": ([0, 1], 0, [], []),
}


@pytest.mark.parametrize("case", list(FREE_SLOTS), ids=list(FREE_SLOTS))
def test_free_slots(case: str) -> None:
    held, count, also, expected = FREE_SLOTS[case]
    assert free_slots([worker(s, "spot-0") for s in held], count, also) == expected


RENDEZVOUS_INDEX: dict[str, tuple[list[str], int]] = {
    # name: (store pod names still known, next index)
    "no store yet": ([], 0),
    "the fixed name of older operators counts as -1": (["train-rdzv"], 0),
    "one past the highest, gaps not reused": (["train-rdzv-0", "train-rdzv-3"], 4),
    "another job's pod is not ours": (["other-rdzv-7", "train-rdzv-1"], 2),
}


@pytest.mark.parametrize("case", list(RENDEZVOUS_INDEX), ids=list(RENDEZVOUS_INDEX))
def test_next_rendezvous_index(case: str) -> None:
    names, expected = RENDEZVOUS_INDEX[case]
    assert next_rendezvous_index("train", [store(name=n) for n in names]) == expected


def test_trim_to_max_drops_pending_workers_first_then_the_highest_slots() -> None:
    pods = [worker(0, "spot-0"), worker(1, "spot-1"), worker(2), worker(3, "spot-3")]
    trimmed = drain_steps.trim_to_max(2, 4, None, pods)
    assert [(d.pod, d.reason) for d in trimmed.drains] == [
        ("train-worker-2", Reason.SCALED_BY_USER),
        ("train-worker-3", Reason.SCALED_BY_USER),
    ]


def test_trim_to_max_without_a_lower_max_drops_an_excess_worker() -> None:
    pods = [worker(0, "spot-0"), worker(1, "spot-1"), worker(2, "spot-2")]
    assert [(d.pod, d.reason) for d in drain_steps.trim_to_max(2, 2, None, pods).drains] == [
        ("train-worker-2", Reason.EXCESS_WORKER)
    ]


def test_stop_workers_drains_every_survivor_of_a_suspended_job() -> None:
    pods = [worker(0, "spot-0"), worker(1, "spot-1")]
    j, obs = job(spec(suspend=True), started(2)), observe(cluster(), pods)
    failures = judge_steps.count_failures(j.spec, j.status, [], 0, obs.now)
    outcome = judge_steps.judge_outcome(j.spec, j.status, pods, obs, failures)
    assert outcome.verdict.stop_reason == Reason.SUSPENDED
    stopped = drain_steps.stop_workers(outcome.verdict.stop_reason, pods)
    assert [(d.pod, d.reason) for d in stopped.drains] == [
        ("train-worker-0", Reason.SUSPENDED),
        ("train-worker-1", Reason.SUSPENDED),
    ]


def test_drain_crashed_counts_a_crash_but_not_a_worker_whose_node_went_away() -> None:
    crashed = replace(worker(0, "spot-0", phase="Failed"), exit_code=1)
    on_lost_node = worker(1, "gone-node", phase="Failed")
    pods: list[PodInfo] = [crashed, on_lost_node]
    j, obs = job(spec(), started(2)), observe(cluster(), pods)
    drained = drain_steps.drain_crashed(JobPods.of(pods).workers, obs, j.status.phase)
    assert [(d.pod, d.reason) for d in drained.drains] == [
        ("train-worker-0", Reason.WORKER_FAILED),
        ("train-worker-1", Reason.NODE_DELETED),
    ]
    failures = judge_steps.count_failures(j.spec, j.status, drained.drains, drained.new_failures, obs.now)
    assert (failures.new, failures.total) == (1, 1)


def test_plan_take_merges_drains_events_and_the_earliest_wake() -> None:
    out = Plan()
    out.take(StepResult(wake_in=30.0))
    out.take(drain_steps.trim_to_max(1, 2, None, [worker(0, "spot-0"), worker(1, "spot-1")]))
    out.take(StepResult(wake_in=5.0))
    assert ([d.pod for d in out.drains], out.requeue_after) == (["train-worker-1"], 5.0)

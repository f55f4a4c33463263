"""The planner's steps one at a time (decide/plan_steps.py): the order of ``STEPS``, and the small pure
helpers the steps share, as named tables. The whole chain is tested by tests/operator/test_planner.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from etj_operator.decide import plan_steps
from etj_operator.decide.plan_steps import PlanContext
from etj_operator.decide.slots import free_slots, next_rendezvous_index
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason
from tests.operator.factories import cluster, job, observe, spec, started, store, worker


def test_the_steps_run_in_the_order_of_the_decision() -> None:
    assert [step.__name__ for step in plan_steps.STEPS] == [
        "drain_interrupted",
        "recheck_not_ready",
        "drain_crashed",
        "count_failures",
        "count_crashes",
        "judge_outcome",
        "avoid_failed_nodes",
        "stop_workers",
        "trim_to_max",
        "recreate_stale_avoiders",
        "resolve_image",
        "apply_deadline_policy",
        "refill_workers",
        "place_rendezvous",
        "write_status",
        "record_schedule",
        "warn_report_missing",
        "expire_ttl",
    ]


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


def _context(pods: list[PodInfo], **spec_fields: object) -> PlanContext:
    return PlanContext(job(spec(**spec_fields), started(len(pods))), observe(cluster(), pods))


def test_trim_to_max_drops_pending_workers_first_then_the_highest_slots() -> None:
    pods = [worker(0, "spot-0"), worker(1, "spot-1"), worker(2), worker(3, "spot-3")]
    c = _context(pods, replicas={"min": 1, "max": 2})
    plan_steps.trim_to_max(c)
    assert [(d.pod, d.reason) for d in c.out.drains] == [
        ("train-worker-2", Reason.SCALED_BY_USER),
        ("train-worker-3", Reason.SCALED_BY_USER),
    ]
    assert [p.name for p in c.survivors] == ["train-worker-0", "train-worker-1"]


def test_stop_workers_drains_every_survivor_of_a_suspended_job() -> None:
    c = _context([worker(0, "spot-0"), worker(1, "spot-1")], suspend=True)
    plan_steps.judge_outcome(c)
    plan_steps.stop_workers(c)
    assert c.stop_reason == Reason.SUSPENDED
    assert [(d.pod, d.reason) for d in c.out.drains] == [
        ("train-worker-0", Reason.SUSPENDED),
        ("train-worker-1", Reason.SUSPENDED),
    ]
    assert c.survivors == []


def test_drain_crashed_counts_a_crash_but_not_a_worker_whose_node_went_away() -> None:
    crashed = replace(worker(0, "spot-0", phase="Failed"), exit_code=1)
    on_lost_node = worker(1, "gone-node", phase="Failed")
    c = _context([crashed, on_lost_node])
    plan_steps.drain_crashed(c)
    plan_steps.count_failures(c)
    assert [(d.pod, d.reason) for d in c.out.drains] == [
        ("train-worker-0", Reason.WORKER_FAILED),
        ("train-worker-1", Reason.NODE_DELETED),
    ]
    assert (c.out.new_failures, c.failures) == (1, 1)

"""The free-capacity estimate counts every resource a worker requests: GPUs, cpu and memory (issue 15).

Before, only GPUs were counted, and CPU workers counted every eligible node as roomy: a job asking for
100Ti of memory per worker reported CapacityAvailable=True/EnoughCapacity on any cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from etj_operator.api.models import ConditionType
from etj_operator.decide.plan.planner import free_capacity, plan
from etj_operator.observe.nodes import node_info
from etj_operator.observe.pods import countable_requests
from etj_operator.quantity import parse_milli
from tests.operator.factories import GPU, job, node, observe, spec

Gi = 2**30 * 1000  # milli-units, as NodeInfo.allocatable holds memory


def sized(name: str, gpus: int = 1, cpu: str | None = "8", memory: str | None = "64Gi") -> Any:
    alloc: dict[str, int] = {GPU: gpus}
    for key, raw in (("cpu", cpu), ("memory", memory)):
        if raw is not None:
            alloc[key] = parse_milli(raw) or 0
    return replace(node(name, gpus=gpus), allocatable=alloc)


@dataclass(frozen=True)
class Case:
    name: str
    resources: dict[str, Any]
    nodes: list[Any]
    room: int
    usage: dict[str, dict[str, int]] = field(default_factory=dict)


CASES = [
    Case("GPUs only: one per one-GPU node", {"gpu": 1}, [sized("a"), sized("b")], room=2),
    Case(
        "100Ti of memory fits nowhere",
        {"gpu": 1, "memory": "100Ti"},
        [sized("a"), sized("b")],
        room=0,
    ),
    Case(
        "memory limits a multi-GPU node below its GPU count",
        {"gpu": 1, "memory": "40Gi"},
        [sized("a", gpus=4, memory="100Gi")],
        room=2,
    ),
    Case(
        "cpu limits it too, in millicores",
        {"gpu": 1, "cpu": "3500m"},
        [sized("a", gpus=4, cpu="8")],
        room=2,
    ),
    Case(
        "cpu and memory already used by other pods are not free",
        {"gpu": 1, "cpu": "2", "memory": "16Gi"},
        [sized("a", gpus=4, cpu="8", memory="64Gi")],
        room=1,
        usage={"a": {"cpu": 5000, "memory": 40 * Gi}},
    ),
    Case(
        "CPU workers: counted by cpu and memory instead of as roomy nodes",
        {"gpu": 0, "cpu": "6", "memory": "8Gi"},
        [sized("a", gpus=0, cpu="16", memory="64Gi")],
        room=2,
    ),
    Case(
        "CPU workers with no requests: the scheduler decides (replicas.max per node, as before)",
        {"gpu": 0},
        [sized("a", gpus=0)],
        room=4,
    ),
    Case(
        "a node that reports no memory is not limited by it",
        {"gpu": 1, "memory": "100Ti"},
        [sized("a", memory=None)],
        room=1,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_free_capacity_counts_every_requested_resource(case: Case) -> None:
    s = spec(trainer={"image": "t:1", "resources": case.resources})
    obs = observe(case.nodes, [])
    obs = replace(obs, node_usage=case.usage)
    assert free_capacity(s, obs).total == case.room


def test_a_100ti_memory_request_does_not_report_enough_capacity() -> None:
    s = spec(trainer={"image": "t:1", "resources": {"gpu": 1, "memory": "100Ti"}})
    out = plan(job(s), observe([sized(f"spot-{i}") for i in range(4)], []))
    cond = next(c for c in out.status.conditions if c.type == ConditionType.CAPACITY_AVAILABLE)
    assert (cond.status, cond.reason) == ("False", "InsufficientCapacity"), cond
    # The same job with a request that fits is fine.
    fits = spec(trainer={"image": "t:1", "resources": {"gpu": 1, "memory": "32Gi"}})
    out = plan(job(fits), observe([sized(f"spot-{i}") for i in range(4)], []))
    cond = next(c for c in out.status.conditions if c.type == ConditionType.CAPACITY_AVAILABLE)
    assert cond.reason == "EnoughCapacity"


@pytest.mark.parametrize(
    ("raw", "milli"),
    [("500m", 500), ("2", 2000), (3, 3000), ("1Ki", 1024_000), ("1.5", 1500), ("1e3", 1_000_000), ("1n", 1)],
)
def test_quantities_in_milli_units_round_up(raw: Any, milli: int) -> None:
    assert parse_milli(raw) == milli


def test_nodes_and_pods_are_parsed_in_the_same_units() -> None:
    info = node_info(
        {
            "metadata": {"name": "n"},
            "status": {"allocatable": {"cpu": "7910m", "memory": "64Gi", GPU: "8", "pods": "110"}},
        }
    )
    assert info.allocatable == {"cpu": 7910, "memory": 64 * Gi, GPU: 8}
    requests = countable_requests(
        {
            "containers": [
                {
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {GPU: "1", "memory": "2Gi"},
                    }
                },
                {"resources": {"limits": {"cpu": "250m"}}},
            ]
        }
    )
    # A missing request defaults to the limit, as the apiserver does.
    assert requests == {"cpu": 1250, "memory": Gi, GPU: 1}

"""Namespaced mode (--namespace, the chart's watchNamespaces): the GPU-usage index holds only the watched
namespaces' pods, so GPUs other namespaces use look free. That is a documented limitation (docs/operator.md,
"Namespaced mode"); these tests pin it down and check that the job's status says so."""

from __future__ import annotations

from dataclasses import replace

from etj_operator.api.models import ConditionType
from etj_operator.decide.plan.planner import free_capacity, plan
from etj_operator.decide.status.conditions import PARTIAL_USAGE_NOTE
from etj_operator.k8s.main import build_state, parse_args
from tests.operator.factories import GPU, cluster, job, observe, spec


def _capacity_message(namespaces: tuple[str, ...]) -> str:
    obs = replace(observe(cluster(spot=2), []), usage_namespaces=namespaces)
    result = plan(job(spec(replicas={"min": 2, "max": 2})), obs)
    cond = next(c for c in result.status.conditions if c.type == ConditionType.CAPACITY_AVAILABLE)
    return cond.message


def test_free_capacity_subtracts_only_the_usage_it_is_given() -> None:
    s = spec(replicas={"min": 1, "max": 2})
    nodes = cluster(spot=2)
    # A pod of an unwatched namespace holds spot-0's GPU: a namespaced operator's index never has it.
    seen_everywhere = replace(observe(nodes, []), node_usage={"spot-0": {GPU: 1}})
    seen_namespaced = replace(observe(nodes, []), node_usage={}, usage_namespaces=("team-a",))
    assert free_capacity(s, seen_everywhere).total == 1
    assert free_capacity(s, seen_namespaced).total == 2  # the over-count this limitation is about


def test_a_namespaced_operator_says_its_capacity_count_is_partial() -> None:
    message = _capacity_message(("team-a",))
    assert message.startswith("room for 2 of 2..2 workers")
    assert PARTIAL_USAGE_NOTE in message and "watched namespaces" in message


def test_an_all_namespaces_operator_does_not() -> None:
    assert _capacity_message(()) == "room for 2 of 2..2 workers"


def test_the_watched_namespaces_reach_the_planner_settings() -> None:
    assert build_state(parse_args(["-n", "a", "-n", "b"])).settings.namespaces == ("a", "b")
    assert build_state(parse_args(["--all-namespaces"])).settings.namespaces == ()
    assert build_state(parse_args([])).settings.namespaces == ()

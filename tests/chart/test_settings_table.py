"""The chart against the operator's one table of settings (k8s/settings_table.py): each option the chart
sets has its value in values.yaml with the table's default (or the chart's stated choice), a schema entry
of the right type, and is passed by deployment.yaml as its flag or its variable from that value; the
Deployment passes no operator flag or ETJ_* variable the table does not define. What each value does to a
rendered operator is tests/chart/test_chart_render.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from etj_operator.k8s import settings_table as table
from tests.chart.helmbed import CHART

VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
DEPLOYMENT = (CHART / "templates" / "deployment.yaml").read_text().splitlines()
CHARTED = [o for o in table.OPTIONS if o.chart]
# How far above the line that passes an option the template may name its value (an `if` or `range` around it).
NEAR = 6


def _value(path: str) -> object:
    node: Any = VALUES
    for key in path.split("."):
        assert isinstance(node, dict) and key in node, f"values.yaml has no {path}"
        node = node[key]
    return node


def _schema(path: str) -> dict[str, Any]:
    node = SCHEMA
    for key in path.split("."):
        assert key in node.get("properties", {}), f"values.schema.json has no {path}"
        node = node["properties"][key]
    return node


def _passes(option: table.Option[Any]) -> int:
    """The line of deployment.yaml that passes ``option``: its flag in the args, or its variable's name."""
    if option.via == "env":
        pattern = re.compile(rf"- name: {re.escape(option.env or '')}\s*$")
    else:
        pattern = re.compile(rf"\"{re.escape(option.flag)}(=|\")")
    lines = [i for i, line in enumerate(DEPLOYMENT) if pattern.search(line)]
    assert lines, f"deployment.yaml does not pass {option.flag if option.via == 'flag' else option.env}"
    return lines[0]


@pytest.mark.parametrize("option", CHARTED, ids=[o.dest for o in CHARTED])
def test_values_yaml_holds_the_tables_default(option: table.Option[Any]) -> None:
    assert _value(option.chart or "") == option.chart_value()


@pytest.mark.parametrize("option", CHARTED, ids=[o.dest for o in CHARTED])
def test_the_schema_types_the_value(option: table.Option[Any]) -> None:
    entry = _schema(option.chart or "")
    if option.choices:  # an enum, whose YAML booleans the template writes as true/false
        allowed = {str(v).lower() if isinstance(v, bool) else v for v in entry["enum"]}
        assert {str(c) for c in option.choices} <= allowed
    else:
        assert entry.get("type") == option.json_type


@pytest.mark.parametrize("option", CHARTED, ids=[o.dest for o in CHARTED])
def test_the_deployment_passes_the_value(option: table.Option[Any]) -> None:
    at = _passes(option)
    value = re.compile(rf"\.Values\.{re.escape(option.chart or '')}(?![\w.])")
    window = DEPLOYMENT[max(0, at - NEAR) : at + 2]
    assert any(value.search(line) for line in window), f"{option.dest}: {DEPLOYMENT[at].strip()}"


def test_the_deployment_passes_nothing_the_table_does_not_define() -> None:
    flags = {f for o in table.OPTIONS for f in o.flags}
    envs = {o.env for o in table.OPTIONS if o.env}
    passed_flags = {m.group(1) for line in DEPLOYMENT for m in re.finditer(r"\"(--[a-z-]+)(?:=|\")", line)}
    passed_envs = {m.group(1) for line in DEPLOYMENT for m in re.finditer(r"- name: (ETJ_\w+)", line)}
    assert passed_flags <= flags and passed_envs <= envs

"""The generated CRD: up to date, structural, documented, bounded, and carrying the CEL rules."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from etj_operator.api import crd
from etj_operator.api.crd import SchemaError, structural

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "crds" / crd.CRD_FILE


def _schema() -> dict[str, Any]:
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")


def _fields(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Only object properties: what `kubectl explain` lists."""
    for name, sub in node.get("properties", {}).items():
        yield f"{path}.{name}", sub
        yield from _fields(sub.get("items", sub), f"{path}.{name}")


def test_committed_crd_is_the_generated_one() -> None:
    assert COMMITTED.read_text() == crd.render(), "crds/ is stale: run `etj crd generate`"


def test_committed_docs_are_generated() -> None:
    assert crd.main(["generate", "--check"]) == 0, "crds/ or docs/api.md is stale: run `etj crd generate`"


def test_generation_is_deterministic() -> None:
    # Across processes, not within one: a set or dict whose order follows the string hash seed would
    # render the same twice here and differ in the next `etj crd generate`.
    code = "import sys; from etj_operator.api import crd; sys.stdout.write(crd.render())"
    here = crd.render()
    for seed in ("1", "2"):
        other = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert other == here, f"the CRD renders differently with PYTHONHASHSEED={seed}"


def test_check_mode_reports_stale_files(tmp_path: Path) -> None:
    assert crd.main(["--output-dir", str(tmp_path), "--no-docs", "--check"]) == 1
    assert crd.main(["--output-dir", str(tmp_path), "--no-docs"]) == 0
    assert (tmp_path / crd.CRD_FILE).read_text() == crd.render()
    assert crd.main(["--output-dir", str(tmp_path), "--no-docs", "--check"]) == 0


def test_names_group_version_and_subresources() -> None:
    doc = yaml.safe_load(COMMITTED.read_text())
    spec = doc["spec"]
    assert doc["metadata"]["name"] == "elastictrainingjobs.etj.dev"
    assert spec["group"] == "etj.dev" and spec["scope"] == "Namespaced"
    names = spec["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "ElasticTrainingJob",
        "elastictrainingjobs",
        ["etj"],
    )
    assert names["categories"] == ["training"]  # `kubectl get training` lists the jobs
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas.max"


def test_printer_columns() -> None:
    cols = {c["name"]: c for c in crd.PRINTER_COLUMNS}
    always = [c["name"] for c in crd.PRINTER_COLUMNS if not c.get("priority")]
    # Slack and Finish: where a job with spec.deadline stands against it (issue 28); empty without one.
    # Reason: why the job is or is not Ready, e.g. ImagePullBackOff or Unschedulable (issue 37).
    assert always == ["Phase", "Reason", "Workers", "World", "Epoch", "Step", "Slack", "Finish", "Age"]
    assert cols["Reason"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].reason'
    assert cols["Slack"]["jsonPath"] == ".status.schedule.slackSeconds"
    assert cols["Finish"]["jsonPath"] == ".status.schedule.projectedFinish"
    assert cols["Age"]["type"] == "date"
    schema = _schema()
    for col in crd.PRINTER_COLUMNS:
        node = schema
        # A filter ([?(@.type=="Ready")]) picks list items: step into the list's items.
        path = re.sub(r"\[\?\(.*?\)\]", ".[]", col["jsonPath"])
        for part in path.strip(".").split("."):
            if part in ("metadata",):
                break
            node = node["items"] if part == "[]" else node["properties"][part]  # a declared field


def test_schema_is_structural() -> None:
    for path, node in _walk(_schema()):
        assert "$ref" not in node and "allOf" not in node and "title" not in node, path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "anyOf" not in node and node.get("type"), f"{path} has no single type"
        if "properties" in node:
            assert "additionalProperties" not in node, path
        assert "uniqueItems" not in node, path
        # OpenAPI v3.0 form only: a boolean flag next to minimum/maximum (JSON Schema's numeric form is
        # what pydantic emits for gt/lt; crd.py converts it).
        for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            assert key not in node or (node[key] is True and bound in node), path


def test_every_field_has_a_description() -> None:
    # `.metadata` is the one exception: the apiserver forbids a description there (ObjectMeta is implicit).
    missing = [path for path, node in _fields(_schema()) if not node.get("description", "").strip()]
    assert missing == [".metadata"]
    assert sum(1 for _ in _fields(_schema()["properties"]["spec"])) > 60


def test_every_list_string_and_map_is_bounded() -> None:
    # Unbounded values make the apiserver's CEL cost estimate explode (and let one object grow without
    # limit), so every string/list/map has a maximum, except free-form pass-through objects.
    for path, node in _walk(_schema()):
        kind = node.get("type")
        if kind == "string" and path not in (".apiVersion", ".kind"):
            assert "maxLength" in node or "enum" in node or node.get("format") == "date-time", path
        if kind == "array":
            assert "maxItems" in node, path
        if kind == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path


def test_defaults_are_applied_by_the_apiserver() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    for section in ("placement", "checkpoint", "scaling", "failurePolicy"):
        assert spec[section]["default"] == {}, section
    assert spec["placement"]["properties"]["rendezvous"]["properties"]["capacityTypes"]["default"] == [
        "on-demand"
    ]
    assert spec["trainer"]["properties"]["command"]["default"] == ["etj-train", "worker"]
    assert spec["training"]["properties"]["resizePolicy"]["default"] == "FixedGlobalBatch"


def _rules_at(path: str) -> list[dict[str, str]]:
    node = _schema()
    for part in path.strip(".").split("."):
        node = node["items"] if part == "[]" else node["properties"][part]
    return list(node.get("x-kubernetes-validations", []))


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("spec", "self.training.globalBatchSize >= self.replicas.max"),
        ("spec.replicas", "self.min <= self.max"),
        ("spec.training", "self.microBatchSize <= self.globalBatchSize"),
        ("spec.training.globalBatchSize", "self == oldSelf"),
        ("spec.training.resizePolicy", "self == oldSelf"),
        ("spec.checkpoint", "oldSelf.path"),
        ("spec.checkpoint", "has(self.pvc) && has(self.uri)"),
        ("spec.trainer", "self.volumeMounts.all"),
        ("spec.trainer.env.[]", "ETJ_GLOBAL_BATCH_SIZE"),
    ],
)
def test_cel_rules_present_with_messages(path: str, needle: str) -> None:
    rules = [r for r in _rules_at(path) if needle in r["rule"]]
    assert rules, f"no rule containing {needle!r} at {path}"
    for rule in rules:
        assert rule.get("message") or rule.get("messageExpression")


def test_every_cel_rule_explains_itself() -> None:
    for path, node in _walk(_schema()):
        for rule in node.get("x-kubernetes-validations", []):
            text = rule.get("message") or rule.get("messageExpression") or ""
            assert len(text) > 20, f"{path}: {rule['rule']} needs a message a user understands"


def test_generator_refuses_non_structural_input() -> None:
    with pytest.raises(SchemaError, match="union"):
        structural({"anyOf": [{"type": "integer"}, {"type": "boolean"}], "description": "x"}, {}, ".f")
    with pytest.raises(SchemaError, match="description"):
        structural({"type": "object", "properties": {"a": {"type": "integer"}}}, {}, "")
    with pytest.raises(SchemaError, match="unsupported keyword"):
        structural({"type": "array", "prefixItems": [], "description": "x"}, {}, ".f")


def test_generator_inlines_refs_and_drops_null() -> None:
    defs = {
        "Inner": {
            "type": "object",
            "title": "Inner",
            "properties": {"n": {"type": "integer", "description": "n"}},
        }
    }
    node = {"anyOf": [{"$ref": "#/$defs/Inner"}, {"type": "null"}], "default": None, "description": "outer"}
    assert structural(node, defs, ".x") == {
        "type": "object",
        "description": "outer",
        "properties": {"n": {"type": "integer", "description": "n"}},
    }


def test_python_dash_m_checks_the_committed_files() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "etj_operator.api.crd", "generate", "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_module_entry_point_prints_the_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert crd.main(["--stdout"]) == 0
    assert capsys.readouterr().out == crd.render()

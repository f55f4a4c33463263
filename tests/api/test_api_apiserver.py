"""The CRD on the real kube-apiserver: examples accepted, bad manifests rejected by OpenAPI + CEL with a
message naming the field, immutability, scale/status subresources, printer columns, kubectl explain."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from etj_operator.api import crd
from etj_operator.api.models import (
    CostStatus,
    ElasticTrainingJob,
    ElasticTrainingJobStatus,
    Phase,
    Progress,
    ScheduleStatus,
    set_condition,
)
from etj_testbed.localcluster.crds import wait_established
from tests.api.cases import CASES, UPDATES, Case, Update, valid_job
from tests.plugins.cluster import Cluster

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
# Every ElasticTrainingJob under examples/ (examples/*/job.yaml too; not the Kueue queues beside one).
EXAMPLES = sorted(
    p for p in (REPO / "examples").rglob("*.yaml") if "kind: ElasticTrainingJob" in p.read_text().splitlines()
)


@pytest.fixture(scope="module", autouse=True)
def _committed_crd(cluster: Cluster) -> None:
    """Install this checkout's CRD and wait until the apiserver enforces it.

    The local cluster is shared by every test session on the machine, and another checkout may have
    installed a different revision of the CRD since the session fixture applied ours.
    """
    crd_file = REPO / "crds" / crd.CRD_FILE
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_file))
    wait_established(lambda *a: cluster.kubectl(*a).stdout, f"crd/{crd.CRD_NAME}")
    probe = CASES[[c.id for c in CASES].index("toleration-exists-with-value")].manifest("probe")

    def enforced() -> bool:
        # A CEL-only rejection proves the new schema, rules included, is what serves requests.
        dry = cluster.kubectl(
            "create", "--dry-run=server", "-n", "default", "-f", "-", input=yaml.safe_dump(probe), check=False
        )
        return dry.returncode != 0 and "operator Exists must not set value" in dry.stderr

    cluster.wait_for("the committed CRD to be enforced", enforced, timeout=30)


def _apply(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> Any:
    # kubectl apply asks the server for strict field validation, so unknown fields fail too.
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=False)


def _get(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "elastictrainingjob", name, "-n", namespace, "-o", "json").stdout
    return dict(json.loads(out))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_is_accepted_and_defaulted(cluster: Cluster, namespace: str, path: Path) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", str(path))
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    stored = _get(cluster, namespace, name)
    spec = stored["spec"]
    # The apiserver filled in the defaults the schema declares, down to nested sections: the values the
    # operator's models give the example as written.
    written = ElasticTrainingJob.model_validate(yaml.safe_load(path.read_text()))
    assert spec["placement"]["rendezvous"]["capacityTypes"] == ["on-demand"]
    assert spec["failurePolicy"]["maxFailures"] == written.spec.failure_policy.max_failures
    assert spec["training"]["dynamicSGD"]["rampSteps"] == written.spec.training.dynamic_sgd.ramp_steps
    # What the apiserver stores is what the operator can parse.
    job = ElasticTrainingJob.model_validate(stored)
    assert job.spec.replicas.max >= job.spec.replicas.min


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_manifest_is_rejected_by_the_apiserver(cluster: Cluster, namespace: str, case: Case) -> None:
    result = _apply(cluster, namespace, case.manifest())
    assert result.returncode != 0, f"accepted: {case.id}"
    err = result.stderr
    # The apiserver refused it (kubectl has no client-side schema validation): 422 "is invalid", or 400 for
    # strict field validation ("Error from server (BadRequest)").
    assert "is invalid" in err or "Error from server" in err, err
    assert case.field in err, f"{case.id}: rejection does not name {case.field}:\n{err}"
    assert case.why.lower() in err.lower(), f"{case.id}: rejection does not say {case.why!r}:\n{err}"
    assert "no such key" not in err, err  # CEL must not fail with runtime errors users cannot act on
    listed = cluster.kubectl("get", "etj", "-n", namespace, "-o", "name").stdout
    assert listed.strip() == ""


@pytest.mark.parametrize("update", UPDATES, ids=lambda u: u.id)
def test_update_rules(cluster: Cluster, namespace: str, update: Update) -> None:
    original = valid_job("upd")
    assert _apply(cluster, namespace, original).returncode == 0
    changed = valid_job("upd")
    update.mutate(changed)
    result = _apply(cluster, namespace, changed)
    if not update.rejected:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode != 0, f"{update.id} was accepted"
    assert update.field in result.stderr and update.why in result.stderr, result.stderr
    # The stored object kept its old value.
    stored = _get(cluster, namespace, "upd")["spec"]
    assert stored["training"]["globalBatchSize"] == 64 and stored["checkpoint"]["path"] == "/checkpoints"


def test_scale_subresource_sets_max_and_respects_min(cluster: Cluster, namespace: str) -> None:
    job = valid_job("scaled")
    job["spec"]["replicas"] = {"min": 2, "max": 4}
    assert _apply(cluster, namespace, job).returncode == 0
    cluster.kubectl("scale", "etj/scaled", "-n", namespace, "--replicas=3")
    assert _get(cluster, namespace, "scaled")["spec"]["replicas"] == {"min": 2, "max": 3}
    below = cluster.kubectl("scale", "etj/scaled", "-n", namespace, "--replicas=1", check=False)
    assert below.returncode != 0
    assert "replicas.min must not be greater than replicas.max" in below.stderr, below.stderr


def _status(cluster: Cluster, namespace: str, name: str, status: ElasticTrainingJobStatus) -> Any:
    body = json.dumps({"status": status.to_patch()})
    return cluster.kubectl(
        "patch", "etj", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", body, check=False
    )


def test_status_subresource_and_printer_columns(cluster: Cluster, namespace: str) -> None:
    assert _apply(cluster, namespace, valid_job("cols")).returncode == 0
    status = ElasticTrainingJobStatus(
        phase=Phase.RUNNING,
        desired_replicas=4,
        current_replicas=3,
        world_size=3,
        per_worker_batch=22,
        accumulation_steps=2,
        lr_multiplier=1.0,
        progress=Progress(epoch=2, step=120, samples_seen=7680, samples_per_second=410.5, loss=0.25),
        conditions=set_condition([], "Ready", True, "Training", "3 of 4 workers joined"),
        schedule=ScheduleStatus(
            deadline=datetime(2026, 12, 4, 17, 0, tzinfo=UTC),
            projected_finish=datetime(2026, 12, 4, 15, 30, tzinfo=UTC),
            slack_seconds=-120,
            on_demand_wanted=2,
            reason="BehindSchedule",
        ),
        cost=CostStatus(usd=12.5, price_source="spec.prices"),
    )
    result = _status(cluster, namespace, "cols", status)
    assert result.returncode == 0, result.stderr
    table = cluster.kubectl("get", "etj", "-n", namespace).stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "PHASE",
        "REASON",  # the Ready condition's reason: why a job is not running (issue 37)
        "WORKERS",
        "WORLD",
        "EPOCH",
        "STEP",
        "SLACK",
        "FINISH",
        "AGE",
    ]
    row = ["cols", "Running", "Training", "3/4", "3", "2", "120", "-120", "2026-12-04T15:30:00Z"]
    assert table[1].split()[:9] == row
    wide = cluster.kubectl("get", "etj", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-5:] == ["SAMPLES/S", "LOSS", "POLICY", "COST", "AGE"]
    assert wide[1].split()[-5:-1] == ["410.5", "0.25", "FixedGlobalBatch", "12.5"]
    # The category and the short name both reach the job.
    assert "cols" in cluster.kubectl("get", "training", "-n", namespace, "-o", "name").stdout
    # Status is validated too: the operator cannot write a phase the schema does not know.
    bad = cluster.kubectl(
        "patch",
        "etj",
        "cols",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"phase": "Exploded"}}',
        check=False,
    )
    assert bad.returncode != 0 and "status.phase" in bad.stderr, bad.stderr


def _explain_fields(text: str) -> set[str]:
    """Field paths from `kubectl explain --recursive` (indentation = nesting)."""
    paths: set[str] = set()
    stack: list[tuple[int, str]] = []
    in_fields = False
    for line in text.splitlines():
        if line.startswith("FIELDS:"):
            in_fields = True
            continue
        match = re.match(r"^( +)([A-Za-z0-9]+)\s+<", line) if in_fields else None
        if not match:
            continue
        indent, name = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, name))
        paths.add(".".join(n for _, n in stack))
    return paths


def _schema_fields(node: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for name, sub in node.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        out[path] = str(sub.get("description", ""))
        out.update(_schema_fields(sub.get("items", sub), path))
    return out


def test_kubectl_explain_documents_every_spec_field(cluster: Cluster) -> None:
    schema = crd.openapi_schema()["properties"]["spec"]
    expected = _schema_fields(schema)
    recursive = cluster.kubectl("explain", "elastictrainingjob.spec", "--recursive").stdout
    assert _explain_fields(recursive) == set(expected)

    def explain(path: str) -> tuple[str, str]:
        return path, cluster.kubectl("explain", f"elastictrainingjob.spec.{path}").stdout

    with ThreadPoolExecutor(max_workers=4) as pool:
        outputs = dict(pool.map(explain, sorted(expected)))
    for path, description in expected.items():
        text = " ".join(outputs[path].split())
        assert "DESCRIPTION:" in outputs[path], path
        # kubectl wraps long descriptions; compare on normalised whitespace.
        assert " ".join(description.split())[:60] in text, f"{path}: description missing in kubectl explain"


def test_status_model_round_trips_through_the_apiserver(cluster: Cluster, namespace: str) -> None:
    assert _apply(cluster, namespace, valid_job("rt")).returncode == 0
    status = ElasticTrainingJobStatus(phase=Phase.RESIZING, desired_replicas=2, current_replicas=1)
    status.conditions = set_condition([], "Resizing", True, "SpotInterruption", "worker lost")
    assert _status(cluster, namespace, "rt", status).returncode == 0
    stored = ElasticTrainingJob.model_validate(_get(cluster, namespace, "rt"))
    assert stored.status is not None and stored.status.phase is Phase.RESIZING
    assert stored.status.conditions[0].reason == "SpotInterruption"


def test_vendored_kubernetes_schemas_are_the_local_apiservers(cluster: Cluster) -> None:
    """The pass-through fields' schemas (api/k8s_schemas.json) are what this apiserver's OpenAPI says."""
    from etj_operator.api import k8s_schema

    openapi = json.loads(cluster.kubectl("get", "--raw", "/openapi/v3/api/v1").stdout)
    fresh = k8s_schema.extract(openapi)
    assert fresh == json.loads(k8s_schema.SCHEMA_FILE.read_text()), (
        "regenerate: kubectl get --raw /openapi/v3/api/v1 > /tmp/v1.json; "
        "python -m etj_operator.api.k8s_schema /tmp/v1.json; etj crd generate"
    )

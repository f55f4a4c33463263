"""A job the operator's model refuses gets a condition and an Event, and its pods are left alone (issue 37
item 5). Seen on kind: a CRD newer than the operator (a new field with a default) made the operator log
"has an invalid spec ... Extra inputs are not permitted" every 30 s, and nothing else.

Here the installed CRD is made to allow a field the operator does not know (``spec`` keeps unknown fields),
as a newer CRD would, and restored after.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from etj_operator.api.models import GROUP, PLURAL, VERSION
from tests.integration.opbed import Bed, OperatorProcess, job_manifest
from tests.plugins.cluster import Cluster

CRD = f"{PLURAL}.{GROUP}"
KEEP_UNKNOWN = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/x-kubernetes-preserve-unknown-fields"


@pytest.fixture
def newer_crd(cluster: Cluster) -> Iterator[None]:
    def patch(op: dict[str, Any]) -> None:
        cluster.kubectl("patch", "crd", CRD, "--type=json", "-p", json.dumps([op]))

    patch({"op": "add", "path": KEEP_UNKNOWN, "value": True})
    try:
        yield
    finally:
        patch({"op": "remove", "path": KEEP_UNKNOWN})


@pytest.mark.cluster
def test_a_spec_the_operator_cannot_read_gets_a_condition_and_one_event(
    newer_crd: None, bed: Bed, cluster: Cluster, tmp_path: Path
) -> None:
    op = OperatorProcess(cluster.kubeconfig, bed.ns, tmp_path / "operator.log").start()
    try:
        bed.node("spot-0", "spot")
        bed.node("od-0", "on-demand", gpus=0)
        body = job_manifest("newer", bed.ns, max_workers=1, newField="a default a newer CRD gave")
        bed.custom.create_namespaced_custom_object(GROUP, VERSION, bed.ns, PLURAL, body)

        def ready() -> dict[str, Any]:
            conds = bed.status("newer").get("conditions") or []
            return next((c for c in conds if c.get("type") == "Ready"), {})

        bed.wait("Ready False, InvalidSpec", lambda: ready().get("reason") == "InvalidSpec")
        assert ready()["status"] == "False"
        assert "spec.newField: Extra inputs are not permitted" in ready()["message"]
        assert "a default a newer CRD gave" not in ready()["message"]
        bed.wait("its Warning Event", lambda: any(e.reason == "InvalidSpec" for e in bed.events("newer")))
        # The operator keeps retrying; the same error is not said again, and the job's pods are not made.
        bed.wait("another reconcile", lambda: op.logs().count("has an invalid spec") >= 2, timeout=120)
        (event,) = [e for e in bed.events("newer") if e.reason == "InvalidSpec"]
        assert event.type == "Warning" and (event.count or 1) == 1
        assert "spec.newField" in event.message
        assert not bed.pods("newer") and not bed.pods("newer", "rendezvous")
    finally:
        op.stop()
        print(op.logs())

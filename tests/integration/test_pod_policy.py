"""--forbid-host-path on the real apiserver (issue 37 item 5): a job with a hostPath trainer volume gets the
ReplicaFailure condition, reason HostPathForbidden, and a Warning Event; no pod is created. A job without
one, beside it, runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from etj_operator.api.models import GROUP, PLURAL, VERSION
from tests.integration.opbed import Bed, OperatorProcess, job_manifest
from tests.plugins.cluster import Cluster


@pytest.mark.cluster
def test_a_host_path_job_is_refused_where_the_operator_forbids_them(
    bed: Bed, cluster: Cluster, tmp_path: Path
) -> None:
    op = OperatorProcess(cluster.kubeconfig, bed.ns, tmp_path / "operator.log", "--forbid-host-path").start()
    try:
        bed.node("spot-0", "spot")
        bed.node("spot-1", "spot")
        bed.node("od-0", "on-demand", gpus=0)
        trainer = {
            "image": "ghcr.io/etj-dev/etj-trainer:test",
            "resources": {"gpu": 1},
            "volumes": [{"name": "host", "hostPath": {"path": "/etc"}}],
            "volumeMounts": [{"name": "host", "mountPath": "/host-etc"}],
        }
        body = job_manifest("hostpath", bed.ns, max_workers=1, trainer=trainer)
        bed.custom.create_namespaced_custom_object(GROUP, VERSION, bed.ns, PLURAL, body)
        bed.create_job("plain", max_workers=1)

        def refused() -> dict[str, Any] | None:
            conds = bed.status("hostpath").get("conditions") or []
            return next((c for c in conds if c.get("reason") == "HostPathForbidden"), None)

        bed.wait("the HostPathForbidden condition", lambda: refused() is not None)
        cond = refused() or {}
        assert (cond["type"], cond["status"]) == ("ReplicaFailure", "True")
        assert "trainer.volumes host: hostPath volumes are forbidden" in cond["message"]
        bed.wait(
            "its Warning Event",
            lambda: any(
                e.reason == "HostPathForbidden" and e.type == "Warning" for e in bed.events("hostpath")
            ),
        )
        bed.wait("the plain job's worker", lambda: bool(bed.pods("plain")))
        assert not bed.pods("hostpath") and not bed.pods("hostpath", "rendezvous")
    finally:
        op.stop()
        print(op.logs())

"""`kubectl scale` reaches a running job's processes (issue 15), on the real apiserver: the operator tells the
job's store (a real `etj-train store` process on a process node) the new bounds, where the agents and rank
0 that started with the old maximum read them (tests/trainer/test_local_launcher.py::
test_kubectl_scale_grows_the_running_world shows the world growing from there)."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from etj_contract.ports import PROGRESS_PORT
from etj_contract.replicas import REPLICAS_PATH
from etj_operator.api.models import GROUP, PLURAL, VERSION
from etj_testbed.localcluster.proclet import Proclet, process_node, selector_for
from etj_trainer.progress import get_json
from tests.integration.opbed import TEST_LABEL, Bed, OperatorProcess, job_manifest
from tests.plugins.cluster import Cluster

pytestmark = pytest.mark.cluster


def test_kubectl_scale_reaches_the_jobs_store(bed: Bed, cluster: Cluster, tmp_path: Path) -> None:
    instance = f"p{uuid.uuid4().hex[:6]}"
    proclet = Proclet(cluster.kubeconfig, root=tmp_path / "proclet", selector=selector_for(instance)).start()
    op = OperatorProcess(
        cluster.kubeconfig, bed.ns, tmp_path / "operator.log", "--progress-seconds=1"
    ).start()
    store_node = f"{bed.ns}-store"[:63]
    try:
        for i in range(4):
            bed.node(f"spot-{i}", "spot")
        node = process_node(
            store_node,
            "on-demand",
            gpus=0,
            instance=instance,
            labels={TEST_LABEL: bed.ns},
            taints=[{"key": TEST_LABEL, "value": bed.ns, "effect": "NoSchedule"}],
        )
        cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
        bed.custom.create_namespaced_custom_object(
            GROUP, VERSION, bed.ns, PLURAL, job_manifest("sc", bed.ns, max_workers=2)
        )

        def store_ip() -> str | None:
            pods = [p for p in bed.pods("sc", "rendezvous") if p.status.phase == "Running"]
            return pods[0].status.pod_ip if pods and pods[0].status.pod_ip else None

        bed.wait("the store process running", lambda: store_ip() is not None, 180)
        secret: Any = bed.core.read_namespaced_secret("sc-etj-token", bed.ns)
        token = base64.b64decode(secret.data["token"]).decode()
        url = f"http://{store_ip()}:{PROGRESS_PORT}{REPLICAS_PATH}"
        bed.wait("the store told 1..2", lambda: get_json(url, token=token) == {"min": 1, "max": 2}, 60)
        cluster.kubectl("scale", "elastictrainingjob", "sc", "-n", bed.ns, "--replicas=4")
        bed.wait("the store told 1..4", lambda: get_json(url, token=token) == {"min": 1, "max": 4}, 60)
        bed.wait("4 worker pods", lambda: len(bed.running_workers("sc")) == 4, 60)
    finally:
        op.stop()
        print(op.logs())
        proclet.stop()
        cluster.kubectl("delete", "node", store_node, "--wait=false", check=False)

"""`kubectl scale` reaches a running job's processes (issue 15), on the real apiserver: the operator tells the
job's store (a real `etj-train store` process on a process node) the new bounds, where the agents and rank
0 that started with the old maximum read them (tests/trainer/test_local_launcher.py::
test_kubectl_scale_grows_the_running_world shows the world growing from there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from etj_contract.ports import PROGRESS_PORT
from etj_contract.replicas import REPLICAS_PATH
from etj_operator.api.models import GROUP, PLURAL, VERSION
from etj_trainer.core.progress import get_json
from tests.integration.opbed import Bed, job_manifest, operator_and_a_store_node, running_store_ip
from tests.plugins.cluster import Cluster

pytestmark = pytest.mark.cluster


def test_kubectl_scale_reaches_the_jobs_store(bed: Bed, cluster: Cluster, tmp_path: Path) -> None:
    with operator_and_a_store_node(bed, cluster, tmp_path):
        for i in range(4):
            bed.node(f"spot-{i}", "spot")
        bed.custom.create_namespaced_custom_object(
            GROUP, VERSION, bed.ns, PLURAL, job_manifest("sc", bed.ns, max_workers=2)
        )
        bed.wait("the store process running", lambda: running_store_ip(bed, "sc") is not None, 180)
        token = bed.token("sc")
        url = f"http://{running_store_ip(bed, 'sc')}:{PROGRESS_PORT}{REPLICAS_PATH}"
        bed.wait("the store told 1..2", lambda: get_json(url, token=token) == {"min": 1, "max": 2}, 60)
        cluster.kubectl("scale", "elastictrainingjob", "sc", "-n", bed.ns, "--replicas=4")
        bed.wait("the store told 1..4", lambda: get_json(url, token=token) == {"min": 1, "max": 4}, 60)
        bed.wait("4 worker pods", lambda: len(bed.running_workers("sc")) == 4, 60)

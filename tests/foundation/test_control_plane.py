"""The local control plane is real: apiserver, pinned version, scheduler + kwok run GPU pods, RBAC."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.plugins.cluster import Cluster

from etj_testbed.localcluster.fake_nodes import fake_gpu_node
from etj_testbed.localcluster.toolchain import KUBERNETES_VERSION

pytestmark = pytest.mark.cluster


def _gpu_pod(name: str, gpus: int) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "trainer:local",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def _pod(cluster: Cluster, ns: str, name: str) -> dict[str, object]:
    out = cluster.kubectl("get", "pod", name, "-n", ns, "-o", "json")
    pod: dict[str, object] = json.loads(out.stdout)
    return pod


def test_apiserver_is_ready_and_runs_the_pinned_version(cluster: Cluster) -> None:
    assert cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith(KUBERNETES_VERSION), version["serverVersion"]


def test_all_control_plane_components_are_healthy(cluster: Cluster) -> None:
    # The apiserver's own checks include etcd; controller-manager and scheduler are seen by their work below.
    checks = cluster.kubectl("get", "--raw", "/readyz?verbose").stdout
    assert "[+]etcd ok" in checks
    assert "[+]poststarthook/rbac/bootstrap-roles ok" in checks


def test_gpu_pod_is_bound_by_the_scheduler_to_a_kwok_gpu_node_and_runs(
    cluster: Cluster, namespace: str
) -> None:
    gpu_node = f"{namespace}-gpu"
    cpu_node = f"{namespace}-cpu"
    nodes = [fake_gpu_node(gpu_node, "spot", gpus=1), fake_gpu_node(cpu_node, "on-demand", gpus=0)]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(nodes))
    try:
        cluster.wait_for(
            "kwok to mark the GPU node Ready",
            lambda: (
                "True"
                in cluster.kubectl(
                    "get", "node", gpu_node, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
                ).stdout
            ),
        )
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_gpu_pod("train", 1)))
        cluster.wait_for(
            "the GPU pod to be Running",
            lambda: _pod(cluster, namespace, "train")["status"].get("phase") == "Running",  # type: ignore[attr-defined]
        )
        pod = _pod(cluster, namespace, "train")
        # The scheduler, not a test shortcut, chose the only node with a free GPU.
        assert pod["spec"]["nodeName"] == gpu_node  # type: ignore[index]
        events = cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=train", "-o", "json"
        ).stdout
        assert any(
            e["reason"] == "Scheduled"
            and e.get("reportingComponent", e.get("source", {}).get("component")) in ("default-scheduler",)
            for e in json.loads(events)["items"]
        )
        # A second GPU pod does not fit: the real scheduler's resource accounting keeps it Pending.
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_gpu_pod("second", 1)))
        cluster.wait_for(
            "the scheduler to report Insufficient nvidia.com/gpu",
            lambda: "Insufficient nvidia.com/gpu" in json.dumps(_pod(cluster, namespace, "second")["status"]),
        )
        assert _pod(cluster, namespace, "second")["status"]["phase"] == "Pending"  # type: ignore[index]
    finally:
        cluster.kubectl("delete", "node", gpu_node, cpu_node, "--wait=false", check=False)


def test_rbac_and_service_account_tokens_are_enforced(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    sa = f"system:serviceaccount:{namespace}:default"
    can_i = cluster.kubectl("auth", "can-i", "list", "pods", "-n", namespace, "--as", sa, check=False)
    assert can_i.stdout.strip() == "no"
    token = cluster.kubectl("create", "token", "default", "-n", namespace).stdout.strip()
    assert token.count(".") == 2  # a signed JWT from the TokenRequest API
    as_sa = Cluster(cluster.token_kubeconfig(token, tmp_path / "sa.kubeconfig"), cluster.kubectl_bin)
    # The token authenticates (whoami answers with the SA) but RBAC forbids listing pods.
    who = as_sa.kubectl("auth", "whoami", "-o", "json")
    assert json.loads(who.stdout)["status"]["userInfo"]["username"] == sa
    denied = as_sa.kubectl("get", "pods", "-n", namespace, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    cluster.kubectl(
        "create",
        "rolebinding",
        "view",
        "--clusterrole=view",
        f"--serviceaccount={namespace}:default",
        "-n",
        namespace,
    )
    cluster.wait_for(
        "the RoleBinding to take effect",
        lambda: as_sa.kubectl("get", "pods", "-n", namespace, check=False).returncode == 0,
    )
    # Still namespaced: the binding grants nothing cluster-wide.
    assert as_sa.kubectl("get", "nodes", check=False).returncode != 0


def test_cluster_up_is_idempotent(cluster: Cluster) -> None:
    import sys

    again = subprocess.run(
        [sys.executable, "-m", "etj_testbed.cli", "cluster", "up"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == str(cluster.kubeconfig)

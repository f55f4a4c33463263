"""The chart as `helm install` left it on kind (`scripts/kind.sh install`): the operator runs in-cluster under
Pod Security "restricted", with the chart's RBAC and no more."""

from __future__ import annotations

import pytest

from tests.kind.kindbed import KindBed, kubectl

pytestmark = [pytest.mark.kind]

RELEASE, NAMESPACE = "etj", "etj-system"  # scripts/kind.sh's defaults


def can_i(kind: KindBed, *args: str) -> str:
    account = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
    out = kubectl(kind, "auth", "can-i", *args, f"--as={account}", timeout=60)
    return out.stdout.strip()


def test_the_operator_runs_in_cluster_with_only_the_charts_rbac(kind: KindBed) -> None:
    pods = kind.pods(NAMESPACE, f"app.kubernetes.io/instance={RELEASE}")
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert running, [p["status"].get("phase") for p in pods]
    ns = kind.kube.get(f"/api/v1/namespaces/{NAMESPACE}")
    assert ns["metadata"]["labels"].get("pod-security.kubernetes.io/enforce") == "restricted"
    assert can_i(kind, "create", "pods", "--namespace", "default") == "yes"
    status = ("patch", "elastictrainingjobs.etj.dev", "--subresource=status", "--namespace", "default")
    assert can_i(kind, *status) == "yes"
    assert can_i(kind, "get", "secrets", "--all-namespaces") == "no"
    assert can_i(kind, "delete", "nodes") == "no"

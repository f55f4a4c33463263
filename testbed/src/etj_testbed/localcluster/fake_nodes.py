"""Manifests for simulated GPU nodes: kwok-managed ones for tests and benchmarks.

A node annotated `kwok.x-k8s.io/node: fake` is kept Ready by kwok, and pods the scheduler binds to it go
Running without a container runtime. Labels mimic the cloud node pools the operator reads.
"""

from __future__ import annotations

from typing import Any

# Capacity-type labels as each provider writes them (see docs/operator.md).
PROVIDER_NODE_LABELS: dict[str, dict[str, dict[str, str]]] = {
    "eks": {
        "spot": {"eks.amazonaws.com/capacityType": "SPOT"},
        "on-demand": {"eks.amazonaws.com/capacityType": "ON_DEMAND"},
    },
    "karpenter": {
        "spot": {"karpenter.sh/capacity-type": "spot"},
        "on-demand": {"karpenter.sh/capacity-type": "on-demand"},
    },
    "gke": {"spot": {"cloud.google.com/gke-spot": "true"}, "on-demand": {}},
    "aks": {"spot": {"kubernetes.azure.com/scalesetpriority": "spot"}, "on-demand": {}},
}


def fake_gpu_node(
    name: str,
    capacity_type: str = "on-demand",
    gpus: int = 1,
    provider: str = "eks",
    pool: str = "gpu",
    cpu: str = "8",
    memory: str = "64Gi",
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A kwok-managed Node with `gpus` × nvidia.com/gpu, labelled like `provider`'s `capacity_type` pool."""
    resources = {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "etj.dev/pool": pool,
                "nvidia.com/gpu.count": str(gpus),
                **PROVIDER_NODE_LABELS[provider][capacity_type],
                **(labels or {}),
            },
        },
        "spec": {"taints": list(taints or [])},
        "status": {"allocatable": resources, "capacity": resources},
    }

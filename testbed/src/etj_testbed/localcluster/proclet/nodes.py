"""Process-backed Node manifests and the status the harness posts for them."""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.rest import ApiException

from etj_testbed.localcluster.fake_nodes import fake_gpu_node
from etj_testbed.localcluster.proclet.kube import MERGE, Kube, now_micro, now_rfc3339
from etj_testbed.localcluster.toolchain import KUBERNETES_VERSION

log = logging.getLogger("etj.proclet")

JSON = dict[str, Any]
NODE_RUNTIME_LABEL = "etj.dev/node-runtime"
NODE_RUNTIME_PROCESS = "process"
# Optional label naming which harness instance owns a node, so parallel harnesses (tests, the demo) on
# one cluster never run each other's pods: start each with selector `...,etj.dev/proclet=<instance>`.
INSTANCE_LABEL = "etj.dev/proclet"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# A node annotated with this many seconds makes every pod that starts on it wait that long before its first
# container runs, as a kubelet pulling a large image would (the chaos bench's slow store start-up).
PULL_SECONDS_ANNOTATION = "etj.dev/proclet-image-pull-seconds"


def process_node(
    name: str,
    capacity_type: str = "on-demand",
    gpus: int = 1,
    provider: str = "eks",
    instance: str | None = None,
    **kwargs: Any,
) -> JSON:
    """A Node run by the process harness, labelled like `provider`'s `capacity_type` pool.

    Same labels and resources as `fake_gpu_node` (the operator cannot tell them apart), minus the kwok
    annotation: kwok would otherwise claim the node and fake its pods' status.
    """
    node = fake_gpu_node(name, capacity_type, gpus, provider, **kwargs)
    annotations = node["metadata"]["annotations"]
    annotations.pop(KWOK_ANNOTATION, None)
    labels = node["metadata"]["labels"]
    labels["type"] = "process"
    labels[NODE_RUNTIME_LABEL] = NODE_RUNTIME_PROCESS
    if instance:
        labels[INSTANCE_LABEL] = instance
    return node


def pull_seconds(node: JSON | None) -> float:
    """The simulated image pull of a pod starting on ``node``: its annotation, 0 when absent or unreadable."""
    raw = (((node or {}).get("metadata") or {}).get("annotations") or {}).get(PULL_SECONDS_ANNOTATION)
    try:
        return max(0.0, float(raw)) if raw is not None else 0.0
    except ValueError:
        log.warning("node %s: %s=%r is not a number of seconds; no pull delay",
                    (node or {}).get("metadata", {}).get("name"), PULL_SECONDS_ANNOTATION, raw)  # fmt: skip
        return 0.0


def selector_for(instance: str | None = None) -> str:
    base = f"{NODE_RUNTIME_LABEL}={NODE_RUNTIME_PROCESS}"
    return f"{base},{INSTANCE_LABEL}={instance}" if instance else base


def _condition(node: JSON, ctype: str, status: str, reason: str, message: str, now: str) -> JSON:
    old = next(
        (c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), None
    )
    since = old["lastTransitionTime"] if old and old.get("status") == status else now
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": since,
    }


def node_status_patch(node: JSON, now: str) -> JSON:
    """A strategic-merge patch making the node Ready, as the kubelet's status sync does."""
    name = node["metadata"]["name"]
    status = node.get("status") or {}
    default = {"cpu": "8", "memory": "64Gi", "pods": "110"}
    patch: JSON = {
        "conditions": [
            _condition(node, "MemoryPressure", "False", "KubeletHasSufficientMemory", "enough memory", now),
            _condition(node, "DiskPressure", "False", "KubeletHasNoDiskPressure", "enough disk", now),
            _condition(node, "PIDPressure", "False", "KubeletHasSufficientPID", "enough PIDs", now),
            _condition(node, "Ready", "True", "KubeletReady", "proclet is posting ready status", now),
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": name,
            "systemUUID": name,
            "bootID": name,
            "kernelVersion": "",
            "osImage": "etj proclet",
            "containerRuntimeVersion": "proclet://1",
            "kubeletVersion": KUBERNETES_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }
    # Nodes created without resources (not by process_node) still need some for the scheduler.
    if not status.get("capacity"):
        patch["capacity"] = default
    if not status.get("allocatable"):
        patch["allocatable"] = status.get("capacity") or default
    return {"status": patch}


def post_node_status(kube: Kube, node: JSON) -> bool:
    name = node["metadata"]["name"]
    try:
        kube.patch(f"/api/v1/nodes/{name}/status", node_status_patch(node, now_rfc3339()))
        return True
    except Exception as exc:
        log.warning("node %s: status write failed: %s", name, exc)
        return False


def renew_lease(kube: Kube, node: JSON, duration_s: int) -> None:
    """Renew (or create) the node's Lease in kube-node-lease: the heartbeat the node lifecycle controller
    reads; without it the node turns NotReady after kcm's --node-monitor-grace-period."""
    meta = node["metadata"]
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{meta['name']}"
    spec = {"holderIdentity": meta["name"], "leaseDurationSeconds": duration_s, "renewTime": now_micro()}
    try:
        try:
            kube.patch(path, {"spec": spec}, content_type=MERGE)
        except ApiException as exc:
            if exc.status != 404:
                raise
            # Owned by the node, like the kubelet's: the garbage collector removes it with the node.
            owner = {"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta["uid"]}
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": meta["name"],
                    "namespace": "kube-node-lease",
                    "ownerReferences": [owner],
                },
                "spec": spec,
            }
            kube.request("POST", path.rsplit("/", 1)[0], body=lease)
    except Exception as exc:
        log.warning("node %s: lease renewal failed: %s", meta["name"], exc)

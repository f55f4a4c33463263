"""Whether the job's NetworkPolicy is enforced: the operator cannot see it (an unenforcing CNI stores the
object and ignores it), so the cluster's owner declares it (the chart's ``networkPolicy.enforced``,
``--network-policy-enforced``) and ``etj check network-policy`` verifies it (docs/operator.md, Threat model).

Pure: the Warning each job gets unless enforcement is declared; the check's probe pod and its verdict.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from etj_contract.ports import PROGRESS_PORT
from etj_operator.decide.types import KubeEvent

NOT_ENFORCED = "NetworkPolicyNotEnforced"
CHECK = "etj check network-policy"


class Enforced(StrEnum):
    UNKNOWN = "unknown"  # not declared (the default): a Warning asks to verify and declare it
    TRUE = "true"  # declared enforced (verified with the check): no Warning
    FALSE = "false"  # declared not enforced (e.g. EKS's VPC CNI without its policy agent)


def enforcement_warning(
    enforced: Enforced, *, network_policy: bool, namespace: str, job: str
) -> KubeEvent | None:
    """The Warning a job gets when its NetworkPolicy is not declared enforced; None when it is."""
    if enforced == Enforced.TRUE:
        return None
    exposed = (
        "every pod of the cluster can reach this job's store (TCPStore 29400, progress 29401) and its "
        "workers' collectives; the token guards progress and the rendezvous, not the collectives"
    )
    if not network_policy:
        what = "the operator makes no NetworkPolicy for this job (--no-network-policy)"
    elif enforced == Enforced.FALSE:
        what = "NetworkPolicy is declared not enforced in this cluster (networkPolicy.enforced: false)"
    else:
        what = "whether this cluster enforces NetworkPolicy is not declared (networkPolicy.enforced: unknown)"
    how = f"verify with `{CHECK} -n {namespace} {job}`, then set networkPolicy.enforced"
    return KubeEvent("Warning", NOT_ENFORCED, f"{what}: unless it is enforced, {exposed}; {how}")


# The probe's exit codes: it reached the store's port, or it did not within PROBE_TIMEOUT_S.
REACHED, NOT_REACHED = 0, 3
PROBE_TIMEOUT_S = 5
PROBE = (
    "import socket,sys\n"
    "try:\n"
    f"    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout={PROBE_TIMEOUT_S}).close()\n"
    "except OSError as e:\n"
    "    print('not reached:', e); sys.exit(%d)\n"
    "print('reached'); sys.exit(%d)\n"
) % (NOT_REACHED, REACHED)


def probe_pod(*, name: str, namespace: str, store: dict[str, Any], store_ip: str) -> dict[str, Any]:
    """A pod outside the job (none of its labels), on its store pod's node (``store``: the store pod as a
    dict) and run from its image, that tries to open the store's progress port: the job's NetworkPolicy
    admits only the job's pods and the operator there, so where it is enforced the probe cannot connect."""
    spec = store.get("spec") or {}
    container = (spec.get("containers") or [{}])[0]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "probe",
                "image": container.get("image"),
                "imagePullPolicy": container.get("imagePullPolicy", "IfNotPresent"),
                "command": ["python", "-c", PROBE, store_ip, str(PROGRESS_PORT)],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
        # On the store's own node: NetworkPolicy holds between pods of one node too, and the probe then
        # runs wherever the store can (its tolerations).
        **({"nodeName": spec["nodeName"]} if spec.get("nodeName") else {}),
        **({"tolerations": spec["tolerations"]} if spec.get("tolerations") else {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "etj-network-policy-probe"},
        },
        "spec": pod_spec,
    }


def verdict(exit_code: int | None, *, namespace: str, job: str) -> tuple[int, str]:
    """The check's exit status and what it says, from the probe's exit code (None: it did not run)."""
    port = f"{job}'s store port {PROGRESS_PORT}"
    if exit_code == REACHED:
        return (
            1,
            f"NOT ENFORCED: a pod outside job {job} reached {port} in {namespace}; "
            "set networkPolicy.enforced: false",
        )
    if exit_code == NOT_REACHED:
        return 0, (
            f"enforced: a pod outside job {job} could not reach {port} in {namespace} within "
            f"{PROBE_TIMEOUT_S} s while the store was Ready; set networkPolicy.enforced: true"
        )
    return 2, f"inconclusive: the probe did not run to its end (exit code {exit_code}); see its pod's events"

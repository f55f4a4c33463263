"""The names, labels and owner references of what a job owns: pods, the store's Service, the token Secret.

Pure; the planner, the manifests and the reconciler agree on names through these functions only.
"""

from __future__ import annotations

from typing import Any

from etj_operator.api.models import API_VERSION, KIND
from etj_operator.constants import LABEL_JOB, LABEL_MANAGED_BY, LABEL_ROLE, MANAGED_BY, ROLE_WORKER


def worker_name(job: str, slot: int) -> str:
    return f"{job}-worker-{slot}"


def rendezvous_name(job: str) -> str:
    """The store's Service (a stable address); its pods are ``rendezvous_pod_name``."""
    return f"{job}-rdzv"


def rendezvous_pod_name(job: str, index: int) -> str:
    """Each replacement store pod gets a fresh name: a lost one may stay Terminating on a dead node, and
    a fixed name would keep the job without a store until it is gone. The Service selects by label."""
    return f"{rendezvous_name(job)}-{index}"


def rendezvous_index(job: str, pod: str) -> int | None:
    """The index in a store pod's name; -1 for the fixed name older operators used; None if not ours."""
    base = rendezvous_name(job)
    if pod == base:
        return -1
    tail = pod.removeprefix(base + "-")
    return int(tail) if tail != pod and tail.isdigit() else None


def rendezvous_host(job: str, namespace: str) -> str:
    return f"{rendezvous_name(job)}.{namespace}.svc"


def legacy_token_secret_name(job: str) -> str:
    """The token Secret's name before issue 37: guessable, so anyone allowed to create Secrets in the
    namespace could make it first. Operators before it wrote it; their pods still name it (it stays owned by
    the job, with the same token, until the job is deleted)."""
    return f"{job}-etj-token"


# The key of the job's Secret that holds the progress token.
TOKEN_KEY = "token"


def worker_selector(job: str) -> str:
    return f"{LABEL_JOB}={job},{LABEL_ROLE}={ROLE_WORKER}"


def owner_reference(job: str, uid: str) -> dict[str, Any]:
    # controller + blockOwnerDeletion: the garbage collector deletes the pods with the job, and
    # foreground deletion of the job waits for them.
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned_metadata(name: str, *, job: str, namespace: str, uid: str, role: str) -> dict[str, Any]:
    """Metadata of an object the job owns besides its pods (Service, Secret, policies): its labels, and
    the owner reference through which the garbage collector removes it with the job."""
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels(job, role),
        "ownerReferences": [owner_reference(job, uid)],
    }


def labels(job: str, role: str) -> dict[str, str]:
    return {
        LABEL_JOB: job,
        LABEL_ROLE: role,
        LABEL_MANAGED_BY: MANAGED_BY,
        "app.kubernetes.io/name": "etj",
        "app.kubernetes.io/instance": job,
    }

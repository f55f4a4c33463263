"""The job's own objects besides its pods: the closed data plane (docs/operator.md, "Threat model": the
progress token, the Secret that carries it to the pods, the NetworkPolicy that admits only the job's own
pods and the operator) and the store's PodDisruptionBudget.

Pure builders, like manifests.py (pod_env.py puts the token into the pods' env by Secret name).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from etj_contract.ports import PROGRESS_PORT
from etj_operator.constants import LABEL_JOB, LABEL_ROLE, ROLE_RENDEZVOUS
from etj_operator.decide.objects.names import TOKEN_KEY, owned_metadata, rendezvous_name


def network_policy_name(job: str) -> str:
    return f"{job}-etj"


def job_token(key: bytes, *, namespace: str, job: str, uid: str) -> str:
    """The job's progress token: HMAC-SHA256 of its identity under the operator's key.

    Derived, not stored: a restarted operator knows every job's token without reading any Secret (its
    RBAC may create Secrets but never read them), and the uid makes a re-created job's token new.
    """
    digest = hmac.new(key, f"{namespace}/{job}/{uid}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


# Hex digits of the token Secret's name suffix: 40 bits, not to be guessed before the job exists.
SECRET_SUFFIX_HEX = 10


def token_secret_name(key: bytes, *, namespace: str, job: str, uid: str) -> str:
    """The job's token Secret's name, ``<job>-etj-token-<10 hex>``: HMAC-SHA256 of the job's identity under
    the operator's key, in a domain of its own (the name is public, the token is not: no bit of the token
    is in it). Nobody without the key can name it before the operator creates it, so a 409 on it is the
    operator's own earlier create, never a Secret someone made first (docs/operator.md, "Threat model").
    Derived like the token: a restarted operator (same key) names the same Secret without reading any."""
    message = f"secret-name\0{namespace}/{job}/{uid}".encode()
    digest = hmac.new(key, message, hashlib.sha256).hexdigest()
    return f"{job}-etj-token-{digest[:SECRET_SUFFIX_HEX]}"


def operator_peer(namespace: str | None, pod_labels: Mapping[str, str]) -> dict[str, Any] | None:
    """The NetworkPolicyPeer selecting the operator's pods; None when its namespace is unknown."""
    if not namespace:
        return None
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "podSelector": {"matchLabels": dict(pod_labels)},
    }


def token_secret(*, name: str, job: str, namespace: str, uid: str, token: str) -> dict[str, Any]:
    """The job's Secret ``name`` (``token_secret_name``): the progress token its store requires and its pods
    send (docs/operator.md)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": owned_metadata(name, job=job, namespace=namespace, uid=uid, role=ROLE_RENDEZVOUS),
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }


def network_policy(
    *, job: str, namespace: str, uid: str, operator_peer: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Ingress to the job's pods only from the job's own pods (any port: NCCL/Gloo pick theirs) and, on
    the progress port only, from the operator (``operator_peer``: a NetworkPolicyPeer; None: the operator's
    address is unknown, e.g. it runs outside the cluster, so the progress port is open to every source and
    the token alone guards it). Egress stays open: workers read datasets and object stores."""
    own = {"podSelector": {"matchLabels": {LABEL_JOB: job}}}
    progress_port = {"protocol": "TCP", "port": PROGRESS_PORT}
    operator_rule: dict[str, Any] = {"ports": [progress_port]}
    if operator_peer is not None:
        operator_rule["from"] = [dict(operator_peer)]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": owned_metadata(
            network_policy_name(job), job=job, namespace=namespace, uid=uid, role=ROLE_RENDEZVOUS
        ),
        "spec": {
            "podSelector": {"matchLabels": {LABEL_JOB: job}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [own]}, operator_rule],
        },
    }


def store_disruption_budget(*, job: str, namespace: str, uid: str) -> dict[str, Any]:
    """maxUnavailable 0 over the store pod: evictions (``kubectl drain``, Karpenter, the cluster autoscaler)
    wait instead of taking the rendezvous away unannounced. The operator moves the store when the node is
    cordoned or tainted for going away: it starts a replacement, switches the Service to it once Ready and
    then deletes the old store (no eviction: decide/plan/store_move.py), which lets the drain finish. Not
    minAvailable 1: that would let the eviction through as soon as the replacement is Ready, possibly
    before the Service is switched; a bare pod's maxUnavailable 0 never allows one."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owned_metadata(
            rendezvous_name(job), job=job, namespace=namespace, uid=uid, role=ROLE_RENDEZVOUS
        ),
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": {LABEL_JOB: job, LABEL_ROLE: ROLE_RENDEZVOUS}},
        },
    }

"""An object with a name of the job's own that the job does not own is refused, not adopted (issue 37 item 5):
``ensure`` took the create's 409 for success, so a Secret someone made first became the job's token (they
know it: they can join as a rank) and a NetworkPolicy someone made first became the job's policy.

The NetworkPolicy (and the Service, the PodDisruptionBudget: the same code) is read as metadata and refused
when the job does not own it. The Secret cannot be read (the operator has no ``get`` on Secrets): its name
is derived from the operator's key, so a Secret made first under the old, guessable name is simply not the
job's, and nobody can make one under the new name first.

On the real apiserver: the foreign object exists before the job; the job gets the ReplicaFailure condition
(reason ObjectConflict) and a Warning Event naming the kind and the object, no pod is created, and the
foreign object is left as it was. Deleting it lets the job go on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from etj_operator.decide.objects.names import legacy_token_secret_name
from etj_operator.decide.objects.pod_env import token_secret_of
from tests.integration.opbed import Bed, OperatorProcess
from tests.plugins.cluster import Cluster


def _secret(ns: str, name: str) -> client.V1Secret:
    return client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, namespace=ns, labels={"made-by": "someone-else"}),
        string_data={"token": "a-token-someone-else-knows"},
    )


def _policy(ns: str, name: str) -> client.V1NetworkPolicy:
    return client.V1NetworkPolicy(
        metadata=client.V1ObjectMeta(name=name, namespace=ns, labels={"made-by": "someone-else"}),
        spec=client.V1NetworkPolicySpec(pod_selector=client.V1LabelSelector(), policy_types=["Ingress"]),
    )


# kind: (its object's name for job "taken", how to make it, how to read it, how to delete it)
FOREIGN: dict[str, tuple[str, Callable[[str, str], Any], str]] = {
    "NetworkPolicy": ("taken-etj", _policy, "namespaced_network_policy"),
}


def _api(bed: Bed, kind: str) -> Any:
    return client.NetworkingV1Api(bed.cluster.api_client())


@pytest.mark.cluster
@pytest.mark.parametrize("kind", FOREIGN)
def test_a_foreign_object_with_the_jobs_name_is_refused_and_left_alone(
    kind: str, bed: Bed, cluster: Cluster, tmp_path: Path
) -> None:
    name, make, verbs = FOREIGN[kind]
    api = _api(bed, kind)
    getattr(api, f"create_{verbs}")(bed.ns, make(bed.ns, name))
    before = getattr(api, f"read_{verbs}")(name, bed.ns)
    op = OperatorProcess(cluster.kubeconfig, bed.ns, tmp_path / "operator.log").start()
    try:
        bed.node("spot-0", "spot")
        bed.node("od-0", "on-demand", gpus=0)
        bed.create_job("taken", max_workers=1)

        def conflict() -> dict[str, Any] | None:
            conds = bed.status("taken").get("conditions") or []
            return next((c for c in conds if c.get("reason") == "ObjectConflict"), None)

        bed.wait("the ObjectConflict condition", lambda: conflict() is not None)
        cond = conflict() or {}
        assert (cond["type"], cond["status"]) == ("ReplicaFailure", "True")
        assert f"{kind} {bed.ns}/{name} exists, with no owner, not by this job" in cond["message"]
        bed.wait(
            "its Warning Event",
            lambda: any(e.reason == "ObjectConflict" and e.type == "Warning" for e in bed.events("taken")),
        )
        (event,) = [e for e in bed.events("taken") if e.reason == "ObjectConflict"]  # once, not per retry
        assert f"{kind} {bed.ns}/{name}" in event.message
        # No pod starts with someone else's token or policy, and their object is as they made it.
        assert not bed.pods("taken") and not bed.pods("taken", "rendezvous")
        after = getattr(api, f"read_{verbs}")(name, bed.ns)
        assert after.metadata.resource_version == before.metadata.resource_version
        assert not after.metadata.owner_references

        # Once it is deleted, the job's own object is made and the job goes on.
        getattr(api, f"delete_{verbs}")(name, bed.ns)
        bed.wait("the job's pods", lambda: bool(bed.pods("taken")), timeout=120)
        bed.wait("the condition cleared", lambda: conflict() is None)
        owned = getattr(api, f"read_{verbs}")(name, bed.ns)
        assert owned.metadata.owner_references[0].uid == (bed.job("taken") or {})["metadata"]["uid"]
    finally:
        op.stop()
        print(op.logs())


@pytest.mark.cluster
def test_a_secret_made_first_under_the_old_token_name_is_not_the_jobs(
    bed: Bed, cluster: Cluster, tmp_path: Path
) -> None:
    """Before: ``<job>-etj-token`` made first by someone else was taken as the job's, and every pod read their
    token. Now the job's Secret has a name derived from the operator's key: the pods name it, and it holds
    the job's own token; the one made first is left as it was."""
    name = legacy_token_secret_name("taken")
    bed.core.create_namespaced_secret(bed.ns, _secret(bed.ns, name))
    before: Any = bed.core.read_namespaced_secret(name, bed.ns)
    op = OperatorProcess(cluster.kubeconfig, bed.ns, tmp_path / "operator.log").start()
    try:
        bed.node("spot-0", "spot")
        bed.node("od-0", "on-demand", gpus=0)
        bed.create_job("taken", max_workers=1)
        bed.wait(
            "worker and store pods", lambda: bool(bed.pods("taken")) and bool(bed.pods("taken", "rendezvous"))
        )
        uid = (bed.job("taken") or {})["metadata"]["uid"]
        pods = [*bed.pods("taken"), *bed.pods("taken", "rendezvous")]
        named = {token_secret_of(client.ApiClient().sanitize_for_serialization(p)) for p in pods}
        assert len(named) == 1 and name not in named, named
        assert bed.token("taken") != "a-token-someone-else-knows"
        (own,) = named
        secret: Any = bed.core.read_namespaced_secret(str(own), bed.ns)
        assert [o.uid for o in secret.metadata.owner_references] == [uid]
        after: Any = bed.core.read_namespaced_secret(name, bed.ns)
        assert after.metadata.resource_version == before.metadata.resource_version
        assert not after.metadata.owner_references
    finally:
        op.stop()
        print(op.logs())

"""The job's own objects besides its pods, made before any pod (a pod must never start without its token or
outside its policy): the store's Service, the token Secret, the store's PodDisruptionBudget and the
NetworkPolicy. Thin I/O over decide/objects/dataplane.py and decide/objects/manifests.py."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

import kopf

from etj_operator.decide.objects import dataplane, manifests
from etj_operator.decide.objects.netpol import enforcement_warning
from etj_operator.decide.plan.planner import JobView, Plan
from etj_operator.k8s.client import KubeClient
from etj_operator.k8s.settings import Settings


def token_secret_name(settings: Settings, job: JobView) -> str:
    """The name of the job's token Secret, as unguessable as its token (dataplane.token_secret_name)."""
    return dataplane.token_secret_name(settings.token_key, namespace=job.namespace, job=job.name, uid=job.uid)


async def ensure_job_objects(
    kube: KubeClient, settings: Settings, job: JobView, result: Plan, token: str
) -> list[Any]:
    """Create each of the job's objects unless it exists; the outcomes (None or the exception), in order."""
    ids = {"job": job.name, "namespace": job.namespace, "uid": job.uid}
    bodies = [
        manifests.rendezvous_service(**ids, store=result.serve_rendezvous),
        dataplane.token_secret(name=token_secret_name(settings, job), **ids, token=token),
        dataplane.store_disruption_budget(**ids),
    ]
    if settings.network_policy:
        peer = dataplane.operator_peer(settings.operator_namespace, dict(settings.operator_pod_labels))
        bodies.append(dataplane.network_policy(**ids, operator_peer=peer))
    return await asyncio.gather(*(kube.ensure(b) for b in bodies), return_exceptions=True)


def warn_unless_enforced(body: Mapping[str, Any] | None, settings: Settings, job: JobView) -> bool:
    """Post the job's NetworkPolicyNotEnforced Warning unless enforcement is declared
    (decide/objects/netpol.py);
    whether one was posted. The caller posts it once per job and operator start."""
    event = enforcement_warning(
        settings.network_policy_enforced,
        network_policy=settings.network_policy,
        namespace=job.namespace,
        job=job.name,
    )
    if event is None or body is None:
        return False
    kopf.event(cast(kopf.Body, body), type=event.type, reason=event.reason, message=event.message[:1000])
    return True

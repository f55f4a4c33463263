"""The thin I/O layer: the few Kubernetes calls a plan needs, with retries and request counting.

Uses the official (synchronous) client in worker threads; every call is idempotent from the caller's
point of view (create tolerates AlreadyExists, delete tolerates NotFound), which is what makes a
restarted or repeated reconcile safe.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable
from typing import Any, TypeVar, cast

from kubernetes import client
from kubernetes.client.rest import ApiException

from etj_operator.api.models import GROUP, PLURAL, VERSION
from etj_operator.k8s.metrics import METRICS, Metrics
from etj_operator.observe.workloads import KUEUE_GROUP, KUEUE_VERSION

log = logging.getLogger(__name__)
T = TypeVar("T")

# Transient API answers worth retrying: conflicts, throttling, server errors.
RETRYABLE = frozenset({409, 429, 500, 502, 503, 504})


class StatusConflict(Exception):
    """A status write named a resourceVersion the job no longer has (409): it was computed from an older
    job, and must be computed again."""


class ForeignObject(Exception):
    """An object with the name of one of the job's own (Service, Secret, NetworkPolicy, ...) exists and the
    job does not own it: someone else made it, and adopting it would hand the job their token or policy."""

    def __init__(self, kind: str, namespace: str, name: str, owners: list[str]) -> None:
        owned = f"owned by {', '.join(owners)}" if owners else "with no owner"
        super().__init__(
            f"{kind} {namespace}/{name} exists, {owned}, not by this job: the job's pods wait until it is "
            "deleted (the operator does not adopt or change it)"
        )


# Metadata only: an ownership check needs no more (and reads no Secret: ensure).
METADATA_ONLY = {"Accept": "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"}


def foreign_owners(wanted: dict[str, Any], found: dict[str, Any]) -> list[str] | None:
    """None if ``found`` (an existing object's metadata) is owned by the owner ``wanted`` names (its
    ownerReferences' uids); otherwise who owns it instead, as "Kind/name" (an empty list: nobody)."""
    uids = {o.get("uid") for o in wanted.get("ownerReferences") or []}
    owners = found.get("ownerReferences") or []
    if any(o.get("uid") in uids for o in owners):
        return None
    return [f"{o.get('kind')}/{o.get('name')}" for o in owners]


def _drained(response: Any) -> bool:
    """Read a raw response to the end so urllib3 returns the connection to the pool."""
    _ = response.data
    return True


class KubeClient:
    """Pod and Service calls pass ``_preload_content=False``: the client would otherwise turn every
    response into model objects, milliseconds of CPU per call that nobody reads, on the drain path."""

    def __init__(self, api_client: client.ApiClient, metrics: Metrics = METRICS, attempts: int = 5) -> None:
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)
        self.metrics = metrics
        self.attempts = attempts

    async def _call(
        self, verb: str, resource: str, fn: Callable[[], T], *, ok: frozenset[int] = frozenset()
    ) -> T | None:
        """Run ``fn`` in a thread; return None for an expected status in ``ok``; retry transient errors."""
        delay = 0.1
        for attempt in range(self.attempts):
            self.metrics.api_requests.labels(verb, resource).inc()
            try:
                return await asyncio.to_thread(fn)
            except ApiException as exc:
                if exc.status in ok:
                    return None
                if exc.status not in RETRYABLE or attempt == self.attempts - 1:
                    raise
                log.debug("%s %s: %s, retrying", verb, resource, exc.status)
            await asyncio.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 2.0)
        return None  # pragma: no cover  (the loop either returns or raises)

    async def create_pod(self, body: dict[str, Any]) -> bool:
        """Create a pod; False when a pod of that name already exists (deterministic names)."""
        ns = body["metadata"]["namespace"]
        done = await self._call(
            "create",
            "pods",
            lambda: _drained(self.core.create_namespaced_pod(ns, cast(Any, body), _preload_content=False)),
            ok=frozenset({409}),
        )
        return done is not None

    async def delete_pod(self, namespace: str, name: str, *, uid: str | None, grace: int | None) -> bool:
        """Graceful delete (SIGTERM, then SIGKILL after ``grace``); False if it was already gone.

        The uid precondition makes sure a retried or late drain never hits a newer pod that reuses
        the name; a precondition failure (409) means the pod we meant is gone already.
        """
        opts = client.V1DeleteOptions(
            grace_period_seconds=grace,
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
        )

        def call() -> Any:
            return _drained(
                self.core.delete_namespaced_pod(name, namespace, body=opts, _preload_content=False)
            )

        self.metrics.api_requests.labels("delete", "pods").inc()
        try:
            await asyncio.to_thread(call)
            return True
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            if exc.status in RETRYABLE:
                done = await self._call("delete", "pods", call, ok=frozenset({404, 409}))
                return done is not None
            raise

    async def ensure(self, body: dict[str, Any]) -> None:
        """Create one of the job's own objects (Service, Secret, NetworkPolicy, ...) unless it exists; if one
        of that name exists that the job does not own, raise ``ForeignObject`` (issue 37: a 409 was taken
        for success, so a policy someone made first became the job's policy).

        The existing object is read as metadata only. A Secret is never read at all (the operator has no
        ``get`` on Secrets: docs/operator.md, RBAC): its name is derived from the operator's key
        (dataplane.token_secret_name), so nobody else can have made it first and a 409 is our own.
        """
        meta = body["metadata"]
        ns, name, kind = meta["namespace"], meta["name"], body["kind"]
        calls: dict[str, tuple[str, Callable[..., Any], Callable[..., Any] | None]] = {
            "Service": (
                "services",
                self.core.create_namespaced_service,
                self.core.read_namespaced_service,
            ),
            "Secret": ("secrets", self.core.create_namespaced_secret, None),
            "NetworkPolicy": (
                "networkpolicies",
                self.networking.create_namespaced_network_policy,
                self.networking.read_namespaced_network_policy,
            ),
            "PodDisruptionBudget": (
                "poddisruptionbudgets",
                self.policy.create_namespaced_pod_disruption_budget,
                self.policy.read_namespaced_pod_disruption_budget,
            ),
        }
        resource, create, read = calls[kind]
        created = await self._call(
            "create",
            resource,
            lambda: _drained(create(ns, cast(Any, body), _preload_content=False)),
            ok=frozenset({409}),
        )
        if created or read is None:
            return
        found = await self._call(
            "get",
            resource,
            lambda: json.loads(read(name, ns, _preload_content=False, _headers=METADATA_ONLY).data),
            ok=frozenset({404}),  # gone since: the next check creates it
        )
        owners = foreign_owners(meta, (found or {}).get("metadata") or {}) if found else None
        if owners is not None:
            raise ForeignObject(kind, ns, name, owners)

    async def select_store(self, namespace: str, service: str, selector: dict[str, str]) -> bool:
        """Point the job's store Service at ``selector`` (a merge patch: it only ever adds or changes the
        store index); False if the Service does not exist (yet)."""
        body = {"spec": {"selector": selector}}
        done = await self._call(
            "patch",
            "services",
            lambda: _drained(
                self.core.patch_namespaced_service(service, namespace, body, _preload_content=False)
            ),
            ok=frozenset({404}),
        )
        return done is not None

    async def patch_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str | None = None
    ) -> dict[str, Any] | None:
        """Merge-patch the status subresource (lists replaced whole: callers send full lists); None: the job
        is gone.

        With ``resource_version`` the patch applies only to that version of the job (optimistic
        concurrency): the status was computed from it, and its counters (failures, resizes) are absolute
        numbers, so a patch over a newer status (another operator replica, a user's edit) would lose or
        double-count. A conflict is not retried (the same patch would conflict again): it raises
        ``StatusConflict`` and the caller plans again from the job as it is now.
        """
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}

        def patch() -> object:
            try:
                return self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, PLURAL, name, body
                )
            except ApiException as exc:
                if exc.status == 409 and resource_version:
                    raise StatusConflict(f"{namespace}/{name} changed since {resource_version}") from exc
                raise

        result = await self._call("patch", "elastictrainingjobs/status", patch, ok=frozenset({404}))
        return result if isinstance(result, dict) else None

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job as the apiserver has it now (after a status conflict); None: gone."""
        result = await self._call(
            "get",
            PLURAL,
            lambda: self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name),
            ok=frozenset({404}),
        )
        return result if isinstance(result, dict) else None

    async def create_workload(self, body: dict[str, Any]) -> bool:
        """Create one of a job's Kueue Workloads; False when it exists already (deterministic names)."""
        ns = body["metadata"]["namespace"]
        done = await self._call(
            "create",
            "workloads",
            lambda: self.custom.create_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, ns, "workloads", body
            ),
            ok=frozenset({409}),
        )
        return done is not None

    async def delete_workload(self, namespace: str, name: str) -> None:
        """Delete a job's Workload (gone already is fine): Kueue gives its quota back."""
        await self._call(
            "delete",
            "workloads",
            lambda: self.custom.delete_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", name, propagation_policy="Background"
            ),
            ok=frozenset({404}),
        )

    async def delete_job(self, namespace: str, name: str) -> None:
        # Background propagation: the garbage collector removes the pods and the service.
        await self._call(
            "delete",
            PLURAL,
            lambda: self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Background"
            ),
            ok=frozenset({404}),
        )

"""Leader election: several operator replicas, one active, the others standing by (issue 26).

The Kubernetes client's own election (``kubernetes.leaderelection``) on a ``coordination.k8s.io/v1`` Lease,
the object kube-controller-manager and controller-runtime use, rather than kopf's peering: peering pauses
lower-priority operators by a priority list, without a lease that expires when its holder dies.

Semantics, as controller-runtime's:

- a replica that does not hold the Lease does nothing but retry it every ``retry_s``;
- the holder renews it; if it cannot renew within ``renew_s`` it exits at once (the kubelet restarts it as
  a follower) rather than keep acting while another replica may already be: ``lease_s`` > ``renew_s``
  leaves that gap for the exit;
- a holder that stops (SIGTERM, a rolling update) releases the Lease so a standby takes over at its next
  retry, not a whole ``lease_s`` later; one killed outright is replaced once its Lease expires.

The Lease calls go through the operator's ``TimedApiClient``: a hung renew cannot keep a dead leader's
claim alive.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = logging.getLogger(__name__)

LEASE_NAME = "etj-operator"


@dataclass(frozen=True)
class Election:
    namespace: str
    identity: str
    name: str = LEASE_NAME
    lease_s: int = 15  # a dead leader's Lease is taken over this long after its last renew
    renew_s: int = 10  # the leader gives up (exits) when it could not renew for this long
    retry_s: int = 2  # followers try, and the leader renews, this often


def default_identity() -> str:
    """The pod's name (unique among replicas, readable in the Lease), plus a suffix for restarts."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}-{uuid.uuid4().hex[:6]}"


def _lock(election: Election, api: client.ApiClient) -> LeaseLock:
    lock = LeaseLock(election.name, election.namespace, election.identity)
    lock.api_instance = client.CoordinationV1Api(api)
    return lock


def holder(election: Election, api: client.ApiClient) -> str | None:
    """Who holds the Lease now (None: nobody, or no Lease yet)."""
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(election.name, election.namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return lease.spec.holder_identity if lease.spec else None


def release(election: Election, api: client.ApiClient) -> bool:
    """Hand the Lease back if this replica holds it: a standby acquires it at its next retry. The
    replace carries the Lease's resourceVersion, so it cannot clear a claim someone else just made."""
    leases = client.CoordinationV1Api(api)
    try:
        lease = leases.read_namespaced_lease(election.name, election.namespace)
        if not lease.spec or lease.spec.holder_identity != election.identity:
            return False
        lease.spec.holder_identity = None
        leases.replace_namespaced_lease(election.name, election.namespace, lease)
    except ApiException as e:
        log.warning("could not release the leader Lease %s/%s: %s", election.namespace, election.name, e)
        return False
    log.info("released the leader Lease %s/%s", election.namespace, election.name)
    return True


def lead(
    election: Election,
    api: client.ApiClient,
    work: Callable[[], None],
    on_lost: Callable[[], None],
) -> None:
    """Block until this replica holds the Lease, then run ``work`` in a thread while renewing it.

    ``on_lost`` runs when a renew fails for ``renew_s`` (or ``work`` raised); the caller exits there.
    """
    def _work() -> None:
        log.info("%s leads: the operator starts", election.identity)
        work()

    cfg = electionconfig.Config(
        _lock(election, api),
        lease_duration=election.lease_s,
        renew_deadline=election.renew_s,
        retry_period=election.retry_s,
        onstarted_leading=_work,
        onstopped_leading=on_lost,
    )
    log.info("%s stands by for the Lease %s/%s", election.identity, election.namespace, election.name)
    leaderelection.LeaderElection(cfg).run()

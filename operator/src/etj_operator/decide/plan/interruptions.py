"""Which pods must go because their node (or the pod itself) is going away: pure, from signals and time.

Used by the planner's steps for workers and for the rendezvous store alike.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from etj_operator.decide.plan.model import Observed
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason, Signal

# A pod bound to a node the index has never seen is only "on a deleted node" after this long: watches
# of different resources are not ordered, so a fresh node may reach us after the pod bound to it.
NODE_MISSING_GRACE = timedelta(seconds=60)
# A NotReady node (kubelet restart, network blip, an overloaded control plane) often recovers within
# seconds; draining would cost a resize for nothing. Kubernetes itself evicts only after 300 s.
NOT_READY_GRACE = timedelta(seconds=60)
# Signals that drain workers but leave the store where it is: a rebalance recommendation is a hint. The
# store moves on everything that says its node is being emptied, a cordon included (issue 26): `kubectl
# drain`, managed node group upgrades and the termination handler all cordon first, and evict next, which
# the store's PodDisruptionBudget refuses; staying would block them until someone deleted the store by
# hand. The store moves make-before-break (decide/plan/store_move.py): a re-rendezvous (at most the step in
# flight), and nothing at all for a cordon undone before the replacement is Ready.
STORE_STAYS_ON = frozenset({Reason.REBALANCE_RECOMMENDATION})


def interruption_of(pod: PodInfo, obs: Observed) -> Signal | None:
    """Why this pod must be drained now, if anything says its node (or the pod) is going away."""
    if pod.signal is not None:
        return pod.signal
    if pod.node is None:
        return None
    node = obs.nodes.get(pod.node)
    if node is None:
        if pod.node in obs.deleted_nodes:
            return Signal(Reason.NODE_DELETED, f"node {pod.node} was deleted", obs.deleted_nodes[pod.node])
        bound = pod.scheduled_at or pod.created
        if bound is not None and obs.now - bound > NODE_MISSING_GRACE:
            return Signal(Reason.NODE_DELETED, f"node {pod.node} no longer exists")
        return None
    if node.signal is not None and node.signal.reason == Reason.NODE_NOT_READY:
        return node.signal if not_ready_wait(node.signal, obs.now) == 0 else None
    return node.signal


def not_ready_wait(signal: Signal, now: datetime) -> float:
    """Seconds until a NotReady signal counts (0: it counts now)."""
    if signal.since is None:
        return NOT_READY_GRACE.total_seconds()
    return max(0.0, (signal.since + NOT_READY_GRACE - now).total_seconds())

"""Interruption signals: what tells the operator that a worker is about to lose its node.

Pure functions of Node and Pod bodies. A signal means "drain the workers there now, while the notice
period still leaves time for the trainer's just-in-time checkpoint" — never "fail the job".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from etj_operator.timeutil import parse_time


class Reason(StrEnum):
    """Why a worker was drained or a resize happened (Event reasons, status reasons, metric labels)."""

    SPOT_INTERRUPTION = "SpotInterruption"
    REBALANCE_RECOMMENDATION = "RebalanceRecommendation"
    SCHEDULED_MAINTENANCE = "ScheduledMaintenance"
    ASG_TERMINATION = "ASGLifecycleTermination"
    NODE_DISRUPTED = "NodeDisrupted"  # Karpenter consolidation/drift/expiry
    NODE_TERMINATING = "NodeTerminating"  # GKE impending termination
    NODE_CORDONED = "NodeCordoned"
    NODE_NOT_READY = "NodeNotReady"
    NODE_DELETED = "NodeDeleted"
    NODE_LOST = "NodeLost"  # the container vanished with its machine (the kubelet came back without it)
    POD_DISRUPTED = "PodDisrupted"  # DisruptionTarget condition set by kubelet/taint manager/eviction
    # The kube-scheduler preempted the worker for a higher-priority pod (another job's min worker: the
    # sharing rule, decide/plan/sharing.py). A planned shrink of an elastic job, never a failure: not in
    # INTERRUPTIONS, so failurePolicy.countInterruptions does not count it either.
    PREEMPTED = "Preempted"
    # Kueue evicted the extra seat's Workload the worker ran under (preempted, or lent quota reclaimed: docs/
    # kueue.md): a planned shrink like the scheduler's preemption, never a failure (not in INTERRUPTIONS).
    KUEUE_PREEMPTED = "KueuePreempted"
    # Kueue evicted the job's base Workload (its replicas.min): the job stops like a suspend and queues again.
    KUEUE_EVICTED = "KueueEvicted"
    # The job's base Workload is not admitted (yet, or no more): it keeps no worker and no store meanwhile.
    KUEUE_QUEUED = "KueueQueued"
    WORKER_FAILED = "WorkerFailed"
    # A Pending worker created to avoid a node no longer avoided (expired, or dropped by the cap): recreated.
    AVOIDANCE_EXPIRED = "AvoidanceExpired"
    CAPACITY_ADDED = "CapacityAdded"
    WORKER_LOST = "WorkerLost"  # a worker stopped and nothing we saw said why (e.g. deleted by hand)
    SCALED_BY_USER = "ScaledByUser"
    EXCESS_WORKER = "ExcessWorker"
    SUSPENDED = "Suspended"
    FINISHED = "JobFinished"
    FAILED = "JobFailed"
    # The deadline policy (decide/deadline/policy.py): on-demand workers leave first when spot returns or the
    # job
    # is ahead; pending spot pods give way to the on-demand workers it asks for.
    ON_DEMAND_RELEASED = "OnDemandReleased"
    REPLACED_BY_ON_DEMAND = "ReplacedByOnDemand"
    # A store pod started to replace one whose move was called off (its node uncordoned): store_move.py.
    STORE_NOT_NEEDED = "StoreNotNeeded"


# Taint key → reason, in priority order: when a node carries several, the first one names the drain.
INTERRUPTION_TAINTS: tuple[tuple[str, Reason], ...] = (
    ("aws-node-termination-handler/spot-itn", Reason.SPOT_INTERRUPTION),
    ("aws-node-termination-handler/asg-lifecycle-termination", Reason.ASG_TERMINATION),
    ("aws-node-termination-handler/scheduled-maintenance", Reason.SCHEDULED_MAINTENANCE),
    ("aws-node-termination-handler/rebalance-recommendation", Reason.REBALANCE_RECOMMENDATION),
    ("karpenter.sh/disrupted", Reason.NODE_DISRUPTED),
    ("karpenter.sh/disruption", Reason.NODE_DISRUPTED),  # pre-v1 Karpenter: disruption=disrupting
    ("cloud.google.com/impending-node-termination", Reason.NODE_TERMINATING),
    ("node.kubernetes.io/unreachable", Reason.NODE_NOT_READY),
    ("node.kubernetes.io/not-ready", Reason.NODE_NOT_READY),
)

# Reasons that count as interruptions (not failures) for the failure budget and the latency metric.
INTERRUPTIONS = frozenset(
    {
        Reason.SPOT_INTERRUPTION,
        Reason.REBALANCE_RECOMMENDATION,
        Reason.SCHEDULED_MAINTENANCE,
        Reason.ASG_TERMINATION,
        Reason.NODE_DISRUPTED,
        Reason.NODE_TERMINATING,
        Reason.NODE_CORDONED,
        Reason.NODE_NOT_READY,
        Reason.NODE_DELETED,
        Reason.NODE_LOST,
        Reason.POD_DISRUPTED,
    }
)

# The DisruptionTarget reason the kube-scheduler sets on a pod it preempts (k8s.io/api/core/v1).
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"

# A container's terminated reason when the runtime no longer knows it: the machine died under it (a power
# loss, a killed VM or kind node) and the kubelet, back up, reports the container gone, not a process exit.
# containerd says "Unknown" with exit code 255; the kubelet itself "ContainerStatusUnknown" with 137.
LOST_CONTAINER_REASONS = frozenset({"Unknown", "ContainerStatusUnknown"})


@dataclass(frozen=True)
class Signal:
    reason: Reason
    message: str
    since: datetime | None = None  # when the source says it started (taint timeAdded), if it says


def node_signal(body: Mapping[str, Any]) -> Signal | None:
    """The strongest interruption signal on a Node, or None for a healthy node."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    name = meta.get("name", "")
    if meta.get("deletionTimestamp"):
        return Signal(
            Reason.NODE_DELETED, f"node {name} is being deleted", parse_time(meta["deletionTimestamp"])
        )
    taints = {t.get("key"): t for t in spec.get("taints") or []}
    for key, reason in INTERRUPTION_TAINTS:
        taint = taints.get(key)
        if taint is not None:
            return Signal(reason, f"node {name} has taint {key}", parse_time(taint.get("timeAdded")))
    if spec.get("unschedulable"):
        # NTH and EKS always cordon before draining, so a cordon alone is a drain notice.
        return Signal(Reason.NODE_CORDONED, f"node {name} is cordoned")
    return None


def pod_signal(body: Mapping[str, Any]) -> Signal | None:
    """Why a pod ended or must end, when the pod itself says so: a DisruptionTarget condition (something else
    decided to terminate it), or a container lost with its machine."""
    for cond in (body.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            why = cond.get("reason") or "DisruptionTarget"
            return Signal(
                Reason.PREEMPTED if why == PREEMPTION_BY_SCHEDULER else Reason.POD_DISRUPTED,
                f"pod has DisruptionTarget ({why}): {cond.get('message') or ''}".rstrip(": "),
                parse_time(cond.get("lastTransitionTime")),
            )
    for cs in (body.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated") or {}
        if terminated.get("reason") in LOST_CONTAINER_REASONS:
            return Signal(
                Reason.NODE_LOST,
                f"its container was lost with its node ({terminated['reason']}, exit code "
                f"{terminated.get('exitCode')}), not ended by the trainer",
                parse_time(terminated.get("finishedAt")),
            )
    return None

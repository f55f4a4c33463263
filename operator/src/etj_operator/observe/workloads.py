"""What the operator needs to know about Kueue's objects (docs/kueue.md), parsed once when an index sees them:
the job's own Workloads, the ResourceFlavors they are admitted on, and WorkloadPriorityClasses' values.

Pure functions of the bodies (``kueue.x-k8s.io/v1beta2``, what Kueue v0.17 serves and stores).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from etj_operator.constants import LABEL_CAPACITY, LABEL_JOB

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
# The labels a Kueue user puts on a job (Kueue's own names: jobframework reads them from every job kind).
QUEUE_LABEL = f"{KUEUE_GROUP}/queue-name"
PRIORITY_CLASS_LABEL = f"{KUEUE_GROUP}/priority-class"


@dataclass(frozen=True)
class WorkloadInfo:
    """One of a job's Workloads, as the planner reads it."""

    name: str
    job: str = ""  # the etj.dev/job label: whose Workload it is
    count: int = 1  # pods of its one podSet
    admitted: bool = False  # Admitted=True: quota reserved and every admission check passed
    # Evicted=True: Kueue took the admission back (preempted, quota reclaimed, deactivated, ...). Kueue's
    # reason and message, "Preempted: ..."; None while it is not evicted.
    evicted: str | None = None
    # Why it waits, while it waits: QuotaReserved=False's message ("couldn't assign flavors ...").
    pending: str = ""
    flavors: tuple[str, ...] = ()  # the ResourceFlavors its podSet was admitted on
    cluster_queue: str = ""
    deleting: bool = False  # deletionTimestamp set
    uid: str = ""
    # The etj.dev/capacity label: the capacity type the seat is pinned to ("on-demand": one of the deadline
    # policy's on-demand seats, docs/kueue.md); "" when Kueue may pick any flavor the job allows.
    capacity: str = ""


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def workload_info(body: Mapping[str, Any]) -> WorkloadInfo:
    meta = body.get("metadata") or {}
    spec, status = body.get("spec") or {}, body.get("status") or {}
    labels = meta.get("labels") or {}
    admitted = _condition(status, "Admitted")
    evicted = _condition(status, "Evicted")
    reserved = _condition(status, "QuotaReserved")
    admission = status.get("admission") or {}
    flavors: list[str] = []
    for assignment in admission.get("podSetAssignments") or []:
        flavors += [str(f) for f in (assignment.get("flavors") or {}).values() if f not in flavors]
    pod_sets = spec.get("podSets") or [{}]
    evicted_by = None
    if evicted is not None and evicted.get("status") == "True":
        evicted_by = f"{evicted.get('reason') or 'Evicted'}: {evicted.get('message') or ''}".rstrip(": ")
    pending = ""
    if reserved is not None and reserved.get("status") == "False":
        pending = str(reserved.get("message") or reserved.get("reason") or "")
    return WorkloadInfo(
        name=meta.get("name", ""),
        job=labels.get(LABEL_JOB, ""),
        count=int(pod_sets[0].get("count") or 1),
        admitted=admitted is not None and admitted.get("status") == "True",
        evicted=evicted_by,
        pending=pending,
        flavors=tuple(flavors),
        cluster_queue=str(admission.get("clusterQueue") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        uid=meta.get("uid", ""),
        capacity=str(labels.get(LABEL_CAPACITY) or ""),
    )


@dataclass(frozen=True)
class FlavorInfo:
    """A ResourceFlavor: the node labels and tolerations Kueue gives the pods admitted on it."""

    name: str
    node_labels: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...] = ()


def flavor_info(body: Mapping[str, Any]) -> FlavorInfo:
    spec = body.get("spec") or {}
    return FlavorInfo(
        name=(body.get("metadata") or {}).get("name", ""),
        node_labels={str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()},
        tolerations=tuple(dict(t) for t in spec.get("tolerations") or []),
    )


def priority_value(body: Mapping[str, Any]) -> int:
    """A WorkloadPriorityClass's value."""
    return int(body.get("value") or 0)

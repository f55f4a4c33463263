"""The Kueue Workloads a job goes through Kueue with (docs/kueue.md, "How etj goes through Kueue"), as plain
dicts, and where a worker admitted on a seat runs.

A job has one base Workload (one podSet of ``replicas.min`` pods: below min the job cannot train, so the
base is all or nothing) and one Workload per extra worker (one pod each, one priority lower), so Kueue's
preemption, which always takes whole Workloads, takes one extra worker at a time and the base last.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from etj_operator.api.models import CapacityType, ElasticTrainingJobSpec
from etj_operator.constants import LABEL_CAPACITY, LABEL_JOB
from etj_operator.decide.objects.manifests import worker_resources
from etj_operator.decide.objects.names import labels, owner_reference
from etj_operator.decide.objects.placement import capacity_affinity, capacity_tolerations
from etj_operator.observe.workloads import KUEUE_GROUP, KUEUE_VERSION

BASE_SEAT = "base"
EXTRA_SEAT = "x"  # extra seats are x0, x1, ...: the lowest index no Workload of the job has
ROLE_SEAT = "kueue-seat"  # the Workloads' etj.dev/role
POD_SET = "main"


def workload_name(job: str, seat: str) -> str:
    """A seat's Workload: ``<job>-kueue-base``, ``<job>-kueue-x<i>``. Pods name it in etj.dev/kueue-seat."""
    return f"{job}-kueue-{seat}"


def extra_seat(index: int) -> str:
    return f"{EXTRA_SEAT}{index}"


def extra_index(job: str, name: str) -> int | None:
    """The index of an extra seat's Workload name; None for the base or a name not of this job's."""
    prefix = workload_name(job, EXTRA_SEAT)
    tail = name[len(prefix) :] if name.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def workload(
    spec: ElasticTrainingJobSpec,
    *,
    job: str,
    namespace: str,
    uid: str,
    name: str,
    count: int,
    priority: int,
    queue: str,
    capacity: CapacityType | None = None,
    pin: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One Workload of ``count`` worker pods. Its podSet's template is what Kueue judges: the requests must
    equal the worker pod's (Kueue admits a podSet only if its ClusterQueue covers every resource it
    requests), and the job's node selector, affinity and tolerations keep Kueue off flavors whose nodes the
    workers could not use. Owned by the job, so it goes with it.

    ``capacity``/``pin``: a seat of the deadline policy's (docs/kueue.md, "The deadline policy asks
    Kueue"): labelled ``etj.dev/capacity``, its template's nodeSelector carries ``pin`` (the capacity label
    of that type's flavors), so Kueue assigns it only a flavor of that capacity type. A nodeSelector, not
    affinity: Kueue drops affinity terms naming keys no flavor has, and one such term matches any flavor."""
    placement = spec.placement
    types = list(placement.capacity_types)
    template: dict[str, Any] = {
        "containers": [{"name": "trainer", "resources": worker_resources(spec)}],
        "restartPolicy": "Never",
        "tolerations": [*capacity_tolerations(types), *(t.to_dict() for t in placement.tolerations)],
    }
    if selector := {**placement.node_selector, **(pin or {})}:
        template["nodeSelector"] = selector
    if affinity := capacity_affinity(types, placement.affinity):
        template["affinity"] = affinity
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                **labels(job, ROLE_SEAT),
                LABEL_JOB: job,
                **({LABEL_CAPACITY: capacity.value} if capacity is not None else {}),
            },
            "ownerReferences": [owner_reference(job, uid)],
        },
        "spec": {
            "queueName": queue,
            "priority": priority,
            "podSets": [{"name": POD_SET, "count": count, "template": {"spec": template}}],
        },
    }

"""Where a job's pods may run: tolerations and node affinity for the capacity types it allows (pure).

The planner's free-capacity count and the pod manifests use the same terms, so what the planner counts as
room is where the scheduler may put the pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from etj_operator.api.models import CapacityType
from etj_operator.constants import LABEL_CAPACITY_OVERRIDE
from etj_operator.observe.nodes import CAPACITY_LABELS, SPOT_TAINT_TOLERATIONS

# The well-known label every kubelet sets to its node's name (clouds keep them equal; so does kwok).
HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class SeatPlacement:
    """Where a worker admitted on a seat runs: the assigned flavors' node labels (as a nodeSelector) and
    tolerations, which is what Kueue gives the pods of the jobs it manages itself."""

    seat: str  # the Workload's name (the pod's etj.dev/kueue-seat)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


def capacity_tolerations(types: Iterable[CapacityType]) -> list[dict[str, str]]:
    """Tolerations for the taints clouds put on spot nodes, when the job allows spot."""
    return [dict(t) for t in SPOT_TAINT_TOLERATIONS] if CapacityType.SPOT in set(types) else []


def _capacity_terms(ctype: CapacityType) -> list[list[dict[str, Any]]]:
    """Node selector terms (ORed; expressions inside a term ANDed) matching nodes of one capacity type.

    The override label wins over the cloud labels, mirroring ``CapacityRules.capacity_type``.
    """
    no_override = {"key": LABEL_CAPACITY_OVERRIDE, "operator": "DoesNotExist"}
    terms: list[list[dict[str, Any]]] = [
        [{"key": LABEL_CAPACITY_OVERRIDE, "operator": "In", "values": [ctype.value]}]
    ]
    if ctype == CapacityType.SPOT:
        for key, value, kind in CAPACITY_LABELS:
            if kind == CapacityType.SPOT:
                terms.append([no_override, {"key": key, "operator": "In", "values": [value]}])
    else:
        # On-demand is "not spot by any convention" (unlabelled nodes count as on-demand).
        spot: dict[str, list[str]] = {}
        for key, value, kind in CAPACITY_LABELS:
            if kind == CapacityType.SPOT:
                spot.setdefault(key, []).append(value)
        terms.append([no_override, *({"key": k, "operator": "NotIn", "values": v} for k, v in spot.items())])
    return terms


def pinned_terms(ctype: CapacityType) -> list[list[dict[str, Any]]]:
    """Terms that pin a pod to one capacity type in a form autoscalers provision for.

    On-demand leads with the positive labels of Karpenter (``karpenter.sh/capacity-type: on-demand``) and
    of EKS managed node groups (``eks.amazonaws.com/capacityType: ON_DEMAND``): a pending pod that requires
    them is what makes Karpenter, or the cluster autoscaler scaling an on-demand node group, start a node.
    The general terms (the override label; "not spot by any convention") follow, so other clouds and
    unlabelled on-demand nodes still take the pod.
    """
    if ctype == CapacityType.SPOT:
        return _capacity_terms(ctype)
    no_override = {"key": LABEL_CAPACITY_OVERRIDE, "operator": "DoesNotExist"}
    return [
        [no_override, {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}],
        [no_override, {"key": "eks.amazonaws.com/capacityType", "operator": "In", "values": ["ON_DEMAND"]}],
        *_capacity_terms(ctype),
    ]


def avoiding(terms: list[dict[str, Any]], nodes: Sequence[str]) -> list[dict[str, Any]]:
    """The required terms with ``kubernetes.io/hostname NotIn nodes`` ANDed into each (terms are ORed, so
    every one must exclude them); no terms: one term of just that."""
    if not nodes:
        return terms
    away = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": list(nodes)}
    if not terms:
        return [{"matchExpressions": [away]}]
    return [{**t, "matchExpressions": [*(t.get("matchExpressions") or []), away]} for t in terms]


def capacity_affinity(
    types: Iterable[CapacityType],
    user: Mapping[str, Any] | None = None,
    *,
    pin: CapacityType | None = None,
    avoid: Sequence[str] = (),
) -> dict[str, Any]:
    """Node affinity for the allowed capacity types, merged with the user's affinity.

    One allowed type → a required rule. Both → no requirement, but a preference for the first listed
    (spec order is the preference order). The user's required terms are ANDed with ours (cross product,
    because node selector terms are ORed). ``avoid``: nodes the pod must not run on (status.avoidedNodes).
    """
    allowed = list(dict.fromkeys(types))
    affinity: dict[str, Any] = {k: v for k, v in (user or {}).items() if k != "nodeAffinity"}
    user_node = dict((user or {}).get("nodeAffinity") or {})
    preferred = list(user_node.get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    user_terms = list(
        (user_node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    )
    ours: list[list[dict[str, Any]]] = []
    if pin is not None:
        ours = pinned_terms(pin)
    elif len(allowed) == 1:
        ours = _capacity_terms(allowed[0])
    elif allowed:
        preferred += [
            {"weight": 50, "preference": {"matchExpressions": term}} for term in _capacity_terms(allowed[0])
        ]
    if ours and user_terms:
        terms = [
            {**ut, "matchExpressions": [*(ut.get("matchExpressions") or []), *o]}
            for ut in user_terms
            for o in ours
        ]
    elif ours:
        terms = [{"matchExpressions": o} for o in ours]
    else:
        terms = user_terms
    terms = avoiding(terms, avoid)
    node: dict[str, Any] = {}
    if terms:
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    if preferred:
        node["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    if node:
        affinity["nodeAffinity"] = node
    return affinity

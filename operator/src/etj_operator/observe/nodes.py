"""Node pools: which capacity type a node is, which pool it belongs to, and what it can hold.

Everything here is a pure function of a Node body (a mapping as kopf or the API returns it), so the
kopf index in ``handlers.py`` stores the parsed ``NodeInfo`` and the planner never touches the API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from etj_operator.api.models import CapacityType
from etj_operator.constants import LABEL_CAPACITY_OVERRIDE, LABEL_POOL_OVERRIDE
from etj_operator.observe.signals import Signal, node_signal
from etj_operator.quantity import MILLI_RESOURCES, parse_count, parse_milli
from etj_operator.timeutil import parse_time

# (label key, label value) → capacity type, checked in order after the override label. Values are matched
# exactly because the conventions differ in case: EKS writes SPOT/ON_DEMAND, Karpenter spot/on-demand.
CAPACITY_LABELS: tuple[tuple[str, str, CapacityType], ...] = (
    ("eks.amazonaws.com/capacityType", "SPOT", CapacityType.SPOT),
    ("eks.amazonaws.com/capacityType", "ON_DEMAND", CapacityType.ON_DEMAND),
    ("karpenter.sh/capacity-type", "spot", CapacityType.SPOT),
    ("karpenter.sh/capacity-type", "on-demand", CapacityType.ON_DEMAND),
    # Karpenter v1 "reserved" is capacity that will not be reclaimed: on-demand for our purposes.
    ("karpenter.sh/capacity-type", "reserved", CapacityType.ON_DEMAND),
    ("cloud.google.com/gke-spot", "true", CapacityType.SPOT),
    ("cloud.google.com/gke-preemptible", "true", CapacityType.SPOT),
    ("kubernetes.azure.com/scalesetpriority", "spot", CapacityType.SPOT),
    ("kubernetes.azure.com/scalesetpriority", "regular", CapacityType.ON_DEMAND),
)

# Labels naming the node group / pool, most specific first.
POOL_LABELS: tuple[str, ...] = (
    LABEL_POOL_OVERRIDE,
    "karpenter.sh/nodepool",
    "eks.amazonaws.com/nodegroup",
    "cloud.google.com/gke-nodepool",
    "kubernetes.azure.com/agentpool",
    "node.kubernetes.io/instance-type",
)

# Taints clouds put on spot nodes; worker pods tolerate the ones matching the capacity types they allow.
SPOT_TAINT_TOLERATIONS: tuple[dict[str, str], ...] = (
    {
        "key": "kubernetes.azure.com/scalesetpriority",
        "operator": "Equal",
        "value": "spot",
        "effect": "NoSchedule",
    },
    {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "cloud.google.com/gke-preemptible", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "karpenter.sh/capacity-type", "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
    {"key": LABEL_CAPACITY_OVERRIDE, "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
)


@dataclass(frozen=True)
class CapacityRules:
    """How node labels map to capacity types; the operator's flags can add rules or change the default.

    ``default`` applies to nodes no rule matches: most clusters' unlabelled nodes are on-demand.
    """

    extra: tuple[tuple[str, str, CapacityType], ...] = ()
    default: CapacityType = CapacityType.ON_DEMAND

    def capacity_type(self, labels: Mapping[str, str]) -> CapacityType:
        override = labels.get(LABEL_CAPACITY_OVERRIDE)
        if override is not None:
            try:
                return CapacityType(override.lower())
            except ValueError:
                pass  # a typo in the override falls back to the cloud labels rather than failing
        for key, value, ctype in (*self.extra, *CAPACITY_LABELS):
            if labels.get(key) == value:
                return ctype
        return self.default


DEFAULT_RULES = CapacityRules()


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeInfo:
    """What the planner needs to know about one node."""

    name: str
    pool: str
    capacity_type: CapacityType
    # Extended (whole-unit) resources, plus cpu and memory in milli-units: observe.nodes._countable.
    allocatable: Mapping[str, int] = field(default_factory=dict)
    ready: bool = True
    ready_since: datetime | None = None
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    signal: Signal | None = None

    @property
    def schedulable(self) -> bool:
        """A node new workers may be placed on."""
        return self.ready and not self.unschedulable and self.signal is None

    def gpus(self, resource: str = "nvidia.com/gpu") -> int:
        return self.allocatable.get(resource, 0)


def pool_name(labels: Mapping[str, str], ctype: CapacityType) -> str:
    for key in POOL_LABELS:
        value = labels.get(key)
        if value:
            return value
    return f"default-{ctype.value}"


def _countable(allocatable: Mapping[str, Any]) -> dict[str, int]:
    """Whole-unit extended resources (GPUs and other device-plugin resources), and cpu and memory in
    milli-units (quantity.MILLI_RESOURCES): what a worker pod requests, for the free-capacity estimate."""
    out: dict[str, int] = {}
    for key, raw in allocatable.items():
        count = parse_milli(raw) if key in MILLI_RESOURCES else parse_count(raw) if "/" in key else None
        if count is not None:
            out[key] = count
    return out


def node_info(body: Mapping[str, Any], rules: CapacityRules = DEFAULT_RULES) -> NodeInfo:
    """Parse a Node body into ``NodeInfo``."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    labels: dict[str, str] = dict(meta.get("labels") or {})
    ctype = rules.capacity_type(labels)
    ready = False
    ready_since = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
            ready_since = parse_time(cond.get("lastTransitionTime"))
    if ready_since is None:
        ready_since = parse_time(meta.get("creationTimestamp"))
    taints = tuple(
        Taint(key=t.get("key", ""), value=str(t.get("value") or ""), effect=t.get("effect", ""))
        for t in spec.get("taints") or []
    )
    return NodeInfo(
        name=meta.get("name", ""),
        pool=pool_name(labels, ctype),
        capacity_type=ctype,
        allocatable=_countable(status.get("allocatable") or {}),
        ready=ready,
        ready_since=ready_since,
        unschedulable=bool(spec.get("unschedulable")),
        taints=taints,
        labels=labels,
        signal=node_signal(body),
    )


def tolerates(taint: Taint, tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Kubernetes toleration matching (only for NoSchedule/NoExecute decisions in planning)."""
    for tol in tolerations:
        effect = tol.get("effect")
        if effect and effect != taint.effect:
            continue
        key = tol.get("key")
        op = tol.get("operator") or "Equal"
        if not key:
            if op == "Exists":
                return True
            continue
        if key != taint.key:
            continue
        if op == "Exists" or str(tol.get("value") or "") == taint.value:
            return True
    return False


def fits(
    node: NodeInfo,
    *,
    capacity_types: Iterable[CapacityType],
    node_selector: Mapping[str, str],
    tolerations: Iterable[Mapping[str, Any]],
) -> bool:
    """Whether a pod with these constraints could be scheduled on the node (ignoring free resources)."""
    if not node.schedulable or node.capacity_type not in set(capacity_types):
        return False
    if any(node.labels.get(k) != v for k, v in node_selector.items()):
        return False
    tols = list(tolerations)
    return all(t.effect not in ("NoSchedule", "NoExecute") or tolerates(t, tols) for t in node.taints)


@dataclass(frozen=True)
class PoolSummary:
    """One pool as reported in logs/metrics: node count and GPUs, split by health."""

    name: str
    capacity_type: CapacityType
    nodes: int
    schedulable_nodes: int
    gpus: int
    schedulable_gpus: int


def summarize_pools(nodes: Iterable[NodeInfo], gpu_resource: str = "nvidia.com/gpu") -> list[PoolSummary]:
    acc: dict[str, list[NodeInfo]] = {}
    for node in nodes:
        acc.setdefault(node.pool, []).append(node)
    out = []
    for name, members in sorted(acc.items()):
        out.append(
            PoolSummary(
                name=name,
                capacity_type=members[0].capacity_type,
                nodes=len(members),
                schedulable_nodes=sum(1 for n in members if n.schedulable),
                gpus=sum(n.gpus(gpu_resource) for n in members),
                schedulable_gpus=sum(n.gpus(gpu_resource) for n in members if n.schedulable),
            )
        )
    return out

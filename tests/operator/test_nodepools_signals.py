"""Capacity-type detection, pools and interruption signals from plain Node/Pod bodies."""

from __future__ import annotations

from typing import Any

import pytest

from etj_operator.api.models import CapacityType
from etj_operator.observe.nodes import CapacityRules, fits, node_info, summarize_pools
from etj_operator.observe.pods import pod_info
from etj_operator.observe.signals import Reason, node_signal, pod_signal

SPOT, OD = CapacityType.SPOT, CapacityType.ON_DEMAND


def node_body(
    labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": labels or {}, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"taints": taints or [], **spec},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"},
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:01:00Z"}],
        },
    }


CAPACITY_CASES = [
    ("EKS managed node group spot (upper case)", {"eks.amazonaws.com/capacityType": "SPOT"}, SPOT),
    ("EKS managed node group on-demand", {"eks.amazonaws.com/capacityType": "ON_DEMAND"}, OD),
    ("EKS label is case-sensitive: lower case is not EKS's", {"eks.amazonaws.com/capacityType": "spot"}, OD),
    ("Karpenter spot", {"karpenter.sh/capacity-type": "spot"}, SPOT),
    ("Karpenter on-demand", {"karpenter.sh/capacity-type": "on-demand"}, OD),
    ("Karpenter reserved counts as on-demand", {"karpenter.sh/capacity-type": "reserved"}, OD),
    ("GKE spot", {"cloud.google.com/gke-spot": "true"}, SPOT),
    ("GKE preemptible (older)", {"cloud.google.com/gke-preemptible": "true"}, SPOT),
    ("AKS spot scale set", {"kubernetes.azure.com/scalesetpriority": "spot"}, SPOT),
    ("unlabelled node defaults to on-demand", {}, OD),
    (
        "override label beats the cloud label",
        {"etj.dev/capacity-type": "on-demand", "karpenter.sh/capacity-type": "spot"},
        OD,
    ),
    ("override label marks a bare node spot", {"etj.dev/capacity-type": "spot"}, SPOT),
    (
        "typo in the override falls back to cloud labels",
        {"etj.dev/capacity-type": "spto", "cloud.google.com/gke-spot": "true"},
        SPOT,
    ),
]


@pytest.mark.parametrize(
    ("labels", "expected"), [c[1:] for c in CAPACITY_CASES], ids=[c[0] for c in CAPACITY_CASES]
)
def test_capacity_type(labels: dict[str, str], expected: CapacityType) -> None:
    assert node_info(node_body(labels)).capacity_type == expected


def test_operator_rules_add_labels_and_change_the_default() -> None:
    rules = CapacityRules(extra=(("example.com/lifecycle", "preemptible", SPOT),), default=SPOT)
    assert node_info(node_body({"example.com/lifecycle": "preemptible"}), rules).capacity_type == SPOT
    assert node_info(node_body({}), rules).capacity_type == SPOT


def test_pool_name_and_gpus() -> None:
    info = node_info(node_body({"karpenter.sh/nodepool": "gpu-spot", "karpenter.sh/capacity-type": "spot"}))
    assert (info.pool, info.gpus(), info.allocatable["nvidia.com/gpu"]) == ("gpu-spot", 8, 8)
    assert info.allocatable["cpu"] == 96_000  # milli-units (observe.nodes._countable)
    assert node_info(node_body({})).pool == "default-on-demand"
    pools = summarize_pools(
        [info, node_info(node_body({"karpenter.sh/nodepool": "gpu-spot"}, unschedulable=True))]
    )
    assert (pools[0].nodes, pools[0].gpus, pools[0].schedulable_gpus) == (2, 16, 8)


SIGNAL_CASES = [
    (
        "NTH spot interruption",
        [{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}],
        Reason.SPOT_INTERRUPTION,
    ),
    (
        "NTH rebalance",
        [{"key": "aws-node-termination-handler/rebalance-recommendation", "effect": "NoSchedule"}],
        Reason.REBALANCE_RECOMMENDATION,
    ),
    (
        "NTH scheduled maintenance",
        [{"key": "aws-node-termination-handler/scheduled-maintenance", "effect": "NoSchedule"}],
        Reason.SCHEDULED_MAINTENANCE,
    ),
    (
        "NTH ASG lifecycle",
        [{"key": "aws-node-termination-handler/asg-lifecycle-termination", "effect": "NoSchedule"}],
        Reason.ASG_TERMINATION,
    ),
    (
        "Karpenter v1 disrupted",
        [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}],
        Reason.NODE_DISRUPTED,
    ),
    (
        "Karpenter pre-v1 disruption",
        [{"key": "karpenter.sh/disruption", "value": "disrupting", "effect": "NoSchedule"}],
        Reason.NODE_DISRUPTED,
    ),
    (
        "GKE impending termination",
        [{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}],
        Reason.NODE_TERMINATING,
    ),
    (
        "spot-itn wins over a cordon taint",
        [
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            {"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"},
        ],
        Reason.SPOT_INTERRUPTION,
    ),
    ("GPU taint is not a signal", [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}], None),
]


@pytest.mark.parametrize(
    ("taints", "reason"), [c[1:] for c in SIGNAL_CASES], ids=[c[0] for c in SIGNAL_CASES]
)
def test_taint_signals(taints: list[dict[str, Any]], reason: Reason | None) -> None:
    sig = node_signal(node_body(taints=taints))
    assert (sig.reason if sig else None) == reason


def test_cordon_and_deletion_are_signals() -> None:
    assert node_signal(node_body(unschedulable=True)).reason == Reason.NODE_CORDONED
    body = node_body()
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    assert node_signal(body).reason == Reason.NODE_DELETED
    assert not node_info(node_body(unschedulable=True)).schedulable


def test_pod_disruption_target_condition() -> None:
    body = {
        "metadata": {
            "name": "w",
            "labels": {"etj.dev/job": "j", "etj.dev/role": "worker", "etj.dev/slot": "3"},
        },
        "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": 2}}}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}],
        },
    }
    sig = pod_signal(body)
    assert sig is not None and sig.reason == Reason.POD_DISRUPTED and "TerminationByKubelet" in sig.message
    info = pod_info(body)
    assert (info.slot, info.node, info.requests, info.running) == (3, "n1", {"nvidia.com/gpu": 2}, True)


def test_fits_checks_capacity_type_selector_and_taints() -> None:
    spot = node_info(
        node_body(
            {"karpenter.sh/capacity-type": "spot", "zone": "a"},
            taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
        )
    )
    tol = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert fits(spot, capacity_types=[SPOT], node_selector={"zone": "a"}, tolerations=tol)
    assert not fits(spot, capacity_types=[OD], node_selector={}, tolerations=tol)
    assert not fits(spot, capacity_types=[SPOT], node_selector={"zone": "b"}, tolerations=tol)
    assert not fits(spot, capacity_types=[SPOT], node_selector={}, tolerations=[])

"""Value objects the planner's parts share: what to drain and which Kubernetes events to emit."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from etj_operator.observe.signals import Reason


@dataclass(frozen=True)
class Drain:
    """Delete one pod gracefully (SIGTERM, then the pod's grace period) and say why."""

    pod: str
    reason: Reason
    message: str
    node: str | None = None
    signal_since: datetime | None = None  # for the interruption → drain latency metric
    role: str = "worker"
    force: bool = False  # grace 0: the pod's node is gone, no kubelet will ever finish a graceful delete


@dataclass(frozen=True)
class KubeEvent:
    type: str  # Normal / Warning
    reason: str
    message: str

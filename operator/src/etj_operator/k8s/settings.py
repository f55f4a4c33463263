"""What the job loops are given: the operator's settings (flags, chart values) and read access to its
indices."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from etj_contract.ports import PROGRESS_PORT
from etj_operator.decide.pod_env import DEFAULT_WORKER_GRACE_SECONDS
from etj_operator.decide.schedule import DeadlineCosts, PriceDefaults
from etj_operator.observe.nodes import NodeInfo
from etj_operator.observe.pods import PodInfo


@dataclass
class Settings:
    resync_seconds: float = 30.0
    progress_seconds: float = 10.0  # 0 disables polling the store's /progress
    progress_port: int = PROGRESS_PORT  # where store pods serve it (docs/contract.md)
    worker_grace_seconds: int = DEFAULT_WORKER_GRACE_SECONDS
    default_trainer_image: str | None = None  # for jobs without spec.trainer.image
    default_store_image: str | None = None  # for store pods of jobs without spec.trainer.storeImage
    # Namespaces watched (empty: all). Namespaced, the GPU-usage index sees only these namespaces' pods.
    namespaces: tuple[str, ...] = ()
    # Key the jobs' progress tokens are derived from (dataplane.job_token). The chart keeps one in a
    # Secret; a random one (no key configured) makes a restarted operator unable to read running jobs'
    # progress until they are re-created, which is fine for tests and development only.
    token_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    # A NetworkPolicy per job (docs/operator.md, "Threat model"); off for clusters that manage their own.
    network_policy: bool = True
    # Where the operator's own pods are, for the NetworkPolicy's progress-port rule (None: outside the
    # cluster or unknown; that rule then admits every source and the token alone guards the port).
    operator_namespace: str | None = None
    operator_pod_labels: tuple[tuple[str, str], ...] = ()
    # Default prices for status.cost (the chart's ``prices``) and the deadline policy's cost of a change.
    prices: PriceDefaults = field(default_factory=PriceDefaults)
    deadline_costs: DeadlineCosts = field(default_factory=DeadlineCosts)
    # PriorityClass of workers beyond replicas.min (the chart creates it): lower than every job's, so
    # jobs share a pool by the rule in decide/sharing.py. None: every worker at its job's priority.
    extra_priority_class: str | None = None


class World(Protocol):
    """Read access to the operator's indices (see handlers.py)."""

    def nodes(self) -> Mapping[str, NodeInfo]: ...
    def node_usage(self) -> Mapping[str, Mapping[str, int]]: ...
    def deleted_nodes(self) -> Mapping[str, datetime]: ...
    def job_pods(self, namespace: str, job: str) -> list[PodInfo]: ...

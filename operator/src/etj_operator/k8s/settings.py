"""What the job loops are given: the operator's settings (flags, chart values) and read access to its
indices. The settings' defaults are those of the operator's one table of settings (k8s/settings_table.py)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from etj_contract.ports import PROGRESS_PORT
from etj_operator.decide.deadline.schedule import DeadlineCosts, PriceDefaults
from etj_operator.decide.objects.netpol import Enforced
from etj_operator.k8s import settings_table as table
from etj_operator.observe.nodes import NodeInfo
from etj_operator.observe.pods import PodInfo


@dataclass
class Settings:
    resync_seconds: float = table.RESYNC_SECONDS.default
    progress_seconds: float = table.PROGRESS_SECONDS.default  # 0 disables polling the store's /progress
    progress_port: int = PROGRESS_PORT  # where store pods serve it (docs/contract.md)
    worker_grace_seconds: int = table.WORKER_GRACE_SECONDS.default
    default_trainer_image: str | None = table.DEFAULT_TRAINER_IMAGE.default  # jobs without spec.trainer.image
    # For store pods of jobs without spec.trainer.storeImage.
    default_store_image: str | None = table.DEFAULT_STORE_IMAGE.default
    # Namespaces watched (empty: all). Namespaced, the GPU-usage index sees only these namespaces' pods.
    namespaces: tuple[str, ...] = ()
    # Key the jobs' progress tokens are derived from (dataplane.job_token). The chart keeps one in a
    # Secret; a random one (no key configured) makes a restarted operator unable to read running jobs'
    # progress until they are re-created, which is fine for tests and development only.
    token_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    # A NetworkPolicy per job (docs/operator.md, "Threat model"); off for clusters that manage their own.
    network_policy: bool = table.NETWORK_POLICY.default
    # Whether the cluster enforces NetworkPolicy, as its owner declares it (the chart's
    # networkPolicy.enforced): anything but TRUE gives each job a NetworkPolicyNotEnforced Warning.
    network_policy_enforced: Enforced = table.NETWORK_POLICY_ENFORCED.default
    # Refuse jobs whose trainer volumes include a hostPath (decide/objects/pod_policy.py; the chart's
    # security.forbidHostPath): a job's author otherwise mounts any path of the node its pods land on.
    forbid_host_path: bool = table.FORBID_HOST_PATH.default
    # Where the operator's own pods are, for the NetworkPolicy's progress-port rule (None: outside the
    # cluster or unknown; that rule then admits every source and the token alone guards the port).
    operator_namespace: str | None = table.OPERATOR_NAMESPACE.default
    operator_pod_labels: tuple[tuple[str, str], ...] = ()
    # Default prices for status.cost (the chart's ``prices``) and the deadline policy's cost of a change.
    prices: PriceDefaults = field(default_factory=PriceDefaults)
    deadline_costs: DeadlineCosts = field(default_factory=DeadlineCosts)
    # PriorityClass of workers beyond replicas.min (the chart creates it): lower than every job's, so
    # jobs share a pool by the rule in decide/plan/sharing.py. None: every worker at its job's priority.
    extra_priority_class: str | None = table.EXTRA_PRIORITY_CLASS.default
    # Jobs labelled kueue.x-k8s.io/queue-name go through Kueue (docs/kueue.md): Workloads, admission, seats.
    kueue: bool = table.KUEUE.default


# The options whose parsed value is the Settings field of the same name (build_state copies them over).
SETTING_OPTIONS: tuple[table.Option[Any], ...] = (
    table.RESYNC_SECONDS,
    table.PROGRESS_SECONDS,
    table.WORKER_GRACE_SECONDS,
    table.DEFAULT_TRAINER_IMAGE,
    table.DEFAULT_STORE_IMAGE,
    table.NETWORK_POLICY,
    table.NETWORK_POLICY_ENFORCED,
    table.FORBID_HOST_PATH,
    table.OPERATOR_NAMESPACE,
    table.EXTRA_PRIORITY_CLASS,
    table.KUEUE,
)


class World(Protocol):
    """Read access to the operator's indices (see handlers.py)."""

    def nodes(self) -> Mapping[str, NodeInfo]: ...
    def node_usage(self) -> Mapping[str, Mapping[str, int]]: ...
    def deleted_nodes(self) -> Mapping[str, datetime]: ...
    def job_pods(self, namespace: str, job: str) -> list[PodInfo]: ...

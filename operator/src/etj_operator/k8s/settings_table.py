"""The operator's settings, defined once: each ``Option`` names its flag, type, default, the ``ETJ_*``
variable that may set it, the chart value that sets it, and its help.

From this table come ``etj operator run``'s argument parser (``parser``), the defaults of ``Settings``
(k8s/settings.py), and the settings table of docs/operator.md (``markdown``, checked by
tests/operator/test_settings_table.py); tests/chart/test_settings_table.py checks the chart's values.yaml,
values.schema.json and deployment.yaml against it. ``python -m etj_operator.k8s.settings_table`` prints the
docs' table.

Long because: one entry per setting with its help text, and the table is meant to be read as one.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, Literal, TypeVar

from etj_operator.api.models import CapacityType
from etj_operator.api.schedule import DEFAULT_PRICE_ON_DEMAND, DEFAULT_PRICE_SOURCE, DEFAULT_PRICE_SPOT
from etj_operator.decide.deadline.schedule import DeadlineCosts
from etj_operator.decide.objects.netpol import Enforced
from etj_operator.decide.objects.pod_env import DEFAULT_WORKER_GRACE_SECONDS
from etj_operator.k8s import leader

T = TypeVar("T")

# How the option is given: a value (``--flag X``), an on/off switch (``store_true``; ``store_false`` for a
# ``--no-...`` flag), or a repeatable flag collected into a list.
Kind = Literal["value", "on", "off", "list"]
# How the chart passes it: a flag in the Deployment's args, or the option's environment variable.
Via = Literal["flag", "env"]


@dataclass(frozen=True)
class Option(Generic[T]):
    dest: str  # the parsed attribute, and the Settings field of the same name where the job loops read it
    flags: tuple[str, ...]
    default: T  # without the environment or the chart
    help: str
    kind: Kind = "value"
    parse: Callable[[str], T] | None = None  # a value's type (str when None)
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    env: str | None = None  # a variable whose non-empty value replaces the default
    chart: str | None = None  # the chart value that sets it: a dotted path in values.yaml
    chart_default: object = None  # what values.yaml holds, where the chart chooses other than the operator
    via: Via = "flag"

    @property
    def flag(self) -> str:
        return self.flags[-1]

    def from_env(self) -> T:
        """The default, or the environment's value when its variable is set (the chart sets several)."""
        raw = os.environ.get(self.env) if self.env else None
        if not raw:
            return self.default
        if self.kind == "on":
            return raw.lower() in ("1", "true", "yes")  # type: ignore[return-value]
        try:
            return self.parse(raw) if self.parse is not None else raw  # type: ignore[return-value]
        except ValueError as err:
            raise SystemExit(
                f"{self.env}={raw!r} is not a {getattr(self.parse, '__name__', 'value')}"
            ) from err

    @property
    def json_type(self) -> str:
        """The JSON-schema type of its chart value (values.schema.json)."""
        if self.kind in ("on", "off"):
            return "boolean"
        if self.kind == "list":
            return "object" if isinstance(self.chart_default, dict) else "array"  # KEY=VALUE pairs: a map
        if self.parse is int:
            return "integer"
        return "number" if self.parse is float else "string"

    def chart_value(self) -> object:
        """What values.yaml should hold for this option."""
        if self.chart_default is not None:
            return self.chart_default
        return "" if self.default is None else self.default


def _opt(text: str) -> str | None:
    return text or None


_COSTS = DeadlineCosts()
_ELECTION = leader.Election("", "")

NAMESPACE = Option[list[str]](
    "namespace",
    ("-n", "--namespace"),
    [],
    "watch this namespace (repeatable; default: all)",
    kind="list",
    chart="watchNamespaces",
)
ALL_NAMESPACES = Option[bool](
    "all_namespaces", ("-A", "--all-namespaces"), False, "watch all namespaces (default)", kind="on"
)
KUBECONFIG = Option[str | None](
    "kubeconfig", ("--kubeconfig",), None, "kubeconfig path (default: in-cluster, then $KUBECONFIG)"
)
METRICS_PORT = Option[int](
    "metrics_port",
    ("--metrics-port",),
    9090,
    "Prometheus /metrics port; 0 disables",
    parse=int,
    chart="metrics.port",
)
LIVENESS_PORT = Option[int](
    "liveness_port",
    ("--liveness-port",),
    8080,
    "kopf /healthz port; 0 disables",
    parse=int,
    chart="operator.livenessPort",
)
RESYNC_SECONDS = Option[float](
    "resync_seconds",
    ("--resync-seconds",),
    30.0,
    "per-job reconcile timer; the deadline policy's interval too",
    parse=float,
    chart="operator.resyncSeconds",
)
PROGRESS_SECONDS = Option[float](
    "progress_seconds",
    ("--progress-seconds",),
    10.0,
    "poll the store's /progress; 0 disables",
    parse=float,
    chart="operator.progressSeconds",
)
WORKER_GRACE_SECONDS = Option[int](
    "worker_grace_seconds",
    ("--worker-grace-seconds",),
    DEFAULT_WORKER_GRACE_SECONDS,
    "terminationGracePeriodSeconds of worker pods (time for the just-in-time checkpoint)",
    parse=int,
    chart="operator.workerGraceSeconds",
)
DEFAULT_TRAINER_IMAGE = Option[str | None](
    "default_trainer_image",
    ("--default-trainer-image",),
    None,
    "image of jobs without spec.trainer.image; without one such jobs wait with Ready=False/NoTrainerImage",
    parse=_opt,
    metavar="IMAGE",
    env="ETJ_DEFAULT_TRAINER_IMAGE",
    chart="trainer.image",
    chart_default="ghcr.io/etj-dev/etj-trainer:0.1.0",
    via="env",
)
DEFAULT_STORE_IMAGE = Option[str | None](
    "default_store_image",
    ("--default-store-image",),
    None,
    "image of the rendezvous store pods of jobs without spec.trainer.storeImage; unset: the job's trainer "
    "image",
    parse=_opt,
    metavar="IMAGE",
    env="ETJ_DEFAULT_STORE_IMAGE",
    chart="trainer.storeImage",
    via="env",
)
PRICE_SPOT = Option[float](
    "price_spot",
    ("--price-spot",),
    DEFAULT_PRICE_SPOT,
    "USD per spot worker-hour for status.cost when a job's spec.prices gives none",
    parse=float,
    env="ETJ_PRICE_SPOT",
    chart="prices.spotPerWorkerHour",
    via="env",
)
PRICE_ON_DEMAND = Option[float](
    "price_on_demand",
    ("--price-on-demand",),
    DEFAULT_PRICE_ON_DEMAND,
    "USD per on-demand worker-hour",
    parse=float,
    env="ETJ_PRICE_ON_DEMAND",
    chart="prices.onDemandPerWorkerHour",
    via="env",
)
PRICE_SOURCE = Option[str](
    "price_source",
    ("--price-source",),
    DEFAULT_PRICE_SOURCE,
    "where the default prices come from, shown in status.cost.priceSource",
    env="ETJ_PRICE_SOURCE",
    chart="prices.source",
    via="env",
    chart_default=(
        "chart default: AWS p3.2xlarge us-east-1 on-demand list price $3.06/h; spot assumed 30% of it"
    ),
)
ON_DEMAND_STARTUP_SECONDS = Option[float](
    "on_demand_startup_seconds",
    ("--on-demand-startup-seconds",),
    _COSTS.on_demand_startup_s,
    "deadline policy: seconds from asking for an on-demand worker to it training (node start-up)",
    parse=float,
    env="ETJ_ON_DEMAND_STARTUP_SECONDS",
    chart="deadline.onDemandStartupSeconds",
    via="env",
)
RESIZE_SECONDS = Option[float](
    "resize_seconds",
    ("--resize-seconds",),
    _COSTS.resize_s,
    "deadline policy: a resize's training stall, rendezvous included; part of the safety margin and of the "
    "no-thrash rule",
    parse=float,
    env="ETJ_RESIZE_SECONDS",
    chart="deadline.resizeSeconds",
    via="env",
)
EXTRA_PRIORITY_CLASS = Option[str | None](
    "extra_priority_class",
    ("--extra-priority-class",),
    None,
    "PriorityClass of workers beyond a job's replicas.min, lower than every job's and never preempting, so "
    "every job gets its min before any job more; unset: every worker at its job's priority "
    "(the chart sets it while sharing.enabled)",
    parse=_opt,
    metavar="NAME",
    env="ETJ_EXTRA_PRIORITY_CLASS",
    chart="sharing.extraPriorityClass.name",
    chart_default="etj-elastic-extra",
    via="env",
)
KUEUE = Option[bool](
    "kueue",
    ("--kueue",),
    False,
    "admit jobs labelled kueue.x-k8s.io/queue-name through Kueue: Workloads for replicas.min and for each "
    "extra worker, no worker before admission, a preempted extra drained in place (docs/kueue.md)",
    kind="on",
    chart="kueue.enabled",
)
DEFAULT_CAPACITY_TYPE = Option[str](
    "default_capacity_type",
    ("--default-capacity-type",),
    CapacityType.ON_DEMAND.value,
    "capacity type of nodes no known label describes",
    choices=tuple(c.value for c in CapacityType),
    chart="nodePools.defaultCapacityType",
)
SPOT_LABEL = Option[list[str]](
    "spot_label",
    ("--spot-label",),
    [],
    "extra node label marking spot capacity (repeatable)",
    kind="list",
    metavar="KEY=VALUE",
    chart="nodePools.spotLabels",
    chart_default={},
)
ON_DEMAND_LABEL = Option[list[str]](
    "on_demand_label",
    ("--on-demand-label",),
    [],
    "extra node label marking on-demand capacity (repeatable)",
    kind="list",
    metavar="KEY=VALUE",
    chart="nodePools.onDemandLabels",
    chart_default={},
)
NETWORK_POLICY = Option[bool](
    "network_policy",
    ("--no-network-policy",),
    True,
    "do not create a NetworkPolicy per job (docs/operator.md, 'Threat model')",
    kind="off",
    chart="networkPolicy.enabled",
)
NETWORK_POLICY_ENFORCED = Option[Enforced](
    "network_policy_enforced",
    ("--network-policy-enforced",),
    Enforced.UNKNOWN,
    "whether the cluster enforces NetworkPolicy (verify: `etj check network-policy`); unless true, each job "
    "gets a NetworkPolicyNotEnforced Warning",
    parse=Enforced,
    choices=tuple(Enforced),
    chart="networkPolicy.enforced",
)
FORBID_HOST_PATH = Option[bool](
    "forbid_host_path",
    ("--forbid-host-path",),
    False,
    "refuse jobs with hostPath volumes: a condition and an Event, no pod",
    kind="on",
    chart="security.forbidHostPath",
)
OPERATOR_NAMESPACE = Option[str | None](
    "operator_namespace",
    ("--operator-namespace",),
    None,
    "namespace of the operator's pods, for the jobs' NetworkPolicy (the chart sets $POD_NAMESPACE); unset: "
    "the "
    "progress port admits every source, guarded by the token alone",
    parse=_opt,
    env="POD_NAMESPACE",
)
OPERATOR_POD_LABEL = Option[list[str]](
    "operator_pod_label",
    ("--operator-pod-label",),
    [],
    "label of the operator's pods, for the jobs' NetworkPolicy (repeatable; the chart passes its selector "
    "labels)",
    kind="list",
    metavar="KEY=VALUE",
)
LEADER_ELECT = Option[bool](
    "leader_elect",
    ("--leader-elect",),
    False,
    "stand by for the Lease and run only while holding it: for more than one replica",
    kind="on",
    env="ETJ_LEADER_ELECT",
    chart="leaderElection.enabled",
    chart_default=True,
)
LEADER_ELECTION_NAMESPACE = Option[str](
    "leader_election_namespace",
    ("--leader-election-namespace",),
    "default",
    "namespace of the Lease",
    env="POD_NAMESPACE",
)
LEADER_IDENTITY = Option[str | None](
    "leader_identity", ("--leader-identity",), None, "this replica's name in the Lease (default: pod name)"
)
LEASE_SECONDS = Option[int](
    "lease_seconds",
    ("--lease-seconds",),
    _ELECTION.lease_s,
    "a dead leader's Lease is taken over this long after its last renew",
    parse=int,
    chart="leaderElection.leaseSeconds",
)
RENEW_SECONDS = Option[int](
    "renew_seconds",
    ("--renew-seconds",),
    _ELECTION.renew_s,
    "a leader that cannot renew within this long exits",
    parse=int,
    chart="leaderElection.renewSeconds",
)
RETRY_SECONDS = Option[int](
    "retry_seconds",
    ("--retry-seconds",),
    _ELECTION.retry_s,
    "how often a standby replica tries the Lease",
    parse=int,
    chart="leaderElection.retrySeconds",
)
VERBOSE = Option[bool](
    "verbose",
    ("-v", "--verbose"),
    False,
    "debug logging, kopf's included",
    kind="on",
    chart="operator.verbose",
)
TOKEN_KEY = Option[str](
    "token_key",
    (),
    "",
    "the key the jobs' progress tokens derive from; unset: a random one per start (the "
    "chart keeps one in a Secret)",
    env="ETJ_OPERATOR_TOKEN_KEY",
    via="env",
)

# In the order of `etj operator run --help` and the docs' table.
OPTIONS: tuple[Option[Any], ...] = (
    NAMESPACE,
    ALL_NAMESPACES,
    KUBECONFIG,
    METRICS_PORT,
    LIVENESS_PORT,
    RESYNC_SECONDS,
    PROGRESS_SECONDS,
    WORKER_GRACE_SECONDS,
    DEFAULT_TRAINER_IMAGE,
    DEFAULT_STORE_IMAGE,
    PRICE_SPOT,
    PRICE_ON_DEMAND,
    PRICE_SOURCE,
    ON_DEMAND_STARTUP_SECONDS,
    RESIZE_SECONDS,
    EXTRA_PRIORITY_CLASS,
    KUEUE,
    DEFAULT_CAPACITY_TYPE,
    SPOT_LABEL,
    ON_DEMAND_LABEL,
    NETWORK_POLICY,
    NETWORK_POLICY_ENFORCED,
    FORBID_HOST_PATH,
    OPERATOR_NAMESPACE,
    OPERATOR_POD_LABEL,
    LEADER_ELECT,
    LEADER_ELECTION_NAMESPACE,
    LEADER_IDENTITY,
    LEASE_SECONDS,
    RENEW_SECONDS,
    RETRY_SECONDS,
    VERBOSE,
    TOKEN_KEY,
)


def parser() -> argparse.ArgumentParser:
    """``etj operator run``'s flags, one per option with flags; env-set defaults read now."""
    p = argparse.ArgumentParser(prog="etj operator run", description="Run the ElasticTrainingJob operator.")
    scope = p.add_mutually_exclusive_group()  # --namespace ... or --all-namespaces
    for o in OPTIONS:
        if not o.flags:
            continue  # environment only
        target = scope if o in (NAMESPACE, ALL_NAMESPACES) else p
        helptext = o.help + (f" (${o.env})" if o.env else "")
        if o.kind == "list":
            target.add_argument(
                *o.flags, dest=o.dest, action="append", default=[], metavar=o.metavar, help=helptext
            )
        elif o.kind in ("on", "off"):
            action = "store_true" if o.kind == "on" else "store_false"
            target.add_argument(*o.flags, dest=o.dest, action=action, default=o.from_env(), help=helptext)
        else:
            choices = list(o.choices) if o.choices else None
            target.add_argument(
                *o.flags,
                dest=o.dest,
                type=o.parse or str,
                default=o.from_env(),
                choices=choices,
                metavar=o.metavar,
                help=helptext,
            )
    return p


def _show(value: object) -> str:
    if value is None or value == "" or value == []:
        return "unset"
    if isinstance(value, StrEnum):
        return f"`{value.value}`"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`"


def markdown() -> str:
    """The settings table of docs/operator.md."""
    rows = ["| flag | default | environment | chart value | what |", "|---|---|---|---|---|"]
    for o in OPTIONS:
        flag = " ".join(f"`{f}`" for f in o.flags) or "(none)"
        env = f"`{o.env}`" if o.env else ""
        chart = f"`{o.chart}`" + (" (env)" if o.via == "env" else "") if o.chart else ""
        rows.append(f"| {flag} | {_show(o.default)} | {env} | {chart} | {o.help} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())

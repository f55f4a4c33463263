"""``etj operator run``: parse flags, start kopf standalone with the operator's handlers.

With ``--leader-elect`` (the chart's default, 2 replicas) every replica stands by for a Lease and only its
holder runs kopf (k8s/leader.py); without it the process runs kopf at once, which is right for a single
replica only. A new leader needs no hand-over: every reconcile is level-based and idempotent, so it
rebuilds its indices from a fresh listing, finds the workers by label and deterministic name, and
converges without creating duplicates. See docs/operator.md, "High availability".
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import kopf

from etj_operator.api.models import CapacityType
from etj_operator.api.schedule import DEFAULT_PRICE_ON_DEMAND, DEFAULT_PRICE_SOURCE, DEFAULT_PRICE_SPOT
from etj_operator.decide.pod_env import DEFAULT_WORKER_GRACE_SECONDS
from etj_operator.decide.schedule import DeadlineCosts, PriceDefaults
from etj_operator.k8s import handlers, kube_api, leader
from etj_operator.k8s.metrics import serve
from etj_operator.k8s.settings import Settings
from etj_operator.k8s.standby_health import StandbyHealth
from etj_operator.observe.nodes import CapacityRules

log = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The operator's flags (the chart's values end up here).

    Long because: one add_argument per flag with its help text; split up, the flags would no longer read
    as one table next to docs/operator.md.
    """
    p = argparse.ArgumentParser(prog="etj operator run", description="Run the ElasticTrainingJob operator.")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch all namespaces (default)")
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port; 0 disables")
    p.add_argument("--liveness-port", type=int, default=8080, help="kopf /healthz port; 0 disables")
    p.add_argument("--resync-seconds", type=float, default=30.0, help="per-job reconcile timer")
    p.add_argument(
        "--progress-seconds", type=float, default=10.0, help="poll the store's /progress; 0 disables"
    )
    p.add_argument(
        "--worker-grace-seconds",
        type=int,
        default=DEFAULT_WORKER_GRACE_SECONDS,
        help="terminationGracePeriodSeconds of worker pods (time for the just-in-time checkpoint)",
    )
    p.add_argument(
        "--default-trainer-image",
        default=os.environ.get("ETJ_DEFAULT_TRAINER_IMAGE") or None,
        metavar="IMAGE",
        help="image of jobs without spec.trainer.image (default: $ETJ_DEFAULT_TRAINER_IMAGE, which the "
        "chart sets from trainer.image); without one such jobs wait with Ready=False/NoTrainerImage",
    )
    p.add_argument(
        "--default-store-image",
        default=os.environ.get("ETJ_DEFAULT_STORE_IMAGE") or None,
        metavar="IMAGE",
        help="image of the rendezvous store pods of jobs without spec.trainer.storeImage (default: "
        "$ETJ_DEFAULT_STORE_IMAGE, which the chart sets from trainer.storeImage); unset: the job's trainer "
        "image",
    )
    p.add_argument(
        "--price-spot",
        type=float,
        default=_env_float("ETJ_PRICE_SPOT", DEFAULT_PRICE_SPOT),
        help="USD per spot worker-hour for status.cost when a job's spec.prices gives none "
        "($ETJ_PRICE_SPOT; the chart's prices.spotPerWorkerHour)",
    )
    p.add_argument(
        "--price-on-demand",
        type=float,
        default=_env_float("ETJ_PRICE_ON_DEMAND", DEFAULT_PRICE_ON_DEMAND),
        help="USD per on-demand worker-hour ($ETJ_PRICE_ON_DEMAND; the chart's prices.onDemandPerWorkerHour)",
    )
    p.add_argument(
        "--price-source",
        default=os.environ.get("ETJ_PRICE_SOURCE") or DEFAULT_PRICE_SOURCE,
        help="where the default prices come from, shown in status.cost.priceSource ($ETJ_PRICE_SOURCE)",
    )
    p.add_argument(
        "--on-demand-startup-seconds",
        type=float,
        default=_env_float("ETJ_ON_DEMAND_STARTUP_SECONDS", DeadlineCosts().on_demand_startup_s),
        help="deadline policy: seconds from asking for an on-demand worker to it training (node start-up)",
    )
    p.add_argument(
        "--resize-seconds",
        type=float,
        default=_env_float("ETJ_RESIZE_SECONDS", DeadlineCosts().resize_s),
        help="deadline policy: a resize's training stall, rendezvous included ($ETJ_RESIZE_SECONDS; "
        "the chart's deadline.resizeSeconds); part of the safety margin and of the no-thrash rule",
    )
    p.add_argument(
        "--extra-priority-class",
        default=os.environ.get("ETJ_EXTRA_PRIORITY_CLASS") or None,
        metavar="NAME",
        help="PriorityClass of workers beyond a job's replicas.min, lower than every job's and never "
        "preempting, so every job gets its min before any job more ($ETJ_EXTRA_PRIORITY_CLASS; the chart's "
        "sharing.extraPriorityClass); unset: every worker at its job's priority",
    )
    p.add_argument(
        "--default-capacity-type",
        choices=[c.value for c in CapacityType],
        default="on-demand",
        help="capacity type of nodes no known label describes",
    )
    p.add_argument(
        "--spot-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra node label marking spot capacity (repeatable)",
    )
    p.add_argument(
        "--on-demand-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra node label marking on-demand capacity (repeatable)",
    )
    p.add_argument(
        "--no-network-policy",
        dest="network_policy",
        action="store_false",
        help="do not create a NetworkPolicy per job (docs/operator.md, 'Threat model')",
    )
    p.add_argument(
        "--operator-namespace",
        default=os.environ.get("POD_NAMESPACE") or None,
        help="namespace of the operator's pods, for the jobs' NetworkPolicy (default: $POD_NAMESPACE, "
        "which the chart sets); unset: the progress port admits every source, guarded by the token alone",
    )
    p.add_argument(
        "--operator-pod-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="label of the operator's pods, for the jobs' NetworkPolicy (repeatable)",
    )
    p.add_argument(
        "--leader-elect",
        action="store_true",
        default=os.environ.get("ETJ_LEADER_ELECT", "").lower() in ("1", "true", "yes"),
        help="stand by for the Lease and run only while holding it: for more than one replica "
        "($ETJ_LEADER_ELECT; the chart sets it)",
    )
    p.add_argument(
        "--leader-election-namespace",
        default=os.environ.get("POD_NAMESPACE") or "default",
        help="namespace of the Lease (default: $POD_NAMESPACE)",
    )
    p.add_argument(
        "--leader-identity", default=None, help="this replica's name in the Lease (default: pod name)"
    )
    p.add_argument("--lease-seconds", type=int, default=leader.Election("", "").lease_s)
    p.add_argument("--renew-seconds", type=int, default=leader.Election("", "").renew_s)
    p.add_argument("--retry-seconds", type=int, default=leader.Election("", "").retry_s)
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


# The key the jobs' progress tokens are derived from (the chart keeps it in a Secret of its own).
TOKEN_KEY_ENV = "ETJ_OPERATOR_TOKEN_KEY"


def _rules(args: argparse.Namespace) -> CapacityRules:
    extra: list[tuple[str, str, CapacityType]] = []
    for raw, ctype in [(x, CapacityType.SPOT) for x in args.spot_label] + [
        (x, CapacityType.ON_DEMAND) for x in args.on_demand_label
    ]:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise SystemExit(f"--spot-label/--on-demand-label want KEY=VALUE, got {raw!r}")
        extra.append((key, value, ctype))
    return CapacityRules(extra=tuple(extra), default=CapacityType(args.default_capacity_type))


def _pairs(raw: list[str], flag: str) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} wants KEY=VALUE, got {item!r}")
        out.append((key, value))
    return tuple(out)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    try:
        return float(raw) if raw else default
    except ValueError as err:
        raise SystemExit(f"{name}={raw!r} is not a number") from err


def build_state(args: argparse.Namespace) -> handlers.State:
    key = os.environ.get(TOKEN_KEY_ENV, "")
    if not key:
        log.warning(
            "no %s: job tokens come from a random key, so after a restart this operator cannot read the "
            "progress of jobs started before it (fine for development; the chart sets one)",
            TOKEN_KEY_ENV,
        )
    settings = Settings(
        resync_seconds=args.resync_seconds,
        progress_seconds=args.progress_seconds,
        worker_grace_seconds=args.worker_grace_seconds,
        default_trainer_image=args.default_trainer_image or None,
        default_store_image=args.default_store_image or None,
        namespaces=tuple(args.namespace),
        network_policy=args.network_policy,
        operator_namespace=args.operator_namespace,
        operator_pod_labels=_pairs(args.operator_pod_label, "--operator-pod-label"),
        extra_priority_class=args.extra_priority_class or None,
        prices=PriceDefaults(args.price_spot, args.price_on_demand, args.price_source),
        deadline_costs=DeadlineCosts(
            on_demand_startup_s=args.on_demand_startup_seconds,
            resize_s=args.resize_seconds,
            decision_interval_s=args.resync_seconds,
        ),
    )
    if key:
        settings.token_key = key.encode()
    return handlers.State(settings, _rules(args))


async def operator(
    args: argparse.Namespace,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """The operator as a coroutine (also used by tests running it in a thread)."""
    if args.namespace:
        log.warning(
            "watching namespaces %s only: GPUs that pods of other namespaces use on shared nodes are "
            "not seen, so free-capacity estimates (scale-up timing, the CapacityAvailable condition) can "
            "be high; the scheduler still places every pod correctly (docs/operator.md, 'Namespaced mode')",
            ", ".join(args.namespace),
        )
    # Drains and creates run in threads (sync client); many at once when a pool loses nodes.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=64, thread_name_prefix="etj")
    )
    await kopf.operator(
        registry=handlers.KOPF_REGISTRY,
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None,
        memo=kopf.Memo(etj=build_state(args)),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def run_operator(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # read by kopf's login and by our client
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("kopf").setLevel(logging.WARNING)
    kopf.configure(verbose=args.verbose)
    serve(args.metrics_port)
    if args.leader_elect:
        return run_elected(args)
    try:
        asyncio.run(operator(args))
    except KeyboardInterrupt:
        return 130
    return 0


def run_elected(args: argparse.Namespace) -> int:
    """Stand by for the Lease; hold it while kopf runs. Losing it exits at once (status 1: the kubelet
    restarts the pod as a follower); SIGTERM stops kopf, hands the Lease back and exits 0."""
    election = leader.Election(
        namespace=args.leader_election_namespace,
        identity=args.leader_identity or leader.default_identity(),
        lease_s=args.lease_seconds,
        renew_s=args.renew_seconds,
        retry_s=args.retry_seconds,
    )
    api = kube_api.api_client()
    stop = threading.Event()
    leading = threading.Event()
    # Healthy while standing by (k8s/standby_health.py); kopf's own endpoint replaces it on leading.
    standby = StandbyHealth(args.liveness_port) if args.liveness_port else None

    def work() -> None:
        if standby is not None:
            standby.close()
        leading.set()
        asyncio.run(operator(args, stop_flag=stop))
        leader.release(election, api)
        log.info("%s: the operator stopped; exiting", election.identity)
        os._exit(0)  # the election's renew loop runs in the main thread: end the process from here

    def lost() -> None:
        log.error("%s lost the leader Lease: exiting so another replica leads alone", election.identity)
        os._exit(1)

    def on_sigterm(_signum: int, _frame: object) -> None:
        if not leading.is_set():
            raise SystemExit(0)  # a follower has nothing to stop
        stop.set()  # kopf finishes its handlers; work() then releases the Lease and exits

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)
    leader.lead(election, api, work, lost)
    return 1  # the election returned without leading (it only does when leadership is lost)


if __name__ == "__main__":
    sys.exit(run_operator(sys.argv[1:]))

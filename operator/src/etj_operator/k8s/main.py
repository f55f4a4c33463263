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
from etj_operator.decide.deadline.schedule import DeadlineCosts, PriceDefaults
from etj_operator.k8s import handlers, kube_api, leader, settings_table
from etj_operator.k8s.metrics import serve
from etj_operator.k8s.settings import SETTING_OPTIONS, Settings
from etj_operator.k8s.standby_health import StandbyHealth
from etj_operator.observe.nodes import CapacityRules

log = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The operator's flags (the chart's values end up here), from the table in k8s/settings_table.py."""
    return settings_table.parser().parse_args(argv)


# The key the jobs' progress tokens are derived from (the chart keeps it in a Secret of its own).
TOKEN_KEY_ENV = settings_table.TOKEN_KEY.env or ""


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


def build_state(args: argparse.Namespace) -> handlers.State:
    key = settings_table.TOKEN_KEY.from_env()
    if not key:
        log.warning(
            "no %s: job tokens come from a random key, so after a restart this operator cannot read the "
            "progress of jobs started before it (fine for development; the chart sets one)",
            TOKEN_KEY_ENV,
        )
    settings = Settings(
        **{o.dest: getattr(args, o.dest) for o in SETTING_OPTIONS},
        namespaces=tuple(args.namespace),
        operator_pod_labels=_pairs(args.operator_pod_label, "--operator-pod-label"),
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
    if args.kueue:
        handlers.register_kueue()
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

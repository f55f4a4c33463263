"""kopf wiring: an index over Nodes, the pod watch (k8s/pod_watch.py), handlers that wake the job loops.

No handler here decides anything: indices keep parsed state (``NodeInfo``, ``PodInfo``, GPU usage),
event handlers only kick the affected job's loop (``reconciler.JobRunner``), which calls the planner.

Pods are not watched through kopf (issue 29): kopf cannot filter a watch on the server and runs its
per-object machinery for every pod event, ours or not; pod_watch.py decodes each event once and feeds
``observe.pod_index`` (per-node usage kept incrementally, etj's pods by job).

Why no ``@kopf.timer``/``@kopf.daemon`` on the job: kopf puts a finalizer on objects with timers or
daemons, so a job could not be deleted while the operator is down. The per-job asyncio loop started
from ``@kopf.on.event`` gives the same "timer per job" without a finalizer, and without kopf's
progress annotations (event handlers are fire-and-forget).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import kopf

from etj_operator.api.models import GROUP, PLURAL, VERSION
from etj_operator.constants import LABEL_JOB
from etj_operator.k8s import kube_api, kueue_watch
from etj_operator.k8s.client import KubeClient
from etj_operator.k8s.job_runners import JobRunners
from etj_operator.k8s.metrics import METRICS
from etj_operator.k8s.pod_watch import Event, PodWatch
from etj_operator.k8s.settings import Settings
from etj_operator.observe.nodes import DEFAULT_RULES, CapacityRules, NodeInfo, node_info
from etj_operator.observe.pod_index import JobPods, UsageLedger, pod_contribution, pod_uid
from etj_operator.observe.pods import PodInfo, pod_info
from etj_operator.observe.signals import Signal
from etj_operator.timeutil import utcnow

log = logging.getLogger(__name__)
KOPF_REGISTRY = kopf.OperatorRegistry()
TOMBSTONE_TTL = timedelta(minutes=10)


class _MergedUsage(Mapping[str, Mapping[str, int]]):
    """Several namespaces' ledgers read as one (namespaced mode with more than one namespace)."""

    def __init__(self, ledgers: list[UsageLedger]) -> None:
        self._views = [ledger.view for ledger in ledgers]

    def __getitem__(self, key: str) -> Mapping[str, int]:
        found = [v[key] for v in self._views if key in v]
        if not found:
            raise KeyError(key)
        total: dict[str, int] = {}
        for req in found:
            for res, n in req.items():
                total[res] = total.get(res, 0) + n
        return total

    def __iter__(self) -> Iterator[str]:
        return iter({k for v in self._views for k in v})

    def __len__(self) -> int:
        return len({k for v in self._views for k in v})


class State:
    """Everything the handlers share, kept in kopf's memo."""

    def __init__(self, settings: Settings, rules: CapacityRules = DEFAULT_RULES) -> None:
        self.settings = settings
        self.rules = rules
        # Node name → NodeInfo, kept by the node index's own calls (etj_nodes) and node deletions. kopf's
        # index stays registered (its readiness holds the handlers until every node was listed), but a
        # plan reads nodes through this plain dict: reading kopf's index node by node (a Store per key)
        # cost ~5 µs a node, so at 1,000 nodes the planner's capacity pass took 5-20 ms and the drains of
        # 50 tainted nodes queued behind each other's plans on the event loop (issue 29).
        self.node_map: dict[str, NodeInfo] = {}
        self.tombstones: dict[str, datetime] = {}
        self.first_seen: dict[tuple[str, str], datetime] = {}  # (node or pod, reason) → first observed
        self.node_state: dict[str, tuple[str | None, bool]] = {}  # node → (signal reason, schedulable)
        self.runners: JobRunners | None = None
        # One ledger and one JobPods per watched namespace ("" : all); a relist replaces only its own.
        self.scopes = settings.namespaces or ("",)
        self.usage = {ns: UsageLedger() for ns in self.scopes}
        self.pods = {ns: JobPods() for ns in self.scopes}
        self.unlisted = set(self.scopes)  # scopes whose first listing has not arrived yet
        self.pods_listed = asyncio.Event()  # the job loops plan only after every pod was listed once
        self.watches: list[PodWatch] = []
        # Kueue's objects (k8s/kueue_watch.py), only with --kueue.
        self.kueue = kueue_watch.KueueIndex() if settings.kueue else None

    # World protocol (settings.World)
    def nodes(self) -> Mapping[str, NodeInfo]:
        return self.node_map

    def node_usage(self) -> Mapping[str, Mapping[str, int]]:
        if len(self.usage) == 1:
            return next(iter(self.usage.values())).view
        return _MergedUsage(list(self.usage.values()))

    def deleted_nodes(self) -> Mapping[str, datetime]:
        cutoff = utcnow() - TOMBSTONE_TTL
        for name, when in list(self.tombstones.items()):
            if when < cutoff:
                del self.tombstones[name]
        return self.tombstones

    def job_pods(self, namespace: str, job: str) -> list[PodInfo]:
        book = self.pods.get("") or self.pods.get(namespace)
        return book.get(namespace, job) if book is not None else []

    def jobs_on_node(self, node: str) -> set[tuple[str, str]]:
        # A scan of our own pods (a few per job) instead of a node-keyed index: it runs only when a node
        # changes state, while an index would cost work on every pod event.
        return {
            key
            for book in self.pods.values()
            for key, pods in book.items()
            if any(p.node == node for p in pods)
        }

    # Pod watch callbacks (run on the event loop)
    def pods_relisted(self, scope: str, items: list[dict[str, Any]]) -> None:
        self.usage[scope].replace_all(
            {pod_uid(b): c for b in items if (c := pod_contribution(b)) is not None}
        )
        book = self.pods[scope]
        touched = book.keys()
        book.clear()
        for body in items:
            self._job_pod(book, "ADDED", body)
        touched |= book.keys()
        self.unlisted.discard(scope)
        if not self.unlisted:
            self.pods_listed.set()
        self._kick(touched)

    def pod_events(self, scope: str, batch: list[Event]) -> None:
        METRICS.watch_events.labels("pods").inc(len(batch))
        ledger, book = self.usage[scope], self.pods[scope]
        touched: set[tuple[str, str]] = set()
        for kind, body in batch:
            ledger.apply(pod_uid(body), None if kind == "DELETED" else pod_contribution(body))
            key = self._job_pod(book, kind, body)
            if key is not None:
                touched.add(key)
        self._kick(touched)

    def _job_pod(self, book: JobPods, kind: str, body: Mapping[str, Any]) -> tuple[str, str] | None:
        meta = body.get("metadata") or {}
        job = (meta.get("labels") or {}).get(LABEL_JOB)
        if job is None:
            return None  # not ours: it only counted toward its node's usage
        ns, name = meta.get("namespace") or "", meta.get("name") or ""
        if kind == "DELETED":
            book.remove(ns, job, name)
            self.stamp(f"pod/{ns}/{name}", None)
        else:
            info = pod_info(body)
            book.put(ns, job, replace(info, signal=self.stamp(f"pod/{ns}/{name}", info.signal)))
        return (ns, job)

    def _kick(self, keys: set[tuple[str, str]]) -> None:
        if self.runners is not None:
            for ns, job in keys:
                self.runners.kick(ns, job)

    def stamp(self, key: str, signal: Signal | None) -> Signal | None:
        """Give a signal the time the operator first saw it (the start of the drain-latency clock).

        The operator's own clock is used rather than a taint's timeAdded, which most tools leave empty
        and which comes from another machine's clock.
        """
        if signal is None:
            for k in [k for k in self.first_seen if k[0] == key]:
                del self.first_seen[k]
            return None
        seen = self.first_seen.setdefault((key, signal.reason), utcnow())
        return Signal(signal.reason, signal.message, seen)


def _state(memo: Any) -> State:
    state = memo.get("etj") if isinstance(memo, Mapping) else getattr(memo, "etj", None)
    if not isinstance(state, State):
        raise RuntimeError("operator state missing from memo; start the operator with runner.run_operator")
    return state


# --- indices -------------------------------------------------------------------------------------
# Every handler is ``async`` on purpose: kopf runs sync handlers in executor threads, and these touch
# loop-bound state (asyncio.Event.set() from another thread does not wake the waiting loop, so a kick
# could sit unnoticed until the next timer) and dicts the job loops read. Async also saves a thread
# hop per watch event on the drain path.
@kopf.index("nodes", registry=KOPF_REGISTRY)
async def etj_nodes(name: str, body: kopf.Body, memo: Any, **_: Any) -> dict[str, NodeInfo]:
    state = _state(memo)
    info = node_info(body, state.rules)
    info = replace(info, signal=state.stamp(f"node/{name}", info.signal))
    state.node_map[name] = info
    return {name: info}


def register_kueue() -> None:
    """Watch Kueue's objects too (--kueue): they exist only where Kueue's CRDs are installed."""

    def index_of(memo: Any) -> kueue_watch.KueueIndex:
        index = _state(memo).kueue
        if index is None:
            raise RuntimeError("--kueue handlers registered without a Kueue index")
        return index

    def kick(memo: Any, namespace: str, job: str) -> None:
        runners = _state(memo).runners
        if runners is not None:
            runners.kick(namespace, job)

    kueue_watch.register(KOPF_REGISTRY, index_of, kick)


# --- lifecycle -----------------------------------------------------------------------------------
@kopf.on.login(registry=KOPF_REGISTRY)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # A custom registry does not get kopf's default login handlers: in-cluster first, then kubeconfig
    # (kopf's own parser, which reads $KUBECONFIG at call time).
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup(registry=KOPF_REGISTRY)
async def startup(settings: kopf.OperatorSettings, memo: Any, **kwargs: Any) -> None:
    state = _state(memo)
    settings.posting.level = logging.WARNING  # post our own Events, not kopf's log lines
    settings.batching.batch_window = 0.02  # drain latency: do not sit on node events
    settings.watching.server_timeout = 300
    # kopf's own calls time out too: a watch the apiserver stopped serving (it ends streams by
    # server_timeout) is reopened after client_timeout; status patches and Events give up after 60 s.
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = kube_api.REQUEST_TIMEOUT[0]
    settings.networking.connect_timeout = kube_api.REQUEST_TIMEOUT[0]
    settings.networking.request_timeout = 60
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    api = kube_api.api_client()  # a timeout on every request
    state.runners = JobRunners(state, KubeClient(api), state.settings, state.kueue)
    loop = asyncio.get_running_loop()
    for scope in state.scopes:
        watch = PodWatch(
            kube_api.api_client(),  # its own connections: a long watch never waits behind a drain
            scope or None,
            loop,
            listed=partial(state.pods_relisted, scope),
            events=partial(state.pod_events, scope),
        )
        watch.start()
        state.watches.append(watch)


@kopf.on.cleanup(registry=KOPF_REGISTRY)
async def cleanup(memo: Any, **_: Any) -> None:
    state = _state(memo)
    for watch in state.watches:
        watch.stop()
    if state.runners is not None:
        await state.runners.stop_all()
        await state.runners.store.close()


# --- events that wake job loops -------------------------------------------------------------------
@kopf.on.event(GROUP, VERSION, PLURAL, registry=KOPF_REGISTRY)
async def job_event(
    type: str | None, body: kopf.Body, namespace: str | None, name: str, memo: Any, **_: Any
) -> None:
    state = _state(memo)
    # Like kopf's own indices: no plan before every pod was listed once, or a job's loop would see none
    # of its workers and create them again (or count a busy node's GPUs as free).
    await state.pods_listed.wait()
    runners = state.runners
    if runners is None:
        return
    if type == "DELETED":
        await runners.remove(namespace or "", name)
    else:
        runners.upsert(body)


@kopf.on.event("nodes", registry=KOPF_REGISTRY)
async def node_event(type: str | None, name: str, body: kopf.Body, memo: Any, **_: Any) -> None:
    METRICS.watch_events.labels("nodes").inc()
    state = _state(memo)
    runners = state.runners
    if runners is None:
        return
    if type == "DELETED":
        state.node_map.pop(name, None)
        state.tombstones[name] = utcnow()
        state.node_state.pop(name, None)
        state.stamp(f"node/{name}", None)
        for ns, job in state.jobs_on_node(name):
            runners.kick(ns, job)
        return
    state.tombstones.pop(name, None)
    info = state.nodes().get(name)
    if info is None:
        return
    now_state = (info.signal.reason if info.signal else None, info.schedulable)
    before = state.node_state.get(name)
    state.node_state[name] = now_state
    if before == now_state:
        return  # heartbeats and label churn: nothing a plan depends on changed
    if info.signal is not None:
        for ns, job in state.jobs_on_node(name):
            runners.kick(ns, job)
    elif info.schedulable:
        # New or recovered capacity: only jobs short of workers can use it.
        for runner in runners:
            st = runner.status
            if st is None or (st.current_replicas or 0) < (st.desired_replicas or 0):
                runner.kick.set()

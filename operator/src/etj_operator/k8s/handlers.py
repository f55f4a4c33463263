"""kopf wiring: indices over Nodes and Pods, event handlers that wake the per-job loops.

No handler here decides anything: indices keep parsed state (``NodeInfo``, ``PodInfo``, GPU usage),
event handlers only kick the affected job's loop (``reconciler.JobRunner``), which calls the planner.

Why no ``@kopf.timer``/``@kopf.daemon`` on the job: kopf puts a finalizer on objects with timers or
daemons, so a job could not be deleted while the operator is down. The per-job asyncio loop started
from ``@kopf.on.event`` gives the same "timer per job" without a finalizer, and without kopf's
progress annotations (event handlers are fire-and-forget).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import kopf

from etj_operator.api.models import GROUP, PLURAL, VERSION
from etj_operator.constants import LABEL_JOB
from etj_operator.k8s import kube_api
from etj_operator.k8s.client import KubeClient
from etj_operator.k8s.metrics import METRICS
from etj_operator.k8s.reconciler import JobRunners
from etj_operator.k8s.settings import Settings
from etj_operator.observe.nodes import DEFAULT_RULES, CapacityRules, NodeInfo, node_info
from etj_operator.observe.pods import TERMINAL_PHASES, PodInfo, countable_requests, pod_info
from etj_operator.observe.signals import Signal
from etj_operator.timeutil import utcnow

log = logging.getLogger(__name__)
KOPF_REGISTRY = kopf.OperatorRegistry()
TOMBSTONE_TTL = timedelta(minutes=10)


class _First(Mapping[Any, Any]):
    """Read-only view of a kopf index whose keys hold one value each (e.g. node name → NodeInfo)."""

    def __init__(self, index: Mapping[Any, Any]) -> None:
        self._index = index

    def __getitem__(self, key: Any) -> Any:
        return next(iter(self._index[key]))

    def __iter__(self) -> Iterator[Any]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


class _Usage(Mapping[str, Mapping[str, int]]):
    """Node name → resources requested by all pods bound there (summed over the index's values)."""

    def __init__(self, index: Mapping[str, Any]) -> None:
        self._index = index

    def __getitem__(self, key: str) -> Mapping[str, int]:
        total: dict[str, int] = {}
        for req in self._index[key]:
            for res, n in req.items():
                total[res] = total.get(res, 0) + n
        return total

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


class State:
    """Everything the handlers share, kept in kopf's memo."""

    def __init__(self, settings: Settings, rules: CapacityRules = DEFAULT_RULES) -> None:
        self.settings = settings
        self.rules = rules
        self.indices: dict[str, Mapping[Any, Any]] = {}
        self.tombstones: dict[str, datetime] = {}
        self.first_seen: dict[tuple[str, str], datetime] = {}  # (node or pod, reason) → first observed
        self.node_state: dict[str, tuple[str | None, bool]] = {}  # node → (signal reason, schedulable)
        self.runners: JobRunners | None = None

    # World protocol (settings.World)
    def nodes(self) -> Mapping[str, NodeInfo]:
        return _First(self.indices["etj_nodes"])

    def node_usage(self) -> Mapping[str, Mapping[str, int]]:
        return _Usage(self.indices["etj_node_usage"])

    def deleted_nodes(self) -> Mapping[str, datetime]:
        cutoff = utcnow() - TOMBSTONE_TTL
        for name, when in list(self.tombstones.items()):
            if when < cutoff:
                del self.tombstones[name]
        return self.tombstones

    def job_pods(self, namespace: str, job: str) -> list[PodInfo]:
        index = self.indices["etj_job_pods"]
        return list(index.get((namespace, job), ()))

    def jobs_on_node(self, node: str) -> set[tuple[str, str]]:
        # A scan of our own pods (a few per job) instead of a third pod index: it runs only when a node
        # changes state, while an index would cost a handler call on every pod event.
        return {
            key for key, pods in self.indices["etj_job_pods"].items() if any(p.node == node for p in pods)
        }

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
    return {name: replace(info, signal=state.stamp(f"node/{name}", info.signal))}


@kopf.index("pods", labels={LABEL_JOB: kopf.PRESENT}, registry=KOPF_REGISTRY)
async def etj_job_pods(
    namespace: str | None, name: str, body: kopf.Body, labels: Mapping[str, str], memo: Any, **_: Any
) -> dict[tuple[str, str], PodInfo]:
    info = pod_info(body)
    stamped = _state(memo).stamp(f"pod/{namespace}/{name}", info.signal)
    return {(namespace or "", labels[LABEL_JOB]): replace(info, signal=stamped)}


@kopf.index("pods", registry=KOPF_REGISTRY)
async def etj_node_usage(spec: kopf.Spec, status: kopf.Status, **_: Any) -> dict[str, dict[str, int]] | None:
    node = spec.get("nodeName")
    if not node or status.get("phase") in TERMINAL_PHASES:
        return None  # finished pods hold no devices
    requests = countable_requests(spec)
    return {node: requests} if requests else None


# --- lifecycle -----------------------------------------------------------------------------------
@kopf.on.login(registry=KOPF_REGISTRY)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # A custom registry does not get kopf's default login handlers: in-cluster first, then kubeconfig
    # (kopf's own parser, which reads $KUBECONFIG at call time).
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup(registry=KOPF_REGISTRY)
async def startup(settings: kopf.OperatorSettings, memo: Any, **kwargs: Any) -> None:
    state = _state(memo)
    # Indices are live mappings; keep references so the job loops can read them between events.
    for name in ("etj_nodes", "etj_job_pods", "etj_node_usage"):
        state.indices[name] = kwargs[name]
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
    state.runners = JobRunners(state, KubeClient(api), state.settings)


@kopf.on.cleanup(registry=KOPF_REGISTRY)
async def cleanup(memo: Any, **_: Any) -> None:
    state = _state(memo)
    if state.runners is not None:
        await state.runners.stop_all()
        await state.runners.store.close()


# --- events that wake job loops -------------------------------------------------------------------
@kopf.on.event(GROUP, VERSION, PLURAL, registry=KOPF_REGISTRY)
async def job_event(
    type: str | None, body: kopf.Body, namespace: str | None, name: str, memo: Any, **_: Any
) -> None:
    runners = _state(memo).runners
    if runners is None:
        return
    if type == "DELETED":
        await runners.remove(namespace or "", name)
    else:
        runners.upsert(body)


@kopf.on.event("pods", labels={LABEL_JOB: kopf.PRESENT}, registry=KOPF_REGISTRY)
async def pod_event(namespace: str | None, labels: Mapping[str, str], memo: Any, **_: Any) -> None:
    METRICS.watch_events.labels("pods").inc()
    runners = _state(memo).runners
    if runners is not None:
        runners.kick(namespace or "", labels[LABEL_JOB])


@kopf.on.event("nodes", registry=KOPF_REGISTRY)
async def node_event(type: str | None, name: str, body: kopf.Body, memo: Any, **_: Any) -> None:
    METRICS.watch_events.labels("nodes").inc()
    state = _state(memo)
    runners = state.runners
    if runners is None:
        return
    if type == "DELETED":
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

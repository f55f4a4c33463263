"""Process-backed nodes: a small kubelet stand-in that runs pods as local processes (test/demo harness).

For every Node matching the selector (default `etj.dev/node-runtime=process`) the harness
- keeps the node Ready: status conditions and addresses (InternalIP 127.0.0.1), and a Lease in
  `kube-node-lease` renewed every few seconds — stop the harness and the real node lifecycle controller
  marks the node NotReady and taints it, as it would a dead kubelet;
- runs each pod the scheduler binds to it: the container's command/args with its env (fieldRefs,
  ConfigMap/Secret refs, `$(VAR)` expansion), from the venv (`etj-train` and `python` resolve; the image
  is ignored), each pod on its own loopback address 127.0.x.y reported as the pod IP (and `ETJ_POD_IP`);
- on deletion sends SIGTERM, waits the grace period, sends SIGKILL, then removes the pod object.
A node deleted from the API, or the harness stopping, kills its pods' processes at once: the machine is gone.

Files: `<root>/pods/<namespace>/<pod>-<uid8>/` holds `<container>.log` (stdout+stderr; `logs_of`),
`scratch/` (the working directory, also `ETJ_SCRATCH_DIR`) and `volumes/<name>/` per emptyDir
(`ETJ_VOLUME_<NAME>`; one mounted at /tmp becomes TMPDIR). Processes see the host filesystem: volume
mounts are not performed. Names: a `<svc>.<ns>.svc[.cluster.local]` in env values or args is replaced by
an endpoint IP of that Service before the process starts (there is no cluster DNS on loopback); pods
reach each other by pod IP. Readiness probes (tcpSocket, httpGet) run; liveness/startup probes do not.

Run it with `python -m etj_testbed.localcluster.proclet --kubeconfig K`, or `Proclet(...).start()` /
`launch.start_subprocess(...)` from tests and the demo. What a runner looks up (ConfigMaps, Secrets,
Services) is `lookups.py`'s; the pod's own life is `pod.py`'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from etj_testbed.localcluster import toolchain
from etj_testbed.localcluster.components import DEFAULT_PORT_BASE
from etj_testbed.localcluster.proclet.env import LoopbackIPs, pod_network
from etj_testbed.localcluster.proclet.kube import Gone, Kube, delete_pod
from etj_testbed.localcluster.proclet.lookups import Lookups
from etj_testbed.localcluster.proclet.nodes import (
    INSTANCE_LABEL,
    NODE_RUNTIME_LABEL,
    NODE_RUNTIME_PROCESS,
    post_node_status,
    process_node,
    renew_lease,
    selector_for,
)
from etj_testbed.localcluster.proclet.pod import PodRunner, RunnerContext
from etj_testbed.localcluster.proclet.proc import iter_pids_with_marker, reap_marked

__all__ = [
    "INSTANCE_LABEL",
    "NODE_RUNTIME_LABEL",
    "Proclet",
    "iter_pids_with_marker",
    "process_node",
    "selector_for",
]

log = logging.getLogger("etj.proclet")

JSON = dict[str, Any]
DEFAULT_SELECTOR = f"{NODE_RUNTIME_LABEL}={NODE_RUNTIME_PROCESS}"
LEASE_RENEW_S = 5.0  # kcm runs with --node-monitor-grace-period=20s: renew well inside it
LEASE_DURATION_S = 40
STATUS_EVERY_S = 30.0  # full node status heartbeat (the lease is what keeps the node alive)
STOP_GRACE_S = 5.0  # grace given to pods' processes when the harness itself stops
TERMINAL = ("Succeeded", "Failed")
# Passed from the harness's environment to pods: what a process needs to run at all, and GPU visibility.
# PYTHONPATH: pods run the checkout the harness runs (a worktree beside an editable install too).
PASS_ENV = (
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "USER",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "PYTHONPATH",
)


class Proclet:
    def __init__(
        self,
        kubeconfig: str | os.PathLike[str] | None,
        root: Path | None = None,
        selector: str = DEFAULT_SELECTOR,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.kube = Kube(str(kubeconfig) if kubeconfig else None)
        self.root = Path(root or toolchain.cache_root() / "proclet").resolve()
        self.selector = selector
        self.stop_grace_s = stop_grace_s
        bindir = str(Path(sys.executable).parent)
        base = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        base["PATH"] = os.pathsep.join([bindir, os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
        # Two harnesses on one machine (two clones' test runs, a demo beside a test) must not hand out
        # the same pod addresses: their stores would fight over one host:port.
        ips = LoopbackIPs(pod_network(os.environ, DEFAULT_PORT_BASE))
        self.lookups = Lookups(self.kube, ips)
        self.ctx = RunnerContext(
            self.kube,
            ips,
            self.root,
            base,
            self.lookups.data,
            self.lookups.service,
            self.lookups.address_key,
        )
        self.nodes: dict[str, JSON] = {}
        self.pods: dict[str, JSON] = {}  # every bound pod by uid (pods may be seen before their node)
        self.runners: dict[str, PodRunner] = {}
        # Runners of deleted pods, newest last: logs_of/runner/pids still answer for them (tests, demo).
        self.history: deque[PodRunner] = deque(maxlen=256)
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._responses: list[Any] = []
        self._status_at: dict[str, float] = {}

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> Proclet:
        self.root.mkdir(parents=True, exist_ok=True)
        leftovers = reap_marked(str(self.root))  # processes of an earlier harness that crashed
        if leftovers:
            log.warning("killed %d processes left by an earlier harness in %s", len(leftovers), self.root)
        for name, target in (
            ("nodes", self._watch_nodes),
            ("pods", self._watch_pods),
            ("heartbeat", self._heartbeat),
        ):
            thread = threading.Thread(target=target, name=f"proclet {name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Kill every pod process (SIGTERM, short grace, SIGKILL) and stop watching; no orphans remain."""
        if self._closed:
            return
        self._closed = True
        self._stopped.set()
        self.drop_watches()  # unblocks the watch threads waiting for their next event
        with self._lock:
            runners = list(self.runners.values())
        for runner in runners:
            runner.stop(self._grace(runner.pod, cap=self.stop_grace_s), finalize=False, report=False)
        for runner in runners:
            runner.join(self.stop_grace_s + 10)
        reap_marked(str(self.root))
        self.lookups.close()
        for thread in self._threads:
            thread.join(5)
        self.kube.close()

    def __enter__(self) -> Proclet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run_forever(self) -> None:
        self.start()
        try:
            while not self._stopped.wait(1):
                pass
        finally:
            self.stop()

    # ---- for tests and the demo -------------------------------------------------------------

    def runner(self, namespace: str, name: str) -> PodRunner | None:
        """The newest runner for the pod `namespace/name`."""
        with self._lock:
            found = [r for r in [*self.history, *self.runners.values()] if r.key == f"{namespace}/{name}"]
        return found[-1] if found else None

    def log_path(self, namespace: str, name: str, container: str | None = None) -> Path | None:
        runner = self.runner(namespace, name)
        if runner is None:
            return None
        return runner.log_path(container or runner.pod["spec"]["containers"][0]["name"])

    def logs_of(self, namespace: str, name: str, container: str | None = None) -> str:
        path = self.log_path(namespace, name, container)
        return path.read_text(errors="replace") if path and path.exists() else ""

    def drop_watches(self) -> None:
        """End the current watch connections, as an apiserver restart would; the harness relists."""
        for resp in list(self._responses):
            with contextlib.suppress(Exception):
                resp.shutdown()

    def pids(self) -> list[int]:
        """Every process group leader this harness started (alive or not)."""
        with self._lock:
            return [pid for r in [*self.history, *self.runners.values()] for pid in r.pids]

    # ---- nodes ------------------------------------------------------------------------------

    def _watch_nodes(self) -> None:
        self._watch("/api/v1/nodes", {"labelSelector": self.selector}, self._sync_nodes, self._node_event)

    def _sync_nodes(self, items: list[JSON]) -> None:
        names = {n["metadata"]["name"] for n in items}
        for gone in set(self.nodes) - names:
            self._node_event("DELETED", self.nodes[gone])
        for node in items:
            self._node_event("MODIFIED", node)

    def _node_event(self, kind: str, node: JSON) -> None:
        name = node["metadata"]["name"]
        if kind == "DELETED":
            with self._lock:
                self.nodes.pop(name, None)
                doomed = [r for r in self.runners.values() if r.pod["spec"].get("nodeName") == name]
            for runner in doomed:
                runner.stop(0, finalize=False, report=False)
            log.info("node %s gone: killed %d pods", name, len(doomed))
            return
        with self._lock:
            new = name not in self.nodes
            self.nodes[name] = node
            waiting = [p for p in self.pods.values() if p["spec"].get("nodeName") == name]
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (node.get("status") or {}).get("conditions") or []
        )
        if new or not ready:
            self._post_node_status(node)
            self._renew_lease(node)
        if new:
            for pod in waiting:
                self._pod_event("MODIFIED", pod)

    def _heartbeat(self) -> None:
        while not self._stopped.wait(LEASE_RENEW_S):
            with self._lock:
                nodes = list(self.nodes.values())
            for node in nodes:
                self._renew_lease(node)
                if time.monotonic() - self._status_at.get(node["metadata"]["name"], 0) > STATUS_EVERY_S:
                    self._post_node_status(node)

    def _post_node_status(self, node: JSON) -> None:
        if post_node_status(self.kube, node):
            self._status_at[node["metadata"]["name"]] = time.monotonic()

    def _renew_lease(self, node: JSON) -> None:
        renew_lease(self.kube, node, LEASE_DURATION_S)

    # ---- pods -------------------------------------------------------------------------------

    def _watch_pods(self) -> None:
        # Only bound pods; which node they are on is filtered here (one watch for any number of nodes).
        self._watch("/api/v1/pods", {"fieldSelector": "spec.nodeName!="}, self._sync_pods, self._pod_event)

    def _sync_pods(self, items: list[JSON]) -> None:
        uids = {p["metadata"]["uid"] for p in items}
        with self._lock:
            vanished = [self.pods[u] for u in set(self.pods) - uids]
        for pod in vanished:
            self._pod_event("DELETED", pod)
        for pod in items:
            self._pod_event("MODIFIED", pod)

    def _pod_event(self, kind: str, pod: JSON) -> None:
        meta, uid = pod["metadata"], pod["metadata"]["uid"]
        with self._lock:
            if kind == "DELETED":
                self.pods.pop(uid, None)
                runner = self.runners.pop(uid, None)
                if runner is not None:  # force-deleted, or deleted while we were not watching
                    runner.stop(0, finalize=False, report=False)
                    self.history.append(runner)
                return
            self.pods[uid] = pod
            if pod["spec"].get("nodeName") not in self.nodes or self._stopped.is_set():
                return
            runner = self.runners.get(uid)
            if runner is None:
                status = pod.get("status") or {}
                if meta.get("deletionTimestamp"):
                    # Deleted before it ran under this harness (processes of an earlier one were reaped
                    # at start): nothing to stop, only the deletion to finish.
                    threading.Thread(target=delete_pod, args=(self.kube, pod), daemon=True).start()
                    return
                if status.get("phase") in TERMINAL:
                    return  # finished before this harness started; nothing to run
                states = [s.get("state") or {} for s in status.get("containerStatuses") or []]
                recovered = any("running" in st or "terminated" in st for st in states)
                runner = PodRunner(self.ctx, pod, recovered=recovered)
                self.runners[uid] = runner
                runner.start()
                return
        runner.observe(pod)

    def _grace(self, pod: JSON, cap: float) -> float:
        return min(float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)), cap)

    # ---- list + watch -----------------------------------------------------------------------

    def _watch(
        self,
        path: str,
        query: dict[str, str],
        sync: Callable[[list[JSON]], None],
        handle: Callable[[str, JSON], None],
    ) -> None:
        """List, then watch from the list's resourceVersion; relist after 410 Gone or any error, so the
        state is always rebuilt from what the apiserver has, never from missed events."""
        version: str | None = None
        while not self._stopped.is_set():
            try:
                if version is None:
                    listed = self.kube.get(path, **query)
                    sync(listed.get("items") or [])
                    version = listed["metadata"]["resourceVersion"]
                for kind, obj in self.kube.watch(path, version, self._responses.append, **query):
                    if self._stopped.is_set():
                        return
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if kind != "BOOKMARK":
                        handle(kind, obj)
            except Gone:
                version = None
            except Exception as exc:
                if self._stopped.is_set():
                    return
                log.warning("watch %s failed (%s); relisting", path, exc)
                version = None
                self._stopped.wait(1)
            finally:
                self._responses.clear()

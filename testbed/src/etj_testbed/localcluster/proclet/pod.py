"""One process-backed pod: start its containers as local processes, report status, stop them on deletion.

Each pod has one thread (`PodRunner`) that owns its processes and is the only writer of its status, so
status writes never race each other. The kubelet's rules it follows: init containers run in order before
the containers; restartPolicy decides whether an exited container restarts (with back-off); deletion sends
SIGTERM, waits the grace period, sends SIGKILL, then deletes the pod object with gracePeriodSeconds=0 and
the pod's uid as precondition; whatever is left of a container's process group is killed ("cgroup kill").
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kubernetes.client.rest import ApiException

from etj_testbed.localcluster.proclet.env import (
    AddressKey,
    DataLookup,
    LoopbackIPs,
    ServiceLookup,
    command_line,
    service_names,
    substitute_services,
)
from etj_testbed.localcluster.proclet.kube import Kube, delete_pod, now_rfc3339, pod_path
from etj_testbed.localcluster.proclet.nodes import pull_seconds
from etj_testbed.localcluster.proclet.pod_env import HOST_IP, container_environment, tmp_link
from etj_testbed.localcluster.proclet.proc import killpg, probe, reap_marked
from etj_testbed.localcluster.proclet.status import START_MARK, ContainerRun, last_run, pod_status

log = logging.getLogger("etj.proclet")

JSON = dict[str, Any]
MIN_GRACE_S = 2.0  # the kubelet's minimum, also used for force-deleted pods
POLL_S = 0.25
# How long a pod waits for a Service name in its env/args to get an endpoint before starting anyway.
STABLE_ADDRESS_WAIT_S = 30.0  # > the store pod's grace period (10 s)
RESOLVE_TIMEOUT_S = float(os.environ.get("ETJ_PROCLET_RESOLVE_TIMEOUT", "120"))


@dataclass
class RunnerContext:
    """What every runner shares: the API, the address pool, where pods live, and lookups."""

    kube: Kube
    ips: LoopbackIPs
    root: Path
    base_env: dict[str, str]
    lookup_data: DataLookup
    lookup_service: ServiceLookup
    address_key: AddressKey = lambda _pod: None


@dataclass
class _Stop:
    grace: float
    finalize: bool  # delete the pod object afterwards (it was deleted through the API)
    report: bool  # write a final status (not when the node or the harness is going away)


@dataclass
class PodRunner:
    ctx: RunnerContext
    pod: JSON
    recovered: bool = False  # the pod ran under an earlier harness whose processes are gone
    ip: str | None = None
    pids: list[int] = field(default_factory=list)  # every process group leader started, for tests
    done: threading.Event = field(default_factory=threading.Event)
    _stop: _Stop | None = None
    _wake: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _runs: dict[str, ContainerRun] = field(default_factory=dict)
    _finished: bool = False
    _finalized: bool = False
    _thread: threading.Thread | None = None

    # ---- called from the harness's threads --------------------------------------------------

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def key(self) -> str:
        meta = self.pod["metadata"]
        return f"{meta['namespace']}/{meta['name']}"

    @property
    def dir(self) -> Path:
        meta = self.pod["metadata"]
        return self.ctx.root / "pods" / meta["namespace"] / f"{meta['name']}-{self.uid[:8]}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=f"pod {self.key}", daemon=True)
        self._thread.start()

    def observe(self, pod: JSON) -> None:
        """A newer version of the pod from the watch; a deletionTimestamp starts graceful termination."""
        self.pod = pod
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            grace = meta.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            self.stop(float(grace), finalize=True, report=True)

    def stop(self, grace: float, finalize: bool, report: bool) -> None:
        with self._lock:
            grace = max(grace, MIN_GRACE_S)
            if self._stop is None:
                self._stop = _Stop(grace, finalize, report)
            else:  # a later, shorter deadline wins (kubectl delete --grace-period=1 after a normal delete)
                self._stop = _Stop(
                    min(grace, self._stop.grace),
                    self._stop.finalize or finalize,
                    self._stop.report and report,
                )
            # A pod that already finished has no thread left to finish its deletion: do it here.
            delete_now = self._finished and finalize and not self._finalized
            self._finalized |= delete_now
        self._wake.set()
        if delete_now:
            self._delete()

    def exit_codes(self) -> dict[str, int | None]:
        """The containers' last exit codes (None: still running or never started)."""
        return {name: run.exit_code for name, run in self._runs.items() if not run.init}

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- the pod's thread -------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._prepare()
            if self._stop is None:
                self._run()
        except Exception:
            log.exception("pod %s: runner failed", self.key)
        finally:
            self._terminate()
            self.done.set()

    def _prepare(self) -> None:
        meta = self.pod["metadata"]
        # A pod behind a headless Service takes over the Service's address (the name its clients hold, as
        # cluster DNS would); a predecessor still shutting down gets a moment to let go of it.
        stable = self.ctx.address_key(self.pod)
        self.ip = (
            self.ctx.ips.allocate(stable, wait_s=STABLE_ADDRESS_WAIT_S)
            if stable
            else self.ctx.ips.allocate(self.key)
        )
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "scratch").mkdir(exist_ok=True)
        spec = self.pod["spec"]
        for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
            self._runs[c["name"]] = ContainerRun(c, init=c in (spec.get("initContainers") or []))
        if not self.recovered:  # a pod that already ran reports its loss in _run, not a step back
            self._report("Pending")
        log.info(
            "pod %s/%s on %s: ip %s, dir %s",
            meta["namespace"],
            meta["name"],
            spec.get("nodeName"),
            self.ip,
            self.dir,
        )

    def _run(self) -> None:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if self.recovered and policy == "Never":
            # A real kubelet that lost its containers reports exactly this.
            for run in self._runs.values():
                run.terminated = {
                    "exitCode": 137,
                    "reason": "ContainerStatusUnknown",
                    "message": "The container could not be located when the pod was terminated",
                    "startedAt": now_rfc3339(),
                    "finishedAt": now_rfc3339(),
                }
            self._report("Failed")
            return
        if not self.recovered and not self._pulled():
            return
        inits = [r for r in self._runs.values() if r.init]
        for run in inits:
            while not self._stopping():
                self._spawn(run)
                self._report("Pending")
                code = self._wait_exit(run)
                if code is None:
                    return
                self._report("Pending")
                if code == 0:
                    break
                if policy == "Never":
                    self._report("Failed")
                    return
                self._backoff(run)
        mains = [r for r in self._runs.values() if not r.init]
        for run in mains:
            self._spawn(run)
        self._report("Running")
        self._supervise(mains, policy)

    def _supervise(self, mains: list[ContainerRun], policy: str) -> None:
        while not self._stopping():
            changed = False
            for run in mains:
                exited = run.start_error or (run.proc is not None and run.proc.poll() is not None)
                if exited:
                    self._exited(run)
                    run.start_error = False
                    changed = True
                    if policy == "Always" or (policy == "OnFailure" and run.exit_code != 0):
                        run.restart_at = time.monotonic() + min(10.0, 2.0 ** min(run.restarts, 4))
                if run.restart_at is not None and time.monotonic() >= run.restart_at:
                    run.restart_at = None
                    run.restarts += 1
                    self._spawn(run)
                    changed = True
                if run.proc is not None and run.probe_due():
                    changed |= run.probe(self.ip or HOST_IP, probe)
            if all(r.proc is None and r.restart_at is None for r in mains):
                ok = all(r.exit_code == 0 for r in mains)
                self._report("Succeeded" if ok else "Failed")
                return
            if changed:
                self._report("Running")
            self._wake.wait(POLL_S)
            self._wake.clear()

    def _spawn(self, run: ContainerRun) -> None:
        env = self._environment(run.spec)
        argv = command_line(run.spec, env)
        names = service_names([*env.values(), *argv])
        if names:
            ips = self._resolve(names)
            env = {k: substitute_services(v, ips) for k, v in env.items()}
            argv = [substitute_services(a, ips) for a in argv]
        logfile: IO[bytes] = open(self.log_path(run.spec["name"]), "ab")  # noqa: SIM115 - child owns it
        try:
            logfile.write(f"{START_MARK} {argv} at {now_rfc3339()}\n".encode())
            logfile.flush()
            if not argv:
                raise FileNotFoundError("the container has no command or args (process nodes have no image)")
            run.proc = subprocess.Popen(
                argv,
                env=env,
                cwd=self.dir / "scratch",
                stdout=logfile,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: SIGTERM/SIGKILL reach its children too
            )
            self.pids.append(run.proc.pid)
            run.started(now_rfc3339())
        except OSError as exc:
            logfile.write(f"--- proclet: could not start: {exc}\n".encode())
            run.start_failed(str(exc), now_rfc3339())
        finally:
            logfile.close()

    def log_path(self, container: str) -> Path:
        return self.dir / f"{container}.log"

    def _environment(self, container: JSON) -> dict[str, str]:
        assert self.ip is not None
        return container_environment(
            self.pod, container, self.ip, self.dir, self.ctx.root, self.ctx.base_env, self.ctx.lookup_data
        )

    def _resolve(self, names: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """Wait (like a container waiting for DNS) until every named Service has an endpoint."""
        deadline = time.monotonic() + RESOLVE_TIMEOUT_S
        ips: dict[tuple[str, str], str] = {}
        while True:
            for name in names - set(ips):
                ip = self.ctx.lookup_service(*name)
                if ip:
                    ips[name] = ip
            if len(ips) == len(names) or self._stopping() or time.monotonic() > deadline:
                break
            self._wake.wait(0.5)
        for svc, ns in names - set(ips):
            log.warning("pod %s: %s.%s.svc has no endpoint; left unresolved", self.key, svc, ns)
        return ips

    def _pulled(self) -> bool:
        """Wait out the node's simulated image pull (its annotation); False if the pod goes meanwhile."""
        node = self.ctx.kube.get_or_none(f"/api/v1/nodes/{self.pod['spec'].get('nodeName')}")
        pull_s = pull_seconds(node)
        until = time.monotonic() + pull_s
        if pull_s > 0:
            log.info("pod %s: pulling its image for %.0f s (node annotation)", self.key, pull_s)
        while time.monotonic() < until and not self._stopping():
            self._wake.wait(min(POLL_S * 4, max(0.0, until - time.monotonic())))
            self._wake.clear()
        return not self._stopping()

    def _wait_exit(self, run: ContainerRun) -> int | None:
        while run.proc is not None and run.proc.poll() is None:
            if self._stopping():
                return None
            self._wake.wait(POLL_S)
            self._wake.clear()
        self._exited(run)
        return run.exit_code

    def _exited(self, run: ContainerRun) -> None:
        if run.proc is not None:
            pid = run.proc.pid
            code = run.proc.wait()
            killpg(pid, signal.SIGKILL)  # what is left of the group goes with the container's main process
            run.exited(code, now_rfc3339(), lambda: self._last_run_log(run.spec["name"]))

    def _last_run_log(self, container: str) -> str:
        try:
            return last_run(self.log_path(container).read_bytes()[-65536:].decode(errors="replace"))
        except OSError:
            return ""

    def _backoff(self, run: ContainerRun) -> None:
        run.restarts += 1
        self._wake.wait(min(10.0, 2.0 ** min(run.restarts, 4)))

    def _stopping(self) -> bool:
        return self._stop is not None

    def _terminate(self) -> None:
        """SIGTERM, grace, SIGKILL; then the final status and the deletion the apiserver waits for."""
        stop = self._stop or _Stop(MIN_GRACE_S, finalize=False, report=False)
        live = [r for r in self._runs.values() if r.proc is not None]
        for run in live:
            assert run.proc is not None
            killpg(run.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + stop.grace
        while any(r.proc is not None and r.proc.poll() is None for r in live):
            if time.monotonic() >= deadline:
                for run in live:
                    assert run.proc is not None
                    killpg(run.proc.pid, signal.SIGKILL)
                break
            remaining = deadline - time.monotonic()
            self._wake.wait(min(POLL_S, max(remaining, 0.01)))
            self._wake.clear()
            with self._lock:  # a shorter grace may have arrived meanwhile
                if self._stop is not None and self._stop.grace < stop.grace:
                    deadline -= stop.grace - self._stop.grace
                    stop = self._stop
        for run in live:
            self._exited(run)
        reap_marked(str(self.ctx.root), self.uid)
        link = tmp_link(self.uid)
        if link.is_symlink():
            link.unlink()
        if live and self._stop is not None and stop.report:
            ok = all(r.exit_code == 0 for r in self._runs.values() if not r.init)
            self._report("Succeeded" if ok else "Failed")
        if self.ip is not None:
            self.ctx.ips.release(self.ip)  # only now: no process of this pod holds the address any more
        with self._lock:
            self._finished = True
            delete_now = self._stop is not None and self._stop.finalize and not self._finalized
            self._finalized |= delete_now
        if delete_now:
            self._delete()

    # ---- API writes -------------------------------------------------------------------------

    def _report(self, phase: str) -> None:
        if self._stop is not None and not self._stop.report:
            return
        status = pod_status(self.pod, phase, self.ip or "", HOST_IP, list(self._runs.values()))
        meta = self.pod["metadata"]
        try:
            self.ctx.kube.patch(pod_path(meta["namespace"], meta["name"], "status"), {"status": status})
        except ApiException as exc:
            if exc.status == 404:  # the pod is gone without a graceful deletion: stop its processes
                self.stop(MIN_GRACE_S, finalize=False, report=False)
            else:
                log.warning("pod %s: status write failed: %s", self.key, exc.reason)
        except Exception as exc:  # an unreachable apiserver must not kill the runner
            log.warning("pod %s: status write failed: %s", self.key, exc)

    def _delete(self) -> None:
        delete_pod(self.ctx.kube, self.pod)

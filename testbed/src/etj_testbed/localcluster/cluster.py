"""Start, check and stop the local control plane as plain processes on loopback.

`up` is idempotent: a healthy running cluster is reused, a half-dead one is stopped and started again
from its kept etcd data and certificates. Any failure stops everything this call started, so `up`
never leaves half-started processes behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from etj_testbed.localcluster import toolchain
from etj_testbed.localcluster.components import (
    DEFAULT_PORT_BASE,
    Component,
    Layout,
    components,
    ensure_ports_free,
    ports_from_base,
    process_alive,
    signal_group,
)
from etj_testbed.localcluster.errors import ClusterError
from etj_testbed.localcluster.kueue import LocalKueue
from etj_testbed.localcluster.pki import LocalPKI, Pair

READY_TIMEOUT_S = 90.0
STOP_GRACE_S = 10.0


@dataclass
class LocalCluster:
    layout: Layout

    @classmethod
    def named(cls, name: str | None = None, port_base: int | None = None) -> LocalCluster:
        name = name or os.environ.get("ETJ_CLUSTER_NAME", "etj")
        base = port_base or int(os.environ.get("ETJ_CLUSTER_PORT_BASE", DEFAULT_PORT_BASE))
        return cls(Layout(toolchain.cache_root() / "clusters" / name, ports_from_base(base)))

    @property
    def state_file(self) -> Path:
        return self.layout.root / "state.json"

    # ---- public API -------------------------------------------------------------------------

    @contextmanager
    def _lock(self) -> Iterator[None]:
        # Tests, the demo and a user's shell may all call `up` at once: one at a time per cluster.
        self.layout.root.mkdir(parents=True, exist_ok=True)
        with open(self.layout.root.parent / f".{self.layout.root.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def up(self) -> Path:
        """Make sure the cluster runs; return the admin kubeconfig path."""
        toolchain.ensure_built()
        with self._lock():
            return self._up_locked()

    def _up_locked(self) -> Path:
        if self.healthy():
            return self.layout.kubeconfig
        self._down_locked(keep_data=True)  # a partial cluster from a crash: clean processes, keep data
        self._check_ports_free()
        self._write_credentials()
        started: dict[str, int] = {}
        try:
            for comp in components(self.layout):
                proc = self._start(comp)
                started[comp.name] = proc.pid
                self._save_state(started)
                self._wait_ready(comp, proc)
            self._wait_default_service_account()
            _forget_kueue_webhooks(self.layout)
        except BaseException:
            self._stop_pids(started)
            self.state_file.unlink(missing_ok=True)
            raise
        return self.layout.kubeconfig

    def down(self, keep_data: bool = False) -> None:
        with self._lock():
            self._down_locked(keep_data)

    def _down_locked(self, keep_data: bool) -> None:
        LocalKueue(self.layout).down()  # an add-on: its webhooks go before the apiserver does
        state = self._load_state()
        self._stop_pids(state.get("pids", {}))
        self.state_file.unlink(missing_ok=True)
        if not keep_data and self.layout.root.exists():
            import shutil

            shutil.rmtree(self.layout.root)

    def healthy(self) -> bool:
        state = self._load_state()
        pids: dict[str, int] = state.get("pids", {})
        if set(pids) != {c.name for c in components(self.layout)}:
            return False
        if not all(_alive(pid, name) for name, pid in pids.items()):
            return False
        return self._get(f"{self.layout.server}/readyz", client_cert=True) == "ok"

    def status(self) -> dict[str, object]:
        state = self._load_state()
        pids: dict[str, int] = state.get("pids", {})
        return {
            "root": str(self.layout.root),
            "kubeconfig": str(self.layout.kubeconfig),
            "server": self.layout.server,
            "components": {n: ("running" if _alive(p, n) else "dead") for n, p in pids.items()},
            "ready": self.healthy(),
        }

    # ---- processes --------------------------------------------------------------------------

    def _check_ports_free(self) -> None:
        ensure_ports_free(
            self.layout.ports.items(),
            " by another process; stop it, or run `etj cluster down`, or pick other ports with "
            "ETJ_CLUSTER_PORT_BASE=<n>",
        )

    def _start(self, comp: Component) -> subprocess.Popen[bytes]:
        self.layout.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.layout.logs / f"{comp.name}.log", "ab")  # noqa: SIM115 - child owns it
        try:
            proc = subprocess.Popen(
                comp.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.layout.root,
                env={**os.environ, **comp.env},
                start_new_session=True,  # outlives `etj cluster up`; not killed by the shell's Ctrl-C
            )
        except OSError as exc:
            raise ClusterError(f"{comp.name} could not be started ({exc}); try `etj cluster build`") from exc
        finally:
            log.close()
        return proc

    def _wait_ready(self, comp: Component, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            # poll(), not /proc: right after fork the child's cmdline is still Python's.
            if proc.poll() is not None:
                raise ClusterError(
                    f"{comp.name} exited during start-up; see {self.layout.logs / comp.name}.log:\n"
                    + self._log_tail(comp.name)
                )
            if self._get(comp.ready_url, client_cert=comp.client_cert) == "ok":
                return
            time.sleep(0.25)
        raise ClusterError(
            f"{comp.name} did not become ready in {READY_TIMEOUT_S:.0f}s; see "
            f"{self.layout.logs / comp.name}.log:\n" + self._log_tail(comp.name)
        )

    def _wait_default_service_account(self) -> None:
        # Pods are refused until the controller-manager has made the namespace's ServiceAccount.
        kubectl = str(toolchain.binary("kubectl"))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            result = subprocess.run(
                [
                    kubectl,
                    "--kubeconfig",
                    str(self.layout.kubeconfig),
                    "get",
                    "serviceaccount",
                    "default",
                    "-n",
                    "default",
                    "-o",
                    "name",
                ],
                capture_output=True,
                text=True,
            )
            if result.returncode == 0:
                return
            time.sleep(0.5)
        raise ClusterError("kube-controller-manager never created the default ServiceAccount; see its log")

    def _stop_pids(self, pids: dict[str, int]) -> None:
        order = list(reversed(list(pids.items())))
        for name, pid in order:
            if _alive(pid, name):
                signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for name, pid in order:
            while _alive(pid, name) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid, name):
                signal_group(pid, signal.SIGKILL)

    def _log_tail(self, name: str, lines: int = 12) -> str:
        path = self.layout.logs / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # ---- files ------------------------------------------------------------------------------

    def _write_credentials(self) -> None:
        pki = LocalPKI(self.layout.pki)
        pki.ensure()
        pki.issue("apiserver", "kube-apiserver", server=True)
        users = {
            "admin": pki.issue("admin", "etj-admin", org="system:masters"),
            "kube-controller-manager": pki.issue("kcm", "system:kube-controller-manager"),
            "kube-scheduler": pki.issue("scheduler", "system:kube-scheduler"),
            # kwok plays every fake node's kubelet; admin rights keep its many writes simple.
            "kwok": pki.issue("kwok", "etj-kwok", org="system:masters"),
        }
        for user, pair in users.items():
            path = self.layout.kubeconfig if user == "admin" else self.layout.component_kubeconfig(user)
            path.write_text(yaml.safe_dump(self._kubeconfig(user, pair)))
            path.chmod(0o600)

    def _kubeconfig(self, user: str, pair: Pair) -> dict[str, object]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "etj-local",
                    "cluster": {
                        "server": self.layout.server,
                        "certificate-authority": str(self.layout.pki / "ca.crt"),
                    },
                }
            ],
            "users": [
                {"name": user, "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)}}
            ],
            "contexts": [{"name": "etj-local", "context": {"cluster": "etj-local", "user": user}}],
            "current-context": "etj-local",
        }

    def _save_state(self, pids: dict[str, int]) -> None:
        self.layout.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pids": pids, "ports": self.layout.ports}, indent=2))
        tmp.replace(self.state_file)

    def _load_state(self) -> dict[str, dict[str, int]]:
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _get(self, url: str, client_cert: bool) -> str | None:
        ctx = None
        if url.startswith("https"):
            ctx = ssl.create_default_context(cafile=str(self.layout.pki / "ca.crt"))
            if client_cert:
                ctx.load_cert_chain(str(self.layout.pki / "admin.crt"), str(self.layout.pki / "admin.key"))
            else:  # controller-manager and scheduler serve self-signed certs; /healthz is public
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                body: str = resp.read().decode().strip()
                return (
                    "ok" if resp.status == 200 and body in ("ok", '{"health":"true","reason":""}') else body
                )
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return None


def _forget_kueue_webhooks(layout: Layout) -> None:
    # Kueue (kueue.py) is an add-on that is never running right after the control plane (re)starts.
    kueue = LocalKueue(layout)
    if kueue.root.exists():
        kueue.unregister_webhooks()


def _alive(pid: int, name: str) -> bool:
    """True if `pid` runs and is still our component (guards against a recycled pid)."""
    binary = toolchain.BINARIES.get(name, name).encode()
    return process_alive(pid, lambda argv0: binary in argv0)

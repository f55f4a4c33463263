"""Kueue's controller manager as one more process of a local cluster (docs/kueue.md).

`up` installs Kueue's CRDs from its module, issues a serving certificate from the cluster's own CA (loopback
only, like the apiserver's), writes a Kueue `Configuration`, starts the binary of `kueue_build` with the
admin kubeconfig (so none of Kueue's RBAC is needed), waits for its /readyz and only then registers its
webhooks, rewritten from the module's service-based clientConfig to `https://127.0.0.1:<port>/<path>`
with the CA as caBundle. `down` removes the webhook configurations first, so a stopped Kueue never leaves
an apiserver that refuses Jobs and Pods on `failurePolicy: Fail`.

Only Kueue's own webhooks and those of the integrations enabled (batch/job, pod) are registered, and the
Job/Pod ones can be scoped by a namespace label (`namespace_label`) so that a Kueue added to a shared bed
(the test suite's session cluster) touches no other test's namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from etj_testbed.localcluster import kueue_build, toolchain
from etj_testbed.localcluster.components import (
    DEFAULT_PORT_BASE,
    Layout,
    ensure_ports_free,
    process_alive,
    signal_group,
)
from etj_testbed.localcluster.crds import established
from etj_testbed.localcluster.errors import ClusterError
from etj_testbed.localcluster.pki import LocalPKI

# Offsets from the cluster's port base, after the control plane's (components.PORT_OFFSETS).
PORT_OFFSETS = {"kueue-webhook": 70, "kueue-health": 71, "kueue-metrics": 72}
NAMESPACE = "kueue-system"
FRAMEWORKS = ["batch/job", "pod"]
MUTATING = "etj-kueue-mutating-webhook-configuration"
VALIDATING = "etj-kueue-validating-webhook-configuration"
# Webhook paths kept: Kueue's own kinds and the enabled integrations'. The others' paths are not served
# when their integration is off, and `failurePolicy: Fail` would then refuse every Deployment.
KEPT_PATH_PARTS = ("-kueue-x-k8s-io-", "-batch-v1-job", "--v1-pod")
SCOPED_PATH_PARTS = ("-batch-v1-job", "--v1-pod")
READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0
# Feature gates: the visibility API server (beta, on by default) would bind 0.0.0.0:8082 and needs an
# APIService; the bed does not use it.
DEFAULT_FEATURE_GATES = {"VisibilityOnDemand": False}


@dataclass(frozen=True)
class KueuePorts:
    webhook: int
    health: int
    metrics: int


def ports_for(layout: Layout) -> KueuePorts:
    base = layout.ports.get("etcd", DEFAULT_PORT_BASE)
    return KueuePorts(*(base + PORT_OFFSETS[name] for name in PORT_OFFSETS))


def configuration(
    ports: KueuePorts,
    cert_dir: Path,
    namespace_label: str | None = None,
    feature_gates: dict[str, bool] | None = None,
) -> dict[str, Any]:
    """Kueue's `config.kueue.x-k8s.io/v1beta2` Configuration for a host process on loopback."""
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports.metrics}"},
        "webhook": {"host": "127.0.0.1", "port": ports.webhook, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": list(FRAMEWORKS)},
        "featureGates": {**DEFAULT_FEATURE_GATES, **(feature_gates or {})},
    }
    if namespace_label:
        key, _, value = namespace_label.partition("=")
        config["managedJobsNamespaceSelector"] = {"matchLabels": {key: value}}
    return config


def webhook_configurations(
    manifests: str, url_base: str, ca_bundle: bytes, namespace_label: str | None = None
) -> list[dict[str, Any]]:
    """Kueue's webhook manifests, kept to the served paths and pointed at `url_base` by URL."""
    import base64

    docs = [d for d in yaml.safe_load_all(manifests) if d]
    out = []
    for doc in docs:
        kind = doc["kind"]
        hooks = []
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if not any(part in path for part in KEPT_PATH_PARTS):
                continue
            hook = dict(hook)
            hook["clientConfig"] = {
                "url": f"{url_base}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
            if any(part in path for part in SCOPED_PATH_PARTS):
                if namespace_label:
                    key, _, value = namespace_label.partition("=")
                    hook["namespaceSelector"] = {"matchLabels": {key: value}}
                else:  # what Kueue's kustomization and chart do for pods
                    hook["namespaceSelector"] = {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/metadata.name",
                                "operator": "NotIn",
                                "values": ["kube-system", NAMESPACE],
                            }
                        ]
                    }
            hook["timeoutSeconds"] = 10
            hooks.append(hook)
        name = MUTATING if kind == "MutatingWebhookConfiguration" else VALIDATING
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": kind,
                "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "etj-testbed"}},
                "webhooks": hooks,
            }
        )
    return out


@dataclass
class LocalKueue:
    """Kueue's manager for the local cluster at `layout`; state and logs under its root's kueue/."""

    layout: Layout
    namespace_label: str | None = None
    feature_gates: dict[str, bool] | None = None

    @property
    def root(self) -> Path:
        return self.layout.root / "kueue"

    @property
    def ports(self) -> KueuePorts:
        return ports_for(self.layout)

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def log(self) -> Path:
        return self.layout.logs / "kueue.log"

    # ---- public API -------------------------------------------------------------------------

    def up(self) -> dict[str, float]:
        """Make sure Kueue runs against the (running) cluster; return the seconds each step took."""
        kueue_build.ensure_built()
        timings: dict[str, float] = {}
        if self.healthy() and self._state().get("settings") == self._settings():
            return timings
        self.down()
        self.root.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        self._install_crds()
        timings["crds"] = time.monotonic() - started
        certs = self._write_certs()
        config = self.root / "config.yaml"
        config.write_text(
            yaml.safe_dump(configuration(self.ports, certs, self.namespace_label, self.feature_gates))
        )
        self._kubectl("create", "namespace", NAMESPACE, check=False)
        self._check_ports_free()
        t = time.monotonic()
        proc = self._start(config, certs)
        self._save_state({"pid": proc.pid, "settings": self._settings()})
        try:
            self._wait_ready(proc)
            timings["start"] = time.monotonic() - t
            t = time.monotonic()
            self._register_webhooks()
            timings["webhooks"] = time.monotonic() - t
        except BaseException:
            self.down()
            raise
        return timings

    def down(self) -> None:
        """Unregister the webhooks, then stop the process; CRDs and Kueue objects stay."""
        if not self.root.exists():  # Kueue never ran on this cluster
            return
        self.unregister_webhooks()
        pid = self._state().get("pid")
        if isinstance(pid, int) and _alive(pid):
            signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                signal_group(pid, signal.SIGKILL)
        self.state_file.unlink(missing_ok=True)

    def unregister_webhooks(self) -> bool:
        """Delete the webhook configurations; False when the apiserver could not be asked.

        `LocalCluster.up` calls this after restarting a control plane that once ran Kueue: a cluster that
        crashed with Kueue up keeps its webhooks in etcd, and without Kueue they would refuse Pods.
        """
        if not self.layout.kubeconfig.exists():
            return False
        done = self._kubectl(
            "delete",
            "mutatingwebhookconfiguration,validatingwebhookconfiguration",
            MUTATING,
            VALIDATING,
            "--ignore-not-found",
            "--wait=false",
            "--request-timeout=10s",
            check=False,
        )
        return done.returncode == 0

    def healthy(self) -> bool:
        pid = self._state().get("pid")
        if not (isinstance(pid, int) and _alive(pid)):
            return False
        return _get(f"http://127.0.0.1:{self.ports.health}/readyz") == "ok"

    # ---- steps ------------------------------------------------------------------------------

    def _settings(self) -> dict[str, object]:
        return {
            "key": kueue_build.cache_key(),
            "namespace_label": self.namespace_label,
            "feature_gates": self.feature_gates or {},
        }

    def _install_crds(self) -> None:
        # Server-side: the Workload CRD is far larger than the client-side apply annotation allows.
        self._kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(kueue_build.crd_dir()), timeout=300
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        names = [p.stem.split("_", 1)[1] + "." + p.stem.split("_", 1)[0] for p in self._crd_files()]
        while True:
            out = self._kubectl("get", "crd", *names, "-o", "json").stdout
            if established(json.loads(out)):
                return
            if time.monotonic() > deadline:
                raise ClusterError("Kueue's CRDs were not Established in time")
            time.sleep(0.25)

    def _crd_files(self) -> list[Path]:
        return sorted(kueue_build.crd_dir().glob("*.yaml"))

    def _write_certs(self) -> Path:
        """A serving certificate for 127.0.0.1 from the cluster's CA, as tls.crt/tls.key in one dir."""
        pki = LocalPKI(self.layout.pki)
        pki.ensure()
        pair = pki.issue("kueue-webhook", "etj-kueue-webhook", server=True)
        certs = self.root / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copy(pair.cert, certs / "tls.crt")
        shutil.copy(pair.key, certs / "tls.key")
        (certs / "tls.key").chmod(0o600)
        shutil.copy(pki.ca.cert, certs / "ca.crt")
        return certs

    def _register_webhooks(self) -> None:
        docs = webhook_configurations(
            kueue_build.webhook_manifests().read_text(),
            f"https://127.0.0.1:{self.ports.webhook}",
            (self.layout.pki / "ca.crt").read_bytes(),
            self.namespace_label,
        )
        self._kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(docs)
        )

    def _check_ports_free(self) -> None:
        ports = (self.ports.webhook, self.ports.health, self.ports.metrics)
        ensure_ports_free((("Kueue", p) for p in ports), "; pick another ETJ_CLUSTER_PORT_BASE")

    def _start(self, config: Path, certs: Path) -> subprocess.Popen[bytes]:
        self.layout.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        env = {
            **os.environ,
            "KUBECONFIG": str(self.layout.kubeconfig),
            "KUEUE_METRICS_CERT_DIR": str(certs),
            "POD_NAMESPACE": NAMESPACE,
        }
        try:
            return subprocess.Popen(
                [str(kueue_build.binary()), f"--config={config}", "--zap-log-level=info"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise ClusterError(f"Kueue could not be started ({exc}); try `etj kueue build`") from exc
        finally:
            log.close()

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ClusterError(f"Kueue exited during start-up; see {self.log}:\n{self._log_tail()}")
            if _get(f"http://127.0.0.1:{self.ports.health}/readyz") == "ok":
                return
            time.sleep(0.25)
        raise ClusterError(
            f"Kueue was not ready in {READY_TIMEOUT_S:.0f}s; see {self.log}:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 15) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def _kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(toolchain.binary("kubectl")), "--kubeconfig", str(self.layout.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args[:3])} failed: {result.stderr.strip()[-1500:]}")
        return result

    def _state(self) -> dict[str, Any]:
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save_state(self, state: dict[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            body: str = resp.read().decode().strip()
            return "ok" if resp.status == 200 else body
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return None


def _alive(pid: int) -> bool:
    """True if `pid` runs and is still Kueue's manager (guards against a recycled pid)."""
    return process_alive(pid, lambda argv0: argv0.endswith(b"/kueue"))

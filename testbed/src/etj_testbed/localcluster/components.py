"""How each control-plane component is started: its command line and how to tell it is ready."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from etj_testbed.localcluster import toolchain
from etj_testbed.localcluster.errors import ClusterError
from etj_testbed.localcluster.pki import SERVICE_CIDR

# Offsets from the port base (ETJ_CLUSTER_PORT_BASE, default 16400): apiserver on 16443 by default.
PORT_OFFSETS = {
    "etcd": 0,
    "etcd-peer": 1,
    "kube-apiserver": 43,
    "kwok": 47,
    "kube-controller-manager": 57,
    "kube-scheduler": 59,
}
DEFAULT_PORT_BASE = 16400
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node=fake"


@dataclass(frozen=True)
class Component:
    name: str
    argv: list[str]
    # URL polled until it answers 200 ("ok"); `client_cert` chooses mTLS to the apiserver.
    ready_url: str
    client_cert: bool = False
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Layout:
    """Where one local cluster keeps its files."""

    root: Path
    ports: dict[str, int]

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def component_kubeconfig(self, name: str) -> Path:
        return self.root / f"{name}.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"


def ports_from_base(base: int) -> dict[str, int]:
    return {name: base + offset for name, offset in PORT_OFFSETS.items()}


def components(layout: Layout) -> list[Component]:
    """The components in start order; each depends only on those before it."""
    return [_etcd(layout), _apiserver(layout), _controller_manager(layout), _scheduler(layout), _kwok(layout)]


def _etcd_url(layout: Layout) -> str:
    return f"http://127.0.0.1:{layout.ports['etcd']}"


def _delegated(layout: Layout, name: str) -> list[str]:
    """The three delegated-auth flags, all reading the component's own kubeconfig."""
    kc = layout.component_kubeconfig(name)
    return [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}"]


def _etcd(layout: Layout) -> Component:
    """etcd, the API server's store."""
    p = layout.ports
    etcd_url = _etcd_url(layout)
    return Component(
        "etcd",
        [
            str(toolchain.binary("etcd")),
            "--name=etj",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
            f"--initial-cluster=etj=http://127.0.0.1:{p['etcd-peer']}",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ],
        ready_url=f"{etcd_url}/health",
    )


def _apiserver(layout: Layout) -> Component:
    """The API server."""
    p, pki = layout.ports, layout.pki
    etcd_url = _etcd_url(layout)
    return Component(
        "kube-apiserver",
        [
            str(toolchain.binary("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={p['kube-apiserver']}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--profiling=false",
            "--event-ttl=2h",
        ],
        ready_url=f"{layout.server}/readyz",
        client_cert=True,
    )


def _controller_manager(layout: Layout) -> Component:
    """The controller-manager (node lifecycle, service accounts, certificates)."""
    p, pki = layout.ports, layout.pki
    return Component(
        "kube-controller-manager",
        [
            str(toolchain.binary("kube-controller-manager")),
            *_delegated(layout, "kube-controller-manager"),
            "--bind-address=127.0.0.1",
            f"--secure-port={p['kube-controller-manager']}",
            f"--cert-dir={pki / 'kcm'}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Loopback clusters have no cloud; evict pods of NotReady nodes faster than 5 min.
            "--node-monitor-grace-period=20s",
        ],
        ready_url=f"https://127.0.0.1:{p['kube-controller-manager']}/healthz",
    )


def _scheduler(layout: Layout) -> Component:
    """The scheduler."""
    p = layout.ports
    return Component(
        "kube-scheduler",
        [
            str(toolchain.binary("kube-scheduler")),
            *_delegated(layout, "kube-scheduler"),
            "--bind-address=127.0.0.1",
            f"--secure-port={p['kube-scheduler']}",
            "--leader-elect=false",
        ],
        ready_url=f"https://127.0.0.1:{p['kube-scheduler']}/healthz",
    )


def _kwok(layout: Layout) -> Component:
    """kwok: the nodes that only exist in the API (the process nodes are proclet's)."""
    p = layout.ports
    kc = layout.component_kubeconfig
    return Component(
        "kwok",
        [
            str(toolchain.binary("kwok")),
            f"--kubeconfig={kc('kwok')}",
            f"--config={toolchain.kwok_stages()}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}",
            "--cidr=10.244.0.1/16",
            "--node-ip=127.0.0.1",
            # Heartbeats through node Leases like kubelets' (renewed every 40/4 = 10 s; the
            # controller-manager's --node-monitor-grace-period of 20 s allows one missed renewal).
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{p['kwok']}",
        ],
        ready_url=f"http://127.0.0.1:{p['kwok']}/healthz",
    )


def ensure_ports_free(ports: Iterable[tuple[str, int]], advice: str) -> None:
    """Refuse to start when any of ``ports`` ((name, port) pairs) on 127.0.0.1 is taken; ``advice`` ends
    the message. Bound and released at once: a port in TIME_WAIT is no conflict (SO_REUSEADDR)."""
    for name, port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                raise ClusterError(f"port {port} ({name}) on 127.0.0.1 is in use{advice}") from None


def process_alive(pid: int, is_ours: Callable[[bytes], bool]) -> bool:
    """True if ``pid`` runs, is no zombie, and ``is_ours`` accepts its argv[0]: a pid in a state file may
    have been recycled by an unrelated process since (a reboot, a long pause)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return is_ours(cmdline.split(b"\0", 1)[0])


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal ``pid``'s process group (each component runs in a session of its own, so its children go
    too); just ``pid`` where the group is not ours to signal, nothing where it is gone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)

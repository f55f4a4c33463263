"""How each control-plane component is started: its command line and how to tell it is ready."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from etj_testbed.localcluster import toolchain
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
    p, pki = layout.ports, layout.pki
    etcd_url = f"http://127.0.0.1:{p['etcd']}"
    kc = layout.component_kubeconfig
    delegated = lambda name: [  # noqa: E731 - the three delegated-auth flags read the same kubeconfig
        f"--kubeconfig={kc(name)}",
        f"--authentication-kubeconfig={kc(name)}",
        f"--authorization-kubeconfig={kc(name)}",
    ]
    return [
        Component(
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
        ),
        Component(
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
        ),
        Component(
            "kube-controller-manager",
            [
                str(toolchain.binary("kube-controller-manager")),
                *delegated("kube-controller-manager"),
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
        ),
        Component(
            "kube-scheduler",
            [
                str(toolchain.binary("kube-scheduler")),
                *delegated("kube-scheduler"),
                "--bind-address=127.0.0.1",
                f"--secure-port={p['kube-scheduler']}",
                "--leader-elect=false",
            ],
            ready_url=f"https://127.0.0.1:{p['kube-scheduler']}/healthz",
        ),
        Component(
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
        ),
    ]

"""What a process-backed pod's process sees: its environment, command line, loopback IP and names.

Pure functions (plus a small allocator) so the Kubernetes rules they copy — `$(VAR)` expansion, fieldRef
paths, envFrom prefixes — are unit-tested without a cluster. Lookups of ConfigMaps, Secrets and Services
are passed in as callables.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger("etj.proclet")

JSON = dict[str, Any]
# (kind, namespace, name) → the object's `data` (Secrets still base64), or None if it does not exist.
DataLookup = Callable[[str, str, str], Mapping[str, str] | None]
# (service, namespace) → an IP for the name, or None while it has no endpoint.
ServiceLookup = Callable[[str, str], str | None]
AddressKey = Callable[[JSON], str | None]  # a pod -> the stable name its address belongs to, if any

_VAR_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")
# <service>.<namespace>.svc[.cluster.local] inside any string (URLs, host:port pairs).
SERVICE_NAME = re.compile(
    r"(?<![-a-z0-9.])([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)\.([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)"
    r"\.svc(?:\.cluster\.local)?(?![-a-z0-9])"
)
_LABEL_REF = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined names are substituted, `$$` escapes, the rest stays."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REF.sub(sub, value)


def field_ref(pod: JSON, path: str, pod_ip: str, host_ip: str) -> str | None:
    """The value of a downward-API fieldRef, or None for paths the harness does not provide."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        # The apiserver has not seen our status write yet when the process starts: use what we will report.
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path] or "")
    match = _LABEL_REF.fullmatch(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    return None


def _key_ref(kind: str, ref: JSON, namespace: str, lookup: DataLookup) -> str | None:
    data = lookup(kind, namespace, ref.get("name", ""))
    value = None if data is None else data.get(ref.get("key", ""))
    if value is None:
        if not ref.get("optional"):
            log.warning(
                "%s %s/%s has no key %r; variable left unset",
                kind,
                namespace,
                ref.get("name"),
                ref.get("key"),
            )
        return None
    return base64.b64decode(value).decode() if kind == "secrets" else value


def container_env(
    pod: JSON,
    container: JSON,
    *,
    pod_ip: str,
    host_ip: str,
    lookup: DataLookup,
) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom first, then env in order."""
    namespace = (pod.get("metadata") or {}).get("namespace", "default")
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("configmaps", "configMapRef"), ("secrets", "secretRef")):
            ref = source.get(key)
            if not ref:
                continue
            data = lookup(kind, namespace, ref.get("name", ""))
            if data is None:
                if not ref.get("optional"):
                    log.warning("envFrom %s %s/%s not found", kind, namespace, ref.get("name"))
                continue
            for key_name, raw in data.items():
                env[prefix + key_name] = base64.b64decode(raw).decode() if kind == "secrets" else raw
    for entry in container.get("env") or []:
        name = entry["name"]
        if "valueFrom" not in entry:
            env[name] = expand(str(entry.get("value", "")), env)
            continue
        source = entry["valueFrom"]
        value: str | None = None
        if "fieldRef" in source:
            value = field_ref(pod, source["fieldRef"].get("fieldPath", ""), pod_ip, host_ip)
            if value is None:
                log.warning(
                    "fieldRef %s is not supported by process nodes; %s left unset",
                    source["fieldRef"].get("fieldPath"),
                    name,
                )
        elif "configMapKeyRef" in source:
            value = _key_ref("configmaps", source["configMapKeyRef"], namespace, lookup)
        elif "secretKeyRef" in source:
            value = _key_ref("secrets", source["secretKeyRef"], namespace, lookup)
        else:
            log.warning("valueFrom %s is not supported by process nodes; %s left unset", list(source), name)
        if value is not None:
            env[name] = value
    return env


def command_line(container: JSON, env: Mapping[str, str]) -> list[str]:
    """command + args with `$(VAR)` expanded; without a command the image's entrypoint would run, which a
    process node does not have, so args alone are taken as the command line."""
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    return [expand(str(a), env) for a in argv]


def service_names(values: Iterable[str]) -> set[tuple[str, str]]:
    """The (service, namespace) pairs named as `<svc>.<ns>.svc[.cluster.local]` in `values`."""
    found: set[tuple[str, str]] = set()
    for value in values:
        found.update((m.group(1), m.group(2)) for m in SERVICE_NAME.finditer(value))
    return found


def substitute_services(value: str, ips: Mapping[tuple[str, str], str]) -> str:
    """Replace resolvable Service DNS names by an IP: process nodes have no cluster DNS, and the system
    resolver (which torch's C++ TCPStore uses) cannot be taught new names without editing /etc/hosts."""

    def sub(match: re.Match[str]) -> str:
        return ips.get((match.group(1), match.group(2)), match.group(0))

    return SERVICE_NAME.sub(sub, value)


def selects(service: JSON, pod: JSON) -> bool:
    """Whether ``service``'s selector matches ``pod``'s labels (an empty selector selects nothing)."""
    selector = (service.get("spec") or {}).get("selector") or {}
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def headless_service_of(pod: JSON, services: Iterable[JSON]) -> str | None:
    """``svc:<ns>/<name>`` of the first headless Service selecting ``pod`` (sorted by name), else None.

    With cluster DNS a headless Service's name follows its pods: a replacement pod under a new name is
    found at the old name. Here names are replaced by an IP when a process starts, so the replacement
    gets the Service's address back instead (``LoopbackIPs.allocate`` with this key)."""
    ns = (pod.get("metadata") or {}).get("namespace", "")
    for svc in sorted(services, key=lambda s: str((s.get("metadata") or {}).get("name"))):
        if (svc.get("spec") or {}).get("clusterIP") == "None" and selects(svc, pod):
            return f"svc:{ns}/{svc['metadata']['name']}"
    return None


def service_endpoint(service: JSON, pods: Iterable[JSON]) -> str | None:
    """The IP a Service name resolves to, picked as the endpoint controller would pick endpoints.

    Not read from EndpointSlices: their validation refuses loopback addresses, so a Service selecting
    process-backed pods never gets any. Ready pods first; not-ready ones only with
    publishNotReadyAddresses (what the rendezvous Service sets).
    """
    spec = service.get("spec") or {}
    ready: list[str] = []
    other: list[str] = []
    for pod in pods:
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if (
            not ip
            or pod["metadata"].get("deletionTimestamp")
            or status.get("phase") in ("Succeeded", "Failed")
        ):
            continue
        if not selects(service, pod):
            continue
        is_ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        (ready if is_ready else other).append(ip)
    if spec.get("publishNotReadyAddresses"):
        ready += other
    return min(ready) if ready else None


DEFAULT_POD_NETWORK = "127.0.0.0/16"  # ETJ_PROCLET_NETWORK overrides it (e.g. 127.9.0.0/16)


def pod_network(env: Mapping[str, str], default_port_base: int) -> str:
    """The loopback /16 a bed's process pods get their addresses from.

    Two beds on one machine (a clean-clone test run beside a developer's bed, a demo beside a test) are
    told apart by ``ETJ_CLUSTER_PORT_BASE``; each must hand out its own pod addresses too, or both give a
    store ``127.0.0.4:29400`` and the second store cannot bind. The default bed keeps 127.0.0.0/16;
    another port base gets 127.<n>.0.0/16 with n in 1..254 from the base's hundreds.
    ``ETJ_PROCLET_NETWORK`` overrides both.
    """
    if env.get("ETJ_PROCLET_NETWORK"):
        return env["ETJ_PROCLET_NETWORK"]
    base = int(env.get("ETJ_CLUSTER_PORT_BASE") or default_port_base)
    if base == default_port_base:
        return DEFAULT_POD_NETWORK
    return f"127.{(base // 100) % 254 + 1}.0.0/16"


class LoopbackIPs:
    """Hands out 127.0.x.y addresses (never 127.0.0.1, never one in use).

    A cursor walks the range so a freed address is not handed out again at once (its sockets may sit in
    TIME_WAIT), except that a pod recreated under the same name gets its old address back when free —
    which keeps a Service name resolved at a client's start valid across a server pod's replacement.
    """

    def __init__(self, network: str = DEFAULT_POD_NETWORK) -> None:
        self._hosts = [
            str(ip)
            for ip in ipaddress.ip_network(network).hosts()
            if ip.packed[-1] not in (0, 255) and str(ip) != "127.0.0.1"
        ]
        self._cursor = 0
        self._used: set[str] = set()
        self._by_key: dict[str, str] = {}
        self._lock = threading.Lock()

    def allocate(self, key: str, wait_s: float = 0.0) -> str:
        """An address for ``key``: its last one when free (waiting up to ``wait_s``), else a new one."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                sticky = self._by_key.get(key)
                if sticky and sticky not in self._used:
                    self._used.add(sticky)
                    return sticky
                if not sticky or time.monotonic() >= deadline:
                    break
            time.sleep(0.1)
        with self._lock:
            for _ in range(len(self._hosts)):
                ip = self._hosts[self._cursor]
                self._cursor = (self._cursor + 1) % len(self._hosts)
                if ip not in self._used:
                    self._used.add(ip)
                    self._by_key[key] = ip
                    return ip
        raise RuntimeError("no free loopback address left for process-backed pods")

    def release(self, ip: str) -> None:
        with self._lock:
            self._used.discard(ip)

    def in_use(self) -> set[str]:
        with self._lock:
            return set(self._used)


class ServiceForwarder:
    """A Service name that follows the Service's selector, as cluster DNS makes a headless name do.

    Process nodes have no DNS: a Service name in a pod's env is replaced by an address when the pod starts.
    A pod taking over the Service's address (``headless_service_of``) covers a replacement started after
    its predecessor went, but not a switch between two live pods (the rendezvous store moving make before
    break: its replacement runs outside the Service until it is switched in). So the name is given this
    forwarder's own address: it listens on the Service's ports and connects each new connection to the
    pod the Service selects at that moment (``backend``), from the client's address. When either side
    closes, so does the other, as when the pod behind the name goes away; a connection with nothing
    selected is closed at once.
    """

    def __init__(self, ip: str, ports: Mapping[int, int], backend: Callable[[], str | None]) -> None:
        self.ip, self.backend = ip, backend
        self._servers: list[socket.socket] = []
        for port, target in ports.items():
            server = socket.create_server((ip, port))
            self._servers.append(server)
            threading.Thread(target=self._accept, args=(server, target), daemon=True).start()

    def _accept(self, server: socket.socket, target: int) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn, target), daemon=True).start()

    def _serve(self, conn: socket.socket, target: int) -> None:
        ip = self.backend()
        # From the client's own address: the pod behind the name sees its real peer, as it would without
        # the forwarder (every pod address is local to this machine).
        client = conn.getpeername()[0]
        try:
            upstream = socket.create_connection((ip, target), 2, (client, 0)) if ip else None
        except OSError:
            upstream = None
        if upstream is None:
            conn.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=_pump, args=(upstream, conn), daemon=True).start()
        _pump(conn, upstream)

    def close(self) -> None:
        for server in self._servers:
            server.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either ends, then end both (the other pump stops too)."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        src.close()

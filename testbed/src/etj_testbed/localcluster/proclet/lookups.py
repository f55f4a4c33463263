"""What a pod runner looks up in the API for the harness (proclet/harness.py): ConfigMap and Secret data
for env references, the address a Service name resolves to (headless ones through a `ServiceForwarder`,
since there is no cluster DNS on loopback), and the headless Service a pod's address is kept under."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from etj_testbed.localcluster.proclet.env import (
    LoopbackIPs,
    ServiceForwarder,
    headless_service_of,
    service_endpoint,
)
from etj_testbed.localcluster.proclet.kube import Kube

log = logging.getLogger("etj.proclet")

JSON = dict[str, Any]


class Lookups:
    """The lookups a `RunnerContext` is given, and the Service forwarders they started."""

    def __init__(self, kube: Kube, ips: LoopbackIPs) -> None:
        self.kube, self.ips = kube, ips
        self.forwarders: dict[str, ServiceForwarder] = {}  # by "fwd:<ns>/<service>": headless names
        self._lock = threading.Lock()

    def close(self) -> None:
        for forwarder in self.forwarders.values():
            forwarder.close()

    def data(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        obj = self.kube.get_or_none(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        return None if obj is None else dict(obj.get("data") or {})

    def address_key(self, pod: JSON) -> str | None:
        ns = pod["metadata"]["namespace"]
        try:
            services = self.kube.get(f"/api/v1/namespaces/{ns}/services").get("items") or []
        except Exception as exc:
            log.warning("service list for %s failed: %s", ns, exc)
            return None
        return headless_service_of(pod, services)

    def service(self, service: str, namespace: str) -> str | None:
        """The address a pod is given for a Service name: for a headless Service, that of its forwarder
        (``ServiceForwarder``: the name follows the selector), once the Service selects a pod."""
        selected = self.selected(service, namespace)
        if selected is None or not selected[1]:
            return None
        svc, _ = selected
        if (svc.get("spec") or {}).get("clusterIP") != "None":
            return selected[1]
        key = f"fwd:{namespace}/{service}"
        with self._lock:
            forwarder = self.forwarders.get(key)
            if forwarder is None:
                ports = {
                    int(p["port"]): int(p.get("targetPort") or p["port"])
                    for p in (svc.get("spec") or {}).get("ports") or []
                }
                ip = self.ips.allocate(key)
                forwarder = ServiceForwarder(
                    ip, ports, lambda: (self.selected(service, namespace) or ({}, None))[1]
                )
                self.forwarders[key] = forwarder
        return forwarder.ip

    def selected(self, service: str, namespace: str) -> tuple[JSON, str | None] | None:
        """The Service and the address it selects now (None: no such Service, or the lookup failed)."""
        try:
            svc = self.kube.get_or_none(f"/api/v1/namespaces/{namespace}/services/{service}")
            if svc is None:
                return None
            selector = ",".join(
                f"{k}={v}" for k, v in ((svc.get("spec") or {}).get("selector") or {}).items()
            )
            if not selector:
                return svc, None
            pods = self.kube.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector)
        except Exception as exc:
            log.warning("endpoint lookup for %s.%s failed: %s", service, namespace, exc)
            return None
        return svc, service_endpoint(svc, pods.get("items") or [])

"""A thin JSON layer over the official `kubernetes` client's transport, for the process-node harness.

The harness works with plain dicts (the shapes the API returns) rather than the generated models: it
copies fields between objects and writes strategic-merge patches, which dicts express directly. Requests
still go through `kubernetes.client.ApiClient`, so kubeconfig loading, TLS and tokens are the client's.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

log = logging.getLogger("etj.proclet")

JSON = dict[str, Any]
SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
# Server-side watch timeout: short enough that a stopped harness's watch threads notice within a minute.
WATCH_TIMEOUT_S = 50


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


class Kube:
    def __init__(self, kubeconfig: str | None) -> None:
        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        # One connection per pod runner thread plus the watches; the default pool of 4 would serialise them.
        cfg.connection_pool_maxsize = 64
        self.api = client.ApiClient(cfg)

    def close(self) -> None:
        self.api.close()

    def request(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] = 30,
    ) -> JSON:
        resp = self._send(method, path, query, body, content_type, timeout)
        try:
            data: bytes = resp.read()
        finally:
            resp.response.release_conn()  # RESTResponse wraps the streamed urllib3 response
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=resp.reason, body=data.decode(errors="replace"))
        parsed: JSON = json.loads(data) if data else {}
        return parsed

    def _send(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None,
        body: Any,
        content_type: str,
        timeout: float | tuple[float, float],
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        _method, url, headers, body, _post = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.api.rest_client.request(method, url, headers=headers, body=body, _request_timeout=timeout)

    def get(self, path: str, **query: Any) -> JSON:
        return self.request("GET", path, query)

    def get_or_none(self, path: str) -> JSON | None:
        try:
            return self.get(path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch(self, path: str, body: JSON, content_type: str = SMP) -> JSON:
        return self.request("PATCH", path, body=body, content_type=content_type)

    def watch(
        self, path: str, resource_version: str, on_response: Callable[[Any], None], **query: Any
    ) -> Iterator[tuple[str, JSON]]:
        """Yield (type, object) until the server ends the watch; raise Gone on HTTP 410."""
        query = {
            **query,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": WATCH_TIMEOUT_S,
        }
        raw = self._send("GET", path, query, None, "application/json", (10, WATCH_TIMEOUT_S + 15))
        resp = raw.response  # the urllib3 response, streamed line by line
        on_response(resp)  # lets stop() shut the socket down and end a blocked read
        try:
            if resp.status == 410:
                raise Gone(path)
            if resp.status != 200:
                raise ApiException(status=resp.status, reason=resp.reason)
            buffer = b""
            for chunk in resp.stream(amt=None, decode_content=False):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        if obj.get("code") == 410:
                            raise Gone(path)
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    yield event["type"], obj
        finally:
            resp.release_conn()


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def now_micro() -> str:
    """MicroTime, as Leases need it."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}" + (f"/{sub}" if sub else "")


def delete_pod(kube: Kube, pod: JSON) -> None:
    """Finish a pod's deletion as the kubelet does once its containers are gone: grace 0, and the uid as
    precondition so a new pod of the same name is never hit."""
    meta = pod["metadata"]
    body = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "gracePeriodSeconds": 0,
        "preconditions": {"uid": meta["uid"]},
    }
    try:
        kube.request("DELETE", pod_path(meta["namespace"], meta["name"]), body=body)
    except ApiException as exc:
        if exc.status not in (404, 409):
            log.warning("pod %s/%s: final delete failed: %s", meta["namespace"], meta["name"], exc.reason)

"""A lean list+watch of pods, outside kopf (issue 29).

Why not kopf: kopf cannot ask the apiserver for a subset of pods (its label filters are applied after
the event arrived), and every pod event goes through its per-object machinery (a worker task per pod,
the handler filters, the index bookkeeping) before any filter says "not ours". On a cluster where etj's
pods are a few hundred among tens of thousands, that machinery was most of the operator's CPU. Here an
event costs one JSON decode and a comparison (observe/pod_index.py); etj's jobs and nodes stay on kopf.

The stream is read in a thread with the synchronous client (the one the operator already uses for its
calls) and raw bytes (``_preload_content=False``: no model objects); each chunk's events go to the event
loop in one callback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client

from etj_operator.k8s.metrics import METRICS

log = logging.getLogger(__name__)

Event = tuple[str, dict[str, Any]]  # (ADDED | MODIFIED | DELETED, pod)
WATCH_SECONDS = 300  # the apiserver ends the stream after this; we resume from the last resourceVersion
PAGE = 1000


class Gone(Exception):
    """The watch cannot resume (410: the resourceVersion was compacted): list again."""


def split_events(pending: bytes, chunk: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """Decode the complete lines of a watch stream; return them and the unfinished tail."""
    *lines, tail = (pending + chunk).split(b"\n")
    return [json.loads(line) for line in lines if line.strip()], tail


class PodWatch:
    """List, then watch, the pods of one namespace (or all); hand them to the loop's callbacks.

    ``listed(items)`` gets every full listing (the first, and one after each 410); ``events(batch)`` gets
    the watch events in between. Both run on ``loop``.
    """

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str | None,
        loop: asyncio.AbstractEventLoop,
        listed: Callable[[list[dict[str, Any]]], None],
        events: Callable[[list[Event]], None],
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.loop = namespace, loop
        self.listed, self.events = listed, events
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"etj-pods:{namespace or '*'}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        # The thread may sit in a read for up to WATCH_SECONDS; it is a daemon and holds nothing.
        self._stop.set()

    def _call(self, **kw: Any) -> Any:
        kw["_preload_content"] = False
        if self.namespace:
            return self.core.list_namespaced_pod(self.namespace, **kw)
        return self.core.list_pod_for_all_namespaces(**kw)

    def _run(self) -> None:
        rv: str | None = None
        backoff = 1.0
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._list()
                rv = self._watch(rv)
                backoff = 1.0
            except Gone:
                rv = None
            except Exception:
                log.exception("pod watch (%s) failed; retrying in %.0fs", self.namespace or "all", backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _list(self) -> str:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            METRICS.api_requests.labels("list", "pods").inc()
            kw: dict[str, Any] = {"limit": PAGE}
            if token:
                kw["_continue"] = token
            page = json.loads(self._call(**kw).data)
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self.loop.call_soon_threadsafe(self.listed, items)
                return str(meta.get("resourceVersion", ""))

    def _watch(self, rv: str) -> str:
        METRICS.api_requests.labels("watch", "pods").inc()
        resp = self._call(
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _request_timeout=(5.0, WATCH_SECONDS + 30.0),
        )
        pending = b""
        try:
            for chunk in resp.stream(None, decode_content=False):
                if self._stop.is_set():
                    break
                decoded, pending = split_events(pending, chunk)
                batch: list[Event] = []
                for ev in decoded:
                    kind, obj = ev.get("type"), ev.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise Gone
                        raise RuntimeError(f"pod watch error: {obj.get('message')}")
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if kind != "BOOKMARK":
                        batch.append((str(kind), obj))
                if batch:
                    self.loop.call_soon_threadsafe(self.events, batch)
        finally:
            # Closed, not just returned: a stream left mid-way (410, stop) still has unread bytes, and a
            # pooled connection with leftovers breaks the next request made on it.
            resp.close()
            resp.release_conn()
        return rv

"""What bench/operator_scale.py measures with: the operator's metrics (scraped, histogram quantiles), its
process's CPU and memory, the machine's load, and the bench's own watches (events on the bed, workers
deleted)."""

from __future__ import annotations

import json
import os
import socket
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import watch
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == "etj_operator_api_requests_total":
                out["api_requests"] = out.get("api_requests", 0) + sample.value
            elif sample.name == "etj_operator_interruption_to_drain_seconds_bucket":
                out[f"bucket:{sample.labels['le']}"] = sample.value
            elif sample.name == "etj_operator_drain_stage_seconds_bucket":
                out[f"stage:{sample.labels['stage']}:{sample.labels['le']}"] = sample.value
            elif sample.name == "etj_operator_watch_events_total":
                out[f"events:{sample.labels['resource']}"] = sample.value
            elif sample.name == "etj_operator_reconcile_errors_total":
                out["reconcile_errors"] = out.get("reconcile_errors", 0) + sample.value
    return out


def bucket_quantile(
    before: dict[str, float], after: dict[str, float], q: float, prefix: str = "bucket:"
) -> float | None:
    """Upper bound of the histogram bucket holding quantile q of the observations between two scrapes."""
    bounds = sorted(
        (float(k[len(prefix) :]), after[k] - before.get(k, 0)) for k in after if k.startswith(prefix)
    )
    total = bounds[-1][1] if bounds else 0
    if not total:
        return None
    for le, count in bounds:
        if count >= q * total:
            return le
    return None


def proc_usage(pid: int) -> dict[str, float]:
    """CPU seconds (user+system, children included) and RSS/peak RSS of the operator process."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = sum(int(x) for x in fields[11:15]) / tick
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    kib = lambda k: int(status.get(k, "0 kB").split()[0]) / 1024  # noqa: E731
    return {"cpu_seconds": cpu, "rss_mib": kib("VmRSS"), "peak_rss_mib": kib("VmHWM")}


def drained(response: Any) -> None:
    """Read a raw response to the end (the connection goes back to the pool; no model objects)."""
    _ = response.data


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


class EventCounter:
    """Counts watch events on all nodes and all pods with raw streams: the bed's event rate, the same
    number for every arm (the operators' own counters count different things)."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.counts = {"nodes": 0, "pods": 0}
        self.stop = threading.Event()
        for resource in self.counts:
            threading.Thread(target=self._run, args=(resource,), daemon=True).start()

    def _run(self, resource: str) -> None:
        fn = self.core.list_node if resource == "nodes" else self.core.list_pod_for_all_namespaces
        while not self.stop.is_set():
            try:
                rv = json.loads(fn(limit=1, _preload_content=False).data)["metadata"]["resourceVersion"]
                resp = fn(
                    watch=True,
                    resource_version=rv,
                    timeout_seconds=300,
                    _preload_content=False,
                    _request_timeout=(5, 400),
                )
                for chunk in resp.stream(None, decode_content=False):
                    self.counts[resource] += chunk.count(b"\n")
                    if self.stop.is_set():
                        break
            except Exception:
                time.sleep(1)

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)


def scrape_all(port: int) -> dict[str, float]:
    out = scrape(port)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == "etj_operator_reconcile_duration_seconds_count":
                out["reconciles"] = sample.value
            elif sample.name == "etj_operator_reconcile_duration_seconds_sum":
                out["reconcile_seconds"] = sample.value
    return out


def quantiles(lat: list[float]) -> dict[str, float | None]:
    if not lat:
        return {"p50": None, "p99": None, "max": None}
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
    return {"p50": round(q[49], 3), "p99": round(q[98], 3), "max": round(max(lat), 3)}


class WorkerDeletions:
    """Watches a namespace's worker pods; records when each was first seen going away."""

    def __init__(self, core: Any, ns: str) -> None:
        self.core, self.ns = core, ns
        self.seen: dict[str, float] = {}
        self.late: set[str] = set()  # found by a re-list after a broken watch: time is an upper bound
        self.stop = threading.Event()
        listing = core.list_namespaced_pod(ns, label_selector="etj.dev/role=worker")
        self.present = {p.metadata.name for p in listing.items if not p.metadata.deletion_timestamp}
        self.rv = listing.metadata.resource_version
        threading.Thread(target=self._run, daemon=True).start()

    def _note(self, name: str, relisted: bool = False) -> None:
        if name in self.present and name not in self.seen:
            self.seen[name] = time.monotonic()
            if relisted:
                self.late.add(name)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                for ev in watch.Watch().stream(
                    self.core.list_namespaced_pod,
                    self.ns,
                    label_selector="etj.dev/role=worker",
                    resource_version=self.rv,
                    timeout_seconds=30,
                ):
                    pod = ev["object"]
                    self.rv = pod.metadata.resource_version or self.rv
                    if ev["type"] == "DELETED" or pod.metadata.deletion_timestamp:
                        self._note(pod.metadata.name)
                    if self.stop.is_set():
                        return
            except Exception:
                listing = self.core.list_namespaced_pod(self.ns, label_selector="etj.dev/role=worker")
                self.rv = listing.metadata.resource_version
                alive = {p.metadata.name for p in listing.items if not p.metadata.deletion_timestamp}
                for name in self.present - alive:
                    self._note(name, relisted=True)

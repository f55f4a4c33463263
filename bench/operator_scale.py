"""Operator scale benchmark on the local control plane with kwok nodes; prints JSON.

Default shape (issue 29): 1,000 GPU nodes (a third spot) in several pools, 100 jobs, 10,000 pods that are
not etj's (bound round-robin to the nodes, a status update each every 2 minutes), 50 spot nodes
interrupted at once. Every arm (``--arms``: ``new`` is this checkout's operator, ``base=PATH`` one from
another checkout's operator/src, e.g. main at 8a3cca9) runs on the same bed, one after the other:

- bed: watch events/s on nodes and pods with no operator running (is the bed itself quiet?);
- steady: operator CPU-seconds per 1,000 watch events (the bed's, counted by the bench's own watches)
  over ``--steady-seconds`` with the jobs settled;
- interruption: taint sent → the worker's deletion seen on a watch (p50/p99/max), API requests per drained
  worker, operator CPU in the window, RSS;
- restart: SIGTERM, a new operator process; seconds to the first plan of every job, and wrong drains
  (workers deleted on healthy nodes) until ``--restart-watch`` seconds after.

/proc/loadavg is sampled in every window: the machine is shared. Not a timed test: it reports numbers.

    KUBECONFIG=$(etj cluster up | tail -1) python bench/operator_scale.py --nodes 100 --jobs 10 \\
        --foreign-pods 1000 --interrupt 5 --arms new,base=/work/h29-base/operator/src
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from prometheus_client.parser import text_string_to_metric_families

from etj_operator.api.models import GROUP, PLURAL, VERSION
from etj_testbed.localcluster import toolchain
from etj_testbed.localcluster.crds import wait_established
from etj_testbed.localcluster.fake_nodes import fake_gpu_node

REPO = Path(__file__).resolve().parents[1]
BENCH_LABEL = "etj.dev/bench"
TAINT = "aws-node-termination-handler/spot-itn"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--spot-fraction", type=float, default=1 / 3)
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--workers-per-job", type=int, default=4)
    p.add_argument("--interrupt", type=int, default=50, help="spot nodes tainted at once")
    p.add_argument("--settle-timeout", type=float, default=900)
    p.add_argument("--settle-quiet", type=float, default=30, help="settled when no change for this long")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    p.add_argument("--keep", action="store_true", help="leave nodes and namespace behind")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pools", type=int, default=3, help="node pools per capacity type")
    p.add_argument(
        "--out", type=Path, help="also write the JSON here, after every arm (a long run keeps its arms)"
    )
    p.add_argument("--foreign-pods", type=int, default=10000, help="pods that are not etj's")
    p.add_argument("--foreign-gpu-every", type=int, default=50, help="every Nth foreign pod takes a GPU")
    p.add_argument("--foreign-update-seconds", type=float, default=120, help="status update period per pod")
    p.add_argument("--bed-seconds", type=float, default=20, help="bed quietness window, no operator")
    p.add_argument("--steady-seconds", type=float, default=30, help="steady-state cost window")
    p.add_argument("--restart-watch", type=float, default=20, help="wrong-drain watch after the restart")
    p.add_argument(
        "--extra-priority-class",
        default="",
        metavar="NAME",
        help="run every arm with this elastic-extra PriorityClass (created if missing: value -10, never "
        "preempting), so the pool is shared by the rule of docs/operator.md; unset: first come, first served",
    )
    p.add_argument(
        "--arms",
        default="new",
        help="comma list: new (this checkout's operator) or NAME=PATH (operator/src of another checkout)",
    )
    return p.parse_args()


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


def job_body(name: str, ns: str, workers: int, run: str) -> dict[str, Any]:
    tol = {"key": BENCH_LABEL, "operator": "Equal", "value": run, "effect": "NoSchedule"}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ElasticTrainingJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "trainer": {"image": "bench:0", "resources": {"gpu": 1}},
            "replicas": {"min": 1, "max": workers},
            "training": {"globalBatchSize": 256, "microBatchSize": 8},
            "placement": {
                "capacityTypes": ["spot"],
                "nodeSelector": {BENCH_LABEL: run},
                "tolerations": [tol],
                "rendezvous": {"nodeSelector": {BENCH_LABEL: run}, "tolerations": [tol]},
            },
            # Long cooldown: replacements are not part of what is measured.
            "scaling": {"cooldownSeconds": 3600, "scaleUpDelaySeconds": 0},
        },
    }


def foreign_pod(i: int, node: str, gpu: bool) -> dict[str, Any]:
    """A pod that is not etj's, bound directly to a node (the scheduler is not what the bed measures)."""
    requests = {"cpu": "10m", "memory": "16Mi", **({"nvidia.com/gpu": "1"} if gpu else {})}
    return {
        "metadata": {"name": f"f-{i}", "labels": {"app": f"svc-{i % 50}"}},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "containers": [
                {"name": "c", "image": "foreign:0", "resources": {"requests": requests, "limits": requests}}
            ],
        },
    }


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


class Updater:
    """Patches every foreign pod's status once per ``period`` (a condition's lastProbeTime), spread evenly:
    the status churn of a cluster's ordinary pods."""

    def __init__(self, core: Any, ns: str, names: list[str], period: float) -> None:
        self.core, self.ns, self.names, self.period = core, ns, names, period
        self.done, self.errors = 0, 0
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(8)
        self.started = time.monotonic()
        if names and period > 0:
            threading.Thread(target=self._run, daemon=True).start()

    def _patch(self, name: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "status": {
                "conditions": [{"type": "bench.etj.dev/Probe", "status": "True", "lastProbeTime": now}]
            }
        }
        try:
            drained(self.core.patch_namespaced_pod_status(name, self.ns, body, _preload_content=False))
            self.done += 1
        except Exception:
            self.errors += 1

    def _run(self) -> None:
        gap = self.period / len(self.names)
        k = 0
        while not self.stop.is_set():
            target = self.started + k * gap
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if self.pool._work_queue.qsize() < 64:  # behind: skip rather than queue without bound
                self.pool.submit(self._patch, self.names[k % len(self.names)])
            k += 1

    def rate(self) -> float:
        return self.done / max(1e-9, time.monotonic() - self.started)


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


class Arm:
    """One operator build on the shared bed."""

    def __init__(self, spec: str) -> None:
        self.name, _, src = spec.partition("=")
        self.src = src or None

    def start(
        self, kubeconfig: str, port: int, log_path: Path, extra: tuple[str, ...] = ()
    ) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        if self.src:  # ahead of the venv's editable install: that checkout's operator runs
            env["PYTHONPATH"] = self.src + os.pathsep + env.get("PYTHONPATH", "")
        log = open(log_path, "ab")  # noqa: SIM115  (closed with the process)
        op = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "etj_operator.k8s.main",
                "--kubeconfig",
                kubeconfig,
                # All namespaces, as deployed by default: every pod of the cluster reaches the operator.
                "--metrics-port",
                str(port),
                "--liveness-port",
                "0",
                "--progress-seconds",
                "0",
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        return op


def stop(op: subprocess.Popen[bytes]) -> None:
    op.terminate()
    try:
        op.wait(30)
    except subprocess.TimeoutExpired:
        op.kill()
        op.wait(10)


def wait_metrics(port: int, op: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if op.poll() is not None:
            raise RuntimeError("operator exited")
        try:
            scrape(port)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("operator metrics never came up")


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


def share(counts: dict[str, int], max_workers: int) -> dict[str, Any]:
    """How the spot pool ended up shared among the jobs (all min 1, max ``max_workers``; created in index
    order, all at once). Inversions: pairs where the later job has more workers while the earlier one is
    short of its max (what "first come, first served" would not allow)."""
    order = sorted(counts, key=lambda j: int(j.rsplit("-", 1)[1]))
    workers = [counts[j] for j in order]
    inversions = sum(1 for i, a in enumerate(workers) if a < max_workers for b in workers[i + 1 :] if b > a)
    return {
        "jobs_at_max": sum(1 for w in workers if w >= max_workers),
        "jobs_below_min": sum(1 for w in workers if w < 1),
        "workers_histogram": {str(n): workers.count(n) for n in sorted(set(workers))},
        "inversions": inversions,
    }


def install_crd(kubeconfig: str | None) -> None:
    """crds/ on the bed (a fresh `etj cluster up` has none), as the test plugin installs it."""

    def kubectl(*args: str) -> str:
        cmd = [str(toolchain.binary("kubectl")), *(["--kubeconfig", kubeconfig] if kubeconfig else []), *args]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    wait_established(kubectl, "crd", f"{PLURAL}.{GROUP}")


def make_bed(args: argparse.Namespace, core: Any, run: str, pool: ThreadPoolExecutor) -> dict[str, Any]:
    n_spot = round(args.nodes * args.spot_fraction)
    names = [f"b{run}-{'spot' if i < n_spot else 'od'}-{i}" for i in range(args.nodes)]
    t0 = time.monotonic()
    list(
        pool.map(
            lambda i: (
                core.create_node(
                    fake_gpu_node(
                        names[i],
                        capacity_type="spot" if i < n_spot else "on-demand",
                        gpus=args.gpus_per_node,
                        provider="karpenter",
                        pool=f"{'spot' if i < n_spot else 'od'}-{i % args.pools}",
                        labels={BENCH_LABEL: run},
                        # Tainted so pods of anyone else sharing the control plane stay off these nodes.
                        taints=[{"key": BENCH_LABEL, "value": run, "effect": "NoSchedule"}],
                    ),
                    _preload_content=False,
                ).data
            ),
            range(args.nodes),
        )
    )
    nodes_s = time.monotonic() - t0
    fns = f"bench-{run}-foreign"
    core.create_namespace({"metadata": {"name": fns}})
    while not core.list_namespaced_service_account(fns).items:  # the SA admission plugin wants it
        time.sleep(0.2)
    on_demand = [n for n in names if "-od-" in n] or names
    t0 = time.monotonic()
    foreign = [
        foreign_pod(
            i,
            on_demand[(i // args.foreign_gpu_every) % len(on_demand)]
            if args.foreign_gpu_every and i % args.foreign_gpu_every == 0
            else names[i % len(names)],
            bool(args.foreign_gpu_every) and i % args.foreign_gpu_every == 0,
        )
        for i in range(args.foreign_pods)
    ]
    list(pool.map(lambda b: core.create_namespaced_pod(fns, b, _preload_content=False).data, foreign))
    pods_s = time.monotonic() - t0
    return {
        "names": names,
        "foreign_ns": fns,
        "foreign_names": [b["metadata"]["name"] for b in foreign],
        "node_create_seconds": round(nodes_s, 1),
        "foreign_pod_create_seconds": round(pods_s, 1),
    }


def bed_quiet(args: argparse.Namespace, counter: EventCounter) -> dict[str, Any]:
    """Watch events/s with no operator running: what any watcher of nodes and pods has to decode."""
    c0, t0 = counter.snapshot(), time.monotonic()
    time.sleep(args.bed_seconds)
    c1, dt = counter.snapshot(), time.monotonic() - t0
    return {
        "events_per_s": {r: round((c1[r] - c0[r]) / dt, 1) for r in c1},
        "window_seconds": round(dt, 1),
        "loadavg": loadavg(),
    }


def sharing_flags(args: argparse.Namespace) -> tuple[str, ...]:
    return ("--extra-priority-class", args.extra_priority_class) if args.extra_priority_class else ()


def ensure_extra_class(api: Any, name: str) -> None:
    """The chart's elastic-extra PriorityClass (templates/priorityclass.yaml), for a bed without the chart."""
    body = {
        "metadata": {"name": name},
        "value": -10,
        "preemptionPolicy": "Never",
        "description": "etj workers beyond their job's replicas.min (bench)",
    }
    try:
        client.SchedulingV1Api(api).create_priority_class(body)
    except client.ApiException as exc:
        if exc.status != 409:  # already there: fine
            raise


def run_arm(
    arm: Arm,
    args: argparse.Namespace,
    core: Any,
    custom: Any,
    run: str,
    bed: dict[str, Any],
    counter: EventCounter,
) -> dict[str, Any]:
    pool = ThreadPoolExecutor(32)
    ns = f"bench-{run}-{arm.name}"
    core.create_namespace({"metadata": {"name": ns}})
    port = free_port()
    log_path = Path(tempfile.gettempdir()) / f"etj-bench-{run}-{arm.name}.log"
    out: dict[str, Any] = {"source": arm.src or "this checkout", "log": str(log_path)}
    op = arm.start(args.kubeconfig, port, log_path, sharing_flags(args))
    try:
        wait_metrics(port, op)
        t0 = time.monotonic()
        list(
            pool.map(
                lambda i: custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, job_body(f"job-{i}", ns, args.workers_per_job, run)
                ),
                range(args.jobs),
            )
        )
        want, last, stable_since = args.jobs * args.workers_per_job, -1, time.monotonic()
        deadline = time.monotonic() + args.settle_timeout
        running: list[Any] = []
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(ns, label_selector="etj.dev/role=worker").items
            running = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
            if len(running) != last:
                last, stable_since = len(running), time.monotonic()
            if len(running) >= want or (running and time.monotonic() - stable_since > args.settle_quiet):
                break
            time.sleep(2)
        out["settle_seconds"] = round(time.monotonic() - t0, 1)
        out["workers_running"] = len(running)
        counts = {f"job-{i}": 0 for i in range(args.jobs)}
        for p in running:
            job = p.metadata.labels.get("etj.dev/job", "")
            counts[job] = counts.get(job, 0) + 1
        out["share"] = share(counts, args.workers_per_job)
        if not running:
            # An operator that never planned (the baseline at 10,000 foreign pods: kopf still indexing
            # them when the settle timeout ran out) has nothing to interrupt or restart: say so and stop.
            out["never_settled"] = True
            out["reconciles"] = scrape_all(port).get("reconciles", 0)
            out["loadavg"] = loadavg()
            return out

        # Steady state: the bed's churn only (foreign status updates, heartbeats), jobs settled.
        s0, u0, c0, t0 = scrape_all(port), proc_usage(op.pid), counter.snapshot(), time.monotonic()
        time.sleep(args.steady_seconds)
        s1, u1, c1, dt = scrape_all(port), proc_usage(op.pid), counter.snapshot(), time.monotonic() - t0
        events = sum(c1.values()) - sum(c0.values())
        cpu = u1["cpu_seconds"] - u0["cpu_seconds"]
        plans = s1.get("reconciles", 0) - s0.get("reconciles", 0)
        out["steady"] = {
            "window_seconds": round(dt, 1),
            "bed_events": {r: c1[r] - c0[r] for r in c1},
            "operator_cpu_seconds": round(cpu, 3),
            "operator_cpu_share": round(cpu / dt, 4),
            "operator_cpu_seconds_per_1000_events": round(1000 * cpu / max(1, events), 4),
            "plans": plans,
            "wall_ms_per_plan": round(
                1000 * (s1.get("reconcile_seconds", 0) - s0.get("reconcile_seconds", 0)) / plans, 2
            )
            if plans
            else None,
            "rss_mib": round(u1["rss_mib"], 1),
            "loadavg": loadavg(),
        }

        # Interruption: taint N spot nodes hosting workers at once.
        by_node: dict[str, list[str]] = {}
        for p in running:
            by_node.setdefault(p.spec.node_name, []).append(p.metadata.name)
        victims = random.sample(sorted(by_node), min(args.interrupt, len(by_node)))
        victim_pods = {pod: node for node in victims for pod in by_node[node]}
        deletions = WorkerDeletions(core, ns)
        time.sleep(1)
        before, usage0, c0 = scrape_all(port), proc_usage(op.pid), counter.snapshot()
        sent: dict[str, float] = {}
        taints = {
            n: [
                {"key": BENCH_LABEL, "value": run, "effect": "NoSchedule"},
                {"key": TAINT, "effect": "NoSchedule"},
            ]
            for n in victims
        }

        def taint(node: str) -> None:
            sent[node] = time.monotonic()
            drained(core.patch_node(node, {"spec": {"taints": taints[node]}}, _preload_content=False))

        list(pool.map(taint, victims))
        end = time.monotonic() + 120
        while time.monotonic() < end and any(p not in deletions.seen for p in victim_pods):
            time.sleep(0.2)
        time.sleep(5)  # the operator's follow-up work (status, events) belongs to the event's cost
        after, usage1, c1 = scrape_all(port), proc_usage(op.pid), counter.snapshot()
        window = time.monotonic() - min(sent.values())
        seen = deletions.seen
        lat = sorted(
            seen[p] - sent[n] for p, n in victim_pods.items() if p in seen and p not in deletions.late
        )
        q = quantiles(lat)
        api_calls = after.get("api_requests", 0) - before.get("api_requests", 0)
        wrong = [p for p in seen if p not in victim_pods]
        out["interruption"] = {
            "interrupted_nodes": len(victims),
            "drained_workers": len(lat),
            "missed_workers": sum(1 for p in victim_pods if p not in seen),
            "late_workers_excluded": len(deletions.late),
            "wrong_drains": len(wrong),
            "latency_seconds": q,
            "operator_side_seconds": {
                "p50_le": bucket_quantile(before, after, 0.5),
                "p99_le": bucket_quantile(before, after, 0.99),
            },
            # Where the operator's part went (etj_operator_drain_stage_seconds; absent in older builds).
            "operator_stages_seconds": {
                stage: {
                    f"p{round(frac * 100)}_le": bucket_quantile(before, after, frac, f"stage:{stage}:")
                    for frac in (0.5, 0.99)
                }
                for stage in ("queued", "plan", "api")
            },
            "api_requests_per_drained_worker": round(api_calls / max(1, len(lat)), 2),
            "operator_cpu_seconds": round(usage1["cpu_seconds"] - usage0["cpu_seconds"], 2),
            "bed_events": {r: c1[r] - c0[r] for r in c1},
            "window_seconds": round(window, 1),
            "rss_mib": round(usage1["rss_mib"], 1),
            "peak_rss_mib": round(usage1["peak_rss_mib"], 1),
            "reconcile_errors": after.get("reconcile_errors", 0),
            "loadavg": loadavg(),
            "goal_p99_le_1s": bool(lat) and (q["p99"] or 0) <= 1.0,
        }
        deletions.stop.set()
        out["operator_cpu_seconds_total_first_process"] = round(usage1["cpu_seconds"], 2)

        # Restart: a new process; the first plan of every job, and no worker deleted meanwhile.
        stop(op)
        watcher = WorkerDeletions(core, ns)
        t0 = time.monotonic()
        op = arm.start(args.kubeconfig, port, log_path, sharing_flags(args))
        wait_metrics(port, op)
        up_s = time.monotonic() - t0
        planned_s = None
        while time.monotonic() - t0 < 300:
            if scrape_all(port).get("reconciles", 0) >= args.jobs:
                planned_s = time.monotonic() - t0
                break
            time.sleep(0.2)
        time.sleep(args.restart_watch)
        watcher.stop.set()
        u = proc_usage(op.pid)
        out["restart"] = {
            "metrics_up_seconds": round(up_s, 2),
            "plans_for_all_jobs_seconds": round(planned_s, 2) if planned_s is not None else None,
            "wrong_drains": len(watcher.seen),
            "watched_seconds_after": args.restart_watch,
            "cpu_seconds": round(u["cpu_seconds"], 2),
            "rss_mib": round(u["rss_mib"], 1),
            "loadavg": loadavg(),
        }
        # Give the next arm the same spot pool: the interrupted nodes come back.
        list(
            pool.map(
                lambda n: drained(
                    core.patch_node(n, {"spec": {"taints": taints[n][:1]}}, _preload_content=False)
                ),
                victims,
            )
        )
    finally:
        stop(op)
        # The workers' GPUs must be free before the next arm. Deleting the namespace alone leaves that to
        # the namespace controller, minutes on a loaded machine: delete the jobs and pods directly.
        for attempt in range(5):
            # Raw, and retried: on a loaded apiserver the answer listing 100 deleted jobs was cut off
            # (IncompleteRead) and took the arm's results with it.
            try:
                drained(
                    custom.delete_collection_namespaced_custom_object(
                        GROUP, VERSION, ns, PLURAL, _preload_content=False
                    )
                )
                drained(
                    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0, _preload_content=False)
                )
                drained(core.delete_namespace(ns, _preload_content=False))
                break
            except Exception as exc:  # any failure: try again, then leave it
                print(f"cleanup of {ns} failed ({exc!r}), attempt {attempt + 1}", file=sys.stderr)
                time.sleep(2)
        # The workers' GPUs must be free before the next arm: wait for the namespace's pods to go.
        end = time.monotonic() + 180
        while time.monotonic() < end and core.list_namespaced_pod(ns, limit=1).items:
            time.sleep(1)
    return out


def main() -> int:
    args = parse_args()
    random.seed(args.seed)
    config.load_kube_config(config_file=args.kubeconfig)
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = 64
    api = client.ApiClient(cfg)
    # Any: the client types every field Optional, which only adds noise to a benchmark script.
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    run = uuid.uuid4().hex[:6]
    pool = ThreadPoolExecutor(32)
    arms = [Arm(a) for a in args.arms.split(",") if a]
    result: dict[str, Any] = {
        "params": vars(args) | {"kubeconfig": None, "out": str(args.out) if args.out else None},
        "cpus": os.cpu_count(),
        "loadavg_start": loadavg(),
    }
    install_crd(args.kubeconfig)
    if args.extra_priority_class:
        ensure_extra_class(api, args.extra_priority_class)
    counter = EventCounter(core)
    bed = make_bed(args, core, run, pool)
    updater: Updater | None = None
    try:
        result["bed"] = {k: v for k, v in bed.items() if not isinstance(v, list)}
        # kwok marks the new pods Running (a burst of status writes); wait for that churn to end.
        t0 = time.monotonic()
        while (
            time.monotonic() - t0 < 600
            and core.list_namespaced_pod(
                bed["foreign_ns"], field_selector="status.phase!=Running", limit=1
            ).items
        ):
            time.sleep(2)
        result["bed"]["foreign_pods_running_seconds"] = round(time.monotonic() - t0, 1)
        updater = Updater(core, bed["foreign_ns"], bed["foreign_names"], args.foreign_update_seconds)
        time.sleep(min(30.0, args.bed_seconds))  # the update stream reaches its rate
        result["bed"]["quiet"] = bed_quiet(args, counter)
        node_list = core.list_node(label_selector=f"{BENCH_LABEL}={run}").items
        result["bed"]["nodes_not_ready"] = sum(
            1
            for n in node_list
            if not any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        )
        result["arms"] = {}
        for arm in arms:
            try:
                result["arms"][arm.name] = run_arm(arm, args, core, custom, run, bed, counter)
            except Exception as exc:  # keep the other arms' results; say what stopped this one
                result["arms"][arm.name] = {"error": repr(exc)}
            if args.out:
                args.out.write_text(json.dumps(result, indent=2))
        result["bed"]["foreign_updates_per_s"] = round(updater.rate(), 1)
        result["bed"]["foreign_update_errors"] = updater.errors
        result["bed"]["nodes_not_ready_at_end"] = sum(
            1
            for n in core.list_node(label_selector=f"{BENCH_LABEL}={run}").items
            if not any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        )
    finally:
        if updater is not None:
            updater.stop.set()
        counter.stop.set()
        if not args.keep:
            drained(core.delete_namespace(bed["foreign_ns"], _preload_content=False))
            list(pool.map(lambda n: core.delete_node(n, _preload_content=False).data, bed["names"]))
    result["loadavg_end"] = loadavg()
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

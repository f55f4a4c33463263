"""Operator scale benchmark on the local control plane with kwok nodes; prints JSON.

Default shape (the issue's): 1,000 GPU nodes (a third spot), 100 jobs, 50 spot nodes interrupted at once.
Measured: interruption taint sent → the worker's deletion seen on a watch (p50/p99/max), Kubernetes API
requests the operator made per interruption, operator CPU seconds and peak RSS. Not a timed test: it
reports numbers, the goal (p99 ≤ 1 s) is for a human to compare.

    KUBECONFIG=$(etj cluster up | tail -1) python bench/operator_scale.py --nodes 90 --jobs 10 --interrupt 5
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
from etj_testbed.localcluster.fake_nodes import fake_gpu_node

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
            elif sample.name == "etj_operator_watch_events_total":
                out[f"events:{sample.labels['resource']}"] = sample.value
            elif sample.name == "etj_operator_reconcile_errors_total":
                out["reconcile_errors"] = out.get("reconcile_errors", 0) + sample.value
    return out


def bucket_quantile(before: dict[str, float], after: dict[str, float], q: float) -> float | None:
    """Upper bound of the histogram bucket holding quantile q of the observations between two scrapes."""
    bounds = sorted(
        (float(k.split(":", 1)[1]), after[k] - before.get(k, 0)) for k in after if k.startswith("bucket:")
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
    ns = f"bench-{run}"
    core.create_namespace({"metadata": {"name": ns}})
    n_spot = round(args.nodes * args.spot_fraction)
    names = [f"b{run}-{'spot' if i < n_spot else 'od'}-{i}" for i in range(args.nodes)]
    pool = ThreadPoolExecutor(32)
    t0 = time.monotonic()
    list(
        pool.map(
            lambda n: core.create_node(
                fake_gpu_node(
                    n,
                    capacity_type="spot" if "-spot-" in n else "on-demand",
                    gpus=args.gpus_per_node,
                    provider="karpenter",
                    labels={BENCH_LABEL: run},
                    # Tainted so pods of anyone else sharing the control plane stay off these nodes.
                    taints=[{"key": BENCH_LABEL, "value": run, "effect": "NoSchedule"}],
                )
            ),
            names,
        )
    )
    nodes_s = time.monotonic() - t0

    port = free_port()
    log = open(Path(tempfile.gettempdir()) / f"etj-bench-{run}.log", "wb")  # noqa: SIM115
    op = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "etj_operator.k8s.main",
            "--kubeconfig",
            args.kubeconfig,
            "--namespace",
            ns,
            "--metrics-port",
            str(port),
            "--liveness-port",
            "0",
            "--progress-seconds",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    result: dict[str, Any] = {
        "params": vars(args) | {"kubeconfig": None},
        "node_create_seconds": round(nodes_s, 1),
    }
    try:
        while True:
            try:
                scrape(port)
                break
            except OSError:
                time.sleep(0.5)
        # Wait until the operator has listed every node before counting anything.
        time.sleep(2)
        t0 = time.monotonic()
        list(
            pool.map(
                lambda i: custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, job_body(f"job-{i}", ns, args.workers_per_job, run)
                ),
                range(args.jobs),
            )
        )
        # Settled: every worker running, or no change for --settle-quiet seconds.
        want, last, stable_since = args.jobs * args.workers_per_job, -1, time.monotonic()
        deadline = time.monotonic() + args.settle_timeout
        running: list[Any] = []
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(ns, label_selector="etj.dev/role=worker").items
            running = [p for p in pods if p.status.phase == "Running"]
            if len(running) != last:
                last, stable_since = len(running), time.monotonic()
            if len(running) >= want or (running and time.monotonic() - stable_since > args.settle_quiet):
                break
            time.sleep(2)
        result["settle_seconds"] = round(time.monotonic() - t0, 1)
        result["workers_running"] = len(running)
        time.sleep(5)  # let status writes and events drain before the measured window

        node_list = core.list_node(label_selector=f"{BENCH_LABEL}={run}").items
        result["nodes_not_ready_before_interruption"] = sum(
            1
            for n in node_list
            if not any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        )
        by_node: dict[str, list[str]] = {}
        for p in running:
            by_node.setdefault(p.spec.node_name, []).append(p.metadata.name)
        victims = random.sample(sorted(by_node), min(args.interrupt, len(by_node)))
        victim_pods = {pod: node for node in victims for pod in by_node[node]}

        seen: dict[str, float] = {}
        late: set[str] = set()  # found by a re-list after a broken watch: time is only an upper bound
        done = threading.Event()
        stop_at = time.monotonic() + 120

        def note(pod: Any, deleted: bool, relisted: bool = False) -> None:
            name = pod.metadata.name
            if name in victim_pods and name not in seen and (deleted or pod.metadata.deletion_timestamp):
                seen[name] = time.monotonic()
                if relisted:
                    late.add(name)

        def watch_pods() -> None:
            # A loaded apiserver may cut watches; resume from the last resourceVersion, and after a
            # re-list count what changed meanwhile as "late" rather than lose it.
            listing = core.list_namespaced_pod(ns)
            rv = listing.metadata.resource_version
            while len(seen) < len(victim_pods) and time.monotonic() < stop_at:
                try:
                    for ev in watch.Watch().stream(
                        core.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=30
                    ):
                        rv = ev["object"].metadata.resource_version or rv
                        note(ev["object"], ev["type"] == "DELETED")
                        if len(seen) == len(victim_pods):
                            break
                except Exception:
                    listing = core.list_namespaced_pod(ns)
                    rv = listing.metadata.resource_version
                    present = {p.metadata.name for p in listing.items}
                    for p in listing.items:
                        note(p, False, relisted=True)
                    for name in victim_pods:
                        if name not in present and name not in seen:
                            seen[name] = time.monotonic()
                            late.add(name)
            done.set()

        watcher = threading.Thread(target=watch_pods, daemon=True)
        watcher.start()
        time.sleep(1)
        before, usage0 = scrape(port), proc_usage(op.pid)
        sent: dict[str, float] = {}

        def taint(node: str) -> None:
            sent[node] = time.monotonic()
            core.patch_node(node, {"spec": {"taints": [{"key": TAINT, "effect": "NoSchedule"}]}})

        list(pool.map(taint, victims))
        done.wait(120)
        time.sleep(5)  # the operator's follow-up work (status, events) belongs to the event's cost
        after, usage1 = scrape(port), proc_usage(op.pid)
        window = time.monotonic() - min(sent.values())
        lat = sorted(seen[p] - sent[n] for p, n in victim_pods.items() if p in seen and p not in late)
        q = (
            statistics.quantiles(lat, n=100, method="inclusive")
            if len(lat) > 1
            else (lat or [float("nan")]) * 99
        )
        api_calls = after.get("api_requests", 0) - before.get("api_requests", 0)
        result |= {
            "interrupted_nodes": len(victims),
            "drained_workers": len(lat),
            "missed_workers": len(victim_pods) - len(seen),
            "late_workers_excluded": len(late),
            "latency_seconds": {
                "p50": round(q[49], 3),
                "p99": round(q[98], 3),
                "max": round(lat[-1], 3) if lat else None,
            },
            # The operator's own view: first sight of the signal → delete accepted (bucket upper bounds).
            "operator_side_seconds": {
                "p50_le": bucket_quantile(before, after, 0.5),
                "p99_le": bucket_quantile(before, after, 0.99),
            },
            "api_requests_per_interrupted_node": round(api_calls / max(1, len(victims)), 2),
            "api_requests_per_drained_worker": round(api_calls / max(1, len(lat)), 2),
            "operator_cpu_seconds_interruption_window": round(
                usage1["cpu_seconds"] - usage0["cpu_seconds"], 2
            ),
            "operator_cpu_seconds_total": round(usage1["cpu_seconds"], 2),
            "operator_rss_mib": round(usage1["rss_mib"], 1),
            "operator_peak_rss_mib": round(usage1["peak_rss_mib"], 1),
            "reconcile_errors": after.get("reconcile_errors", 0),
            "watch_events_in_window": {
                r: after.get(f"events:{r}", 0) - before.get(f"events:{r}", 0) for r in ("nodes", "pods")
            },
            "window_seconds": round(window, 1),
            "goal_p99_le_1s": bool(lat) and q[98] <= 1.0,
        }
    finally:
        op.terminate()
        try:
            op.wait(20)
        except subprocess.TimeoutExpired:
            op.kill()
        log.close()
        if not args.keep:
            core.delete_namespace(ns)
            list(pool.map(lambda n: core.delete_node(n), names))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

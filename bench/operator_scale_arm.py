"""One arm of bench/operator_scale.py: an operator process (this checkout's or another's) on the shared bed,
its jobs settled, then the steady state, an interruption of many spot nodes at once, and a restart."""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.operator_scale_probe import (
    EventCounter,
    WorkerDeletions,
    bucket_quantile,
    drained,
    free_port,
    loadavg,
    proc_usage,
    quantiles,
    scrape,
    scrape_all,
)

from etj_operator.api.models import GROUP, PLURAL, VERSION

BENCH_LABEL = "etj.dev/bench"
TAINT = "aws-node-termination-handler/spot-itn"


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


def sharing_flags(args: argparse.Namespace) -> tuple[str, ...]:
    return ("--extra-priority-class", args.extra_priority_class) if args.extra_priority_class else ()


def run_arm(
    arm: Arm,
    args: argparse.Namespace,
    core: Any,
    custom: Any,
    run: str,
    bed: dict[str, Any],
    counter: EventCounter,
) -> dict[str, Any]:
    """The arm's phases in order, each adding its part of the report: settle, steady, interruption,
    restart; the namespace is emptied whatever happened."""
    pool = ThreadPoolExecutor(32)
    ns = f"bench-{run}-{arm.name}"
    core.create_namespace({"metadata": {"name": ns}})
    port = free_port()
    log_path = Path(tempfile.gettempdir()) / f"etj-bench-{run}-{arm.name}.log"
    out: dict[str, Any] = {"source": arm.src or "this checkout", "log": str(log_path)}
    op = arm.start(args.kubeconfig, port, log_path, sharing_flags(args))
    try:
        wait_metrics(port, op)
        running = settle(args, core, custom, run, ns, pool, out)
        if not running:
            # An operator that never planned (the baseline at 10,000 foreign pods: kopf still indexing
            # them when the settle timeout ran out) has nothing to interrupt or restart: say so and stop.
            out["never_settled"] = True
            out["reconciles"] = scrape_all(port).get("reconciles", 0)
            out["loadavg"] = loadavg()
            return out
        out["steady"] = steady(args, port, op, counter)
        victims, taints = interruption(args, core, run, ns, port, op, counter, running, pool, out)
        stop(op)
        op, out["restart"] = restart(
            args, core, ns, port, lambda: arm.start(args.kubeconfig, port, log_path, sharing_flags(args))
        )
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
        cleanup(core, custom, ns)
    return out


def settle(
    args: argparse.Namespace,
    core: Any,
    custom: Any,
    run: str,
    ns: str,
    pool: ThreadPoolExecutor,
    out: dict[str, Any],
) -> list[Any]:
    """Submit the jobs; wait until their workers run (or their count holds still); the running workers."""
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
    return running


def steady(
    args: argparse.Namespace, port: int, op: subprocess.Popen[bytes], counter: EventCounter
) -> dict[str, Any]:
    """The bed's churn only (foreign status updates, heartbeats), jobs settled: the operator's cost."""
    s0, u0, c0, t0 = scrape_all(port), proc_usage(op.pid), counter.snapshot(), time.monotonic()
    time.sleep(args.steady_seconds)
    s1, u1, c1, dt = scrape_all(port), proc_usage(op.pid), counter.snapshot(), time.monotonic() - t0
    events = sum(c1.values()) - sum(c0.values())
    cpu = u1["cpu_seconds"] - u0["cpu_seconds"]
    plans = s1.get("reconciles", 0) - s0.get("reconciles", 0)
    return {
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


def interruption(
    args: argparse.Namespace,
    core: Any,
    run: str,
    ns: str,
    port: int,
    op: subprocess.Popen[bytes],
    counter: EventCounter,
    running: list[Any],
    pool: ThreadPoolExecutor,
    out: dict[str, Any],
) -> tuple[list[str], dict[str, list[dict[str, str]]]]:
    """Taint N spot nodes hosting workers at once; how fast and at what cost their workers are drained.
    The tainted nodes and their taints (the next arm gets the nodes back).

    Long because: one measurement window, from the taints sent to the operator's follow-up work, read whole.
    """
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
    lat = sorted(seen[p] - sent[n] for p, n in victim_pods.items() if p in seen and p not in deletions.late)
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
    return victims, taints


def restart(
    args: argparse.Namespace, core: Any, ns: str, port: int, start: Callable[[], subprocess.Popen[bytes]]
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """A new operator process (``start``): the first plan of every job, and no worker deleted meanwhile."""
    watcher = WorkerDeletions(core, ns)
    t0 = time.monotonic()
    op = start()
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
    return op, {
        "metrics_up_seconds": round(up_s, 2),
        "plans_for_all_jobs_seconds": round(planned_s, 2) if planned_s is not None else None,
        "wrong_drains": len(watcher.seen),
        "watched_seconds_after": args.restart_watch,
        "cpu_seconds": round(u["cpu_seconds"], 2),
        "rss_mib": round(u["rss_mib"], 1),
        "loadavg": loadavg(),
    }


def cleanup(core: Any, custom: Any, ns: str) -> None:
    """Empty the arm's namespace and wait for its pods to go."""
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
            drained(core.delete_collection_namespaced_pod(ns, grace_period_seconds=0, _preload_content=False))
            drained(core.delete_namespace(ns, _preload_content=False))
            break
        except Exception as exc:  # any failure: try again, then leave it
            print(f"cleanup of {ns} failed ({exc!r}), attempt {attempt + 1}", file=sys.stderr)
            time.sleep(2)
    # The workers' GPUs must be free before the next arm: wait for the namespace's pods to go.
    end = time.monotonic() + 180
    while time.monotonic() < end and core.list_namespaced_pod(ns, limit=1).items:
        time.sleep(1)

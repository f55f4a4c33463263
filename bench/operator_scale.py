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
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config

from etj_operator.api.models import GROUP, PLURAL
from etj_testbed.localcluster import toolchain
from etj_testbed.localcluster.crds import wait_established
from etj_testbed.localcluster.fake_nodes import fake_gpu_node

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/ is sys.path[0], the repository is not
    sys.path.insert(0, str(REPO))

from bench.operator_scale_arm import BENCH_LABEL, Arm, run_arm  # noqa: E402
from bench.operator_scale_probe import EventCounter, drained, loadavg  # noqa: E402


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


def wait_foreign_running(core: Any, ns: str) -> float:
    """kwok marks the new pods Running (a burst of status writes): the seconds until that churn ended."""
    t0 = time.monotonic()
    while (
        time.monotonic() - t0 < 600
        and core.list_namespaced_pod(ns, field_selector="status.phase!=Running", limit=1).items
    ):
        time.sleep(2)
    return round(time.monotonic() - t0, 1)


def nodes_not_ready(core: Any, run: str) -> int:
    return sum(
        1
        for n in core.list_node(label_selector=f"{BENCH_LABEL}={run}").items
        if not any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
    )


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
        result["bed"]["foreign_pods_running_seconds"] = wait_foreign_running(core, bed["foreign_ns"])
        updater = Updater(core, bed["foreign_ns"], bed["foreign_names"], args.foreign_update_seconds)
        time.sleep(min(30.0, args.bed_seconds))  # the update stream reaches its rate
        result["bed"]["quiet"] = bed_quiet(args, counter)
        result["bed"]["nodes_not_ready"] = nodes_not_ready(core, run)
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
        result["bed"]["nodes_not_ready_at_end"] = nodes_not_ready(core, run)
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

"""A burst of pod deletes through the operator's own KubeClient: what the "api" stage of a mass drain costs.

At 1,000 nodes, 50 tainted nodes make ~60 job loops send their deletes at once (bench/operator_scale.py,
etj_operator_drain_stage_seconds{stage="api"}). Each goes through the synchronous client in a thread; a
connection pool that holds fewer open connections than the burst opens new ones, each a TLS handshake in
Python under the GIL. This bench measures the burst against a real apiserver with the pool cold (a new
client) and warm (as many connections opened beforehand as the burst needs), both in the same run, and
prints JSON:

    KUBECONFIG=$(etj cluster up | tail -1) python bench/delete_burst.py --pods 60 --rounds 3

The pods are created unscheduled (no node), deleted with grace 0, in a namespace of their own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from etj_operator.k8s.client import KubeClient
from etj_operator.k8s.kube_api import api_client


def make_pods(core: Any, ns: str, n: int) -> None:
    body = {"spec": {"containers": [{"name": "c", "image": "none"}]}}
    for i in range(n):
        pod = {**body, "metadata": {"name": f"p{i}"}}
        _ = core.create_namespaced_pod(ns, pod, _preload_content=False).data


async def burst(kube: KubeClient, ns: str, n: int) -> dict[str, float]:
    """Delete p0..p{n-1} at once; per-delete latency p50/max and the time until all were accepted."""
    latencies: list[float] = []

    async def one(i: int) -> None:
        started = time.perf_counter()
        await kube.delete_pod(ns, f"p{i}", uid=None, grace=0)
        latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return {
        "p50": round(statistics.median(latencies), 3),
        "max": round(max(latencies), 3),
        "all_accepted": round(time.perf_counter() - started, 3),
    }


async def warm(kube: KubeClient, ns: str, n: int) -> None:
    """Open ``n`` pooled connections: ``n`` small requests at once."""

    def get() -> None:
        _ = kube.core.list_namespaced_pod(ns, limit=1, _preload_content=False).data

    await asyncio.gather(*(asyncio.to_thread(get) for _ in range(n)))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    # The operator's executor (k8s/main.py): enough threads for every delete of the burst at once.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=64))
    core: Any = client.CoreV1Api(api_client())
    ns = f"burst-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    while not core.list_namespaced_service_account(ns).items:  # the SA admission plugin wants it
        await asyncio.sleep(0.2)
    out: dict[str, Any] = {"pods": args.pods, "cpus": os.cpu_count(), "rounds": []}
    try:
        for _ in range(args.rounds):
            row: dict[str, Any] = {"loadavg": round(os.getloadavg()[0], 2)}
            make_pods(core, ns, args.pods)
            row["cold_pool"] = await burst(KubeClient(api_client()), ns, args.pods)
            kube = KubeClient(api_client())
            await warm(kube, ns, args.pods)
            make_pods(core, ns, args.pods)
            row["warm_pool"] = await burst(kube, ns, args.pods)
            out["rounds"].append(row)
    finally:
        _ = core.delete_namespace(ns, _preload_content=False).data
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=60, help="deletes in the burst")
    p.add_argument("--rounds", type=int, default=3)
    print(json.dumps(asyncio.run(run(p.parse_args())), indent=2))


if __name__ == "__main__":
    main()

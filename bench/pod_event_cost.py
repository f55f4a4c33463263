"""The operator's own CPU per pod watch event, without a cluster (issue 29); prints JSON.

Feeds ``handlers.State`` the raw bytes of watch events as the pod watch reads them (decode, then the
usage ledger and the job index) and reports process CPU per event: for status updates of pods that are
not etj's (the bulk of a real cluster's pod events), of etj's own workers (which wake a job loop), and a
relist of the whole cluster. The bed benchmark (operator_scale.py) measures the same path end to end on a
loaded machine; this isolates what the operator itself spends.

    python bench/pod_event_cost.py --pods 10000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from etj_operator.constants import LABEL_JOB
from etj_operator.k8s.handlers import State
from etj_operator.k8s.pod_watch import split_events
from etj_operator.k8s.settings import Settings


def pod(i: int, ours: bool) -> dict[str, Any]:
    """A pod the size of a real one (~3 KB of JSON: labels, env, probes, status with conditions)."""
    labels = {"app": f"svc-{i % 50}", "pod-template-hash": "5d8f7c9b6d"}
    if ours:
        labels |= {LABEL_JOB: f"job-{i % 100}", "etj.dev/role": "worker", "etj.dev/slot": str(i % 4)}
    requests = {"cpu": "100m", "memory": "128Mi", **({"nvidia.com/gpu": "1"} if ours else {})}
    return {
        "metadata": {
            "name": f"p-{i}",
            "namespace": "ml" if ours else f"team-{i % 20}",
            "uid": f"00000000-0000-0000-0000-{i:012d}",
            "resourceVersion": str(1000 + i),
            "labels": labels,
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-27T00:00:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "x"}],
        },
        "spec": {
            "nodeName": f"node-{i % 1000}",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/team/service:1.2.3",
                    "env": [{"name": f"VAR_{k}", "value": "x" * 20} for k in range(10)],
                    "resources": {"requests": requests, "limits": requests},
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
                }
            ],
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.244.0.1",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-11-27T00:00:00Z"}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {"name": "main", "ready": True, "restartCount": 0, "state": {"running": {}}}
            ],
        },
    }


class Kicks:
    def __init__(self) -> None:
        self.n = 0

    def kick(self, namespace: str, name: str) -> None:
        self.n += 1


def per_event_us(state: State, lines: list[bytes]) -> float:
    t0 = time.process_time()
    for line in lines:
        events, _ = split_events(b"", line)
        state.pod_events("", [(e["type"], e["object"]) for e in events])
    return 1e6 * (time.process_time() - t0) / len(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=10000, help="foreign pods in the cluster")
    p.add_argument("--ours", type=int, default=400, help="etj worker pods")
    args = p.parse_args()
    foreign = [pod(i, False) for i in range(args.pods)]
    ours = [pod(args.pods + i, True) for i in range(args.ours)]
    state = State(Settings())
    kicks = Kicks()
    state.runners = kicks  # type: ignore[assignment,unused-ignore]  # only kick() is used here
    t0 = time.process_time()
    state.pods_relisted("", foreign + ours)
    relist_s = time.process_time() - t0
    encode = lambda kind, body: (json.dumps({"type": kind, "object": body}) + "\n").encode()  # noqa: E731
    foreign_lines = [encode("MODIFIED", b) for b in foreign]
    our_lines = [encode("MODIFIED", b) for b in ours]
    after_relist = kicks.n
    foreign_us = per_event_us(state, foreign_lines)
    kicks_before = kicks.n - after_relist
    ours_us = per_event_us(state, our_lines)
    decode_t0 = time.process_time()
    for line in foreign_lines:
        json.loads(line)
    decode_us = 1e6 * (time.process_time() - decode_t0) / len(foreign_lines)
    print(
        json.dumps(
            {
                "pods": args.pods,
                "ours": args.ours,
                "event_bytes": round(sum(map(len, foreign_lines)) / len(foreign_lines)),
                "foreign_status_update_us": round(foreign_us, 1),
                "of_which_json_decode_us": round(decode_us, 1),
                "our_worker_update_us": round(ours_us, 1),
                "job_loops_woken_by_foreign_updates": kicks_before,
                "relist_seconds": round(relist_s, 3),
                "cpu_share_at_1_update_per_pod_per_2_min": round(args.pods / 120 * foreign_us / 1e6, 5),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Chaos bench: the spot demo's job survives >= 20 random events and still Succeeds with nothing lost.

(Over ~400 lines: one scenario -- the event kinds, their bookkeeping and the bad-data job share its state.)

Reuses `etj_testbed.demo.local.Demo` (local control plane, operator subprocess, process-backed nodes, the CPU
demo job `examples/demo-cpu.yaml`) with its own scripted interruption switched off, and injects a seeded
random schedule of events instead, one every 8-15 s and only once the job has made progress since the last
one:

- ``pod-delete``: ``kubectl delete pod`` of a running worker (graceful: SIGTERM, grace period);
- ``pod-kill``: the same with ``--grace-period=0 --force`` (the SIGKILL equivalent);
- ``node-delete``: a spot node (one hosting a worker if any) is deleted; a fresh spot node comes later;
- ``spot-interruption``: the AWS NTH taint ``aws-node-termination-handler/spot-itn:NoSchedule`` and a cordon
  on a spot node hosting a worker; the node is deleted once drained (or after the notice), a fresh one later;
- ``operator-restart``: every operator replica is SIGKILLed and new ones started with the same command;
- ``leader-kill``: the operator replica holding the leader Lease is SIGKILLed (the operator runs as the chart
  runs it: two replicas electing a leader); a new replica replaces it; the failover time is measured;
- ``store-kill``: the job's rendezvous store pod is force-deleted (SIGKILL, no grace);
- ``store-node-loss``: the on-demand node hosting the store is deleted (machine gone); a fresh on-demand
  node comes later;
- ``od-drain``: ``kubectl drain`` of an on-demand node (maintenance: evictions, the store included, then
  uncordon once done);
- ``store-node-drain``: ``kubectl drain`` of the node hosting the store (a node group upgrade): it must
  complete (the store moves), with no failure counted; its duration is measured;
- ``slow-store``: every on-demand node takes 45-90 s to "pull" the store's image (the process nodes'
  simulated pull, ``etj.dev/proclet-image-pull-seconds``) and the store pod is force-deleted: the workers
  wait for a store that starts slowly; the time until the new store runs is measured.

Besides, a second job (``chaos-bad``) with a bad data path runs beside it from the start: it must end
Failed (bounded crash loops, then the failure budget) with the trainer's error line in its progress
document (``lastError``); the times both took are reported.

At least one on-demand node always stays (the store's and the minimum worker's capacity). At the end: the
job must be Succeeded, every training sample seen exactly once in every epoch (the trainer's sample log,
read with `etj_trainer.core.sample_log.consumed_per_epoch` as the e2e does), no failure counted
(``status.failures``: store events must not count), every drain completed, the bad job Failed with its
error reported, and at least ``--min-events`` events done.
Prints one JSON object; exits 1 otherwise. Runs on a private cluster (``ETJ_CLUSTER_NAME=chaos``,
``ETJ_CLUSTER_PORT_BASE=18400`` unless set) that is stopped at the end.

    .venv/bin/python bench/chaos.py --seed 1 [--events 24] [--epochs 60] [--keep-cluster]
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/ is sys.path[0], the repository is not
    sys.path.insert(0, str(REPO))

from bench.chaos_replicas import Replicas, leader_flags, lease_path  # noqa: E402

from etj_contract.ports import PROGRESS_PORT  # noqa: E402
from etj_operator.decide.names import TOKEN_KEY, token_secret_name  # noqa: E402
from etj_testbed.demo.local import Demo  # noqa: E402
from etj_testbed.demo.script import GROUP_PATH, SPOT_ITN, Script  # noqa: E402
from etj_testbed.demo.view import logged_accuracy  # noqa: E402
from etj_testbed.localcluster import toolchain  # noqa: E402
from etj_testbed.localcluster.proclet.nodes import PULL_SECONDS_ANNOTATION  # noqa: E402
from etj_trainer.core.progress import get_json  # noqa: E402

JSON = dict[str, Any]
KINDS = (
    "pod-delete",
    "pod-kill",
    "node-delete",
    "spot-interruption",
    "operator-restart",
    "store-kill",
    "store-node-loss",
    "od-drain",
    "store-node-drain",
    "leader-kill",
    "slow-store",
)
WEIGHTS = (3, 3, 2, 2, 1, 2, 1, 1, 1, 1, 1)
BAD_JOB = "chaos-bad"
NODE_PREFIX = {"spot": "spot", "on-demand": "od"}  # node names as Demo.start gives them
NOTICE_S = 60.0  # the interrupted node goes at the latest this long after the notice
RETURN_S = (8.0, 15.0)  # a fresh spot node this long after one is gone
SLOW_PULL_S = (45.0, 90.0)  # the slow store's image pull on every on-demand node


@dataclass
class Chaos:
    seed: int
    events: int
    gap_s: tuple[float, float] = (8.0, 15.0)
    rng: random.Random = field(init=False)
    kinds: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        # Every kind at least once (operator restart included), the rest drawn by weight; shuffled.
        kinds = list(KINDS) + self.rng.choices(KINDS, WEIGHTS, k=max(0, self.events - len(KINDS)))
        self.rng.shuffle(kinds)
        self.kinds = kinds


class ChaosDemo(Demo):
    """`Demo` with a chaos schedule: `Demo.run` polls `job()` once a second, which is the hook used here."""

    def __init__(self, *args: Any, chaos: Chaos, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chaos = chaos
        self.done: list[JSON] = []  # the events, with time, kind, target, and the job's state then
        self.next_at = 0.0
        self.last_progress: tuple[int, int] = (-1, -1)
        self.notices: dict[str, float] = {}  # interrupted node -> monotonic time of the notice
        self.returns: list[tuple[float, str]] = []  # (monotonic time, capacity type) of a fresh node due
        self.serial = {"spot": 3, "on-demand": 3}  # the next fresh node's number, per capacity type
        self.drain: Drain | None = None  # the `kubectl drain` running
        self.drains: list[JSON] = []  # every drain done: node, store's node or not, seconds, kubectl's exit
        self.slow: JSON | None = None  # the slow store start-up under way
        self.slow_stores: list[JSON] = []  # every slow start-up done: pull seconds, store back after
        self.operator_restarts = 0
        self.operator_args = tuple(leader_flags(self.ns, "chaos-op-0"))  # two replicas, as the chart runs
        self.replicas: Replicas | None = None
        self.bad: JSON = {"submitted_at": None, "failed_after_s": None, "error_after_s": None, "error": None}

    def start(self) -> None:
        super().start()  # the harness, the first operator replica (procs[1]) and the nodes
        self.replicas = Replicas(
            self.procs, [1], self.run_dir / "operator.log", lambda: self.kube.get_or_none(lease_path(self.ns))
        )
        self.replicas.add([str(a) for a in self.procs[1].args])

    # ---- the hook ---------------------------------------------------------------------------

    def job(self) -> JSON:
        job = super().job()
        try:
            self.tick(job)
        except Exception as e:  # a failed injection is recorded, not fatal to the run
            self.event(f"chaos step failed: {e!r}")
        return job

    def tick(self, job: JSON) -> None:
        now = time.monotonic()
        status = job.get("status") or {}
        progress = status.get("progress") or {}
        for node, at in list(self.notices.items()):
            drained = node not in self.worker_nodes().values()
            if drained or now - at > NOTICE_S:
                self.kubectl("delete", "node", node, "--wait=false", check=False)
                self.nodes.remove(node)
                del self.notices[node]
                self.returns.append((now + self.chaos.rng.uniform(*RETURN_S), "spot"))
                self.event(f"{node} terminated ({'after the drain' if drained else 'notice expired'})")
        for due in [r for r in self.returns if r[0] <= now]:
            self.returns.remove(due)
            capacity = due[1]
            name = f"{self.instance}-{NODE_PREFIX[capacity]}-{self.serial[capacity]}"
            self.serial[capacity] += 1
            self.add_node(name, capacity)
            self.event(f"{capacity} capacity is back: {name}")
        if self.drain is not None and self.drain.proc.poll() is not None:
            done = self.drain.record(now)
            self.drains.append(done)
            self.kubectl("uncordon", done["node"], check=False)
            self.event(f"drain of {done['node']} done in {done['seconds']} s (kubectl exit {done['exit']})")
            self.drain = None
        for identity, code in self.replicas.restart_exited() if self.replicas is not None else []:
            self.event(f"operator replica {identity} exited ({code}) by itself; restarted as a kubelet would")
        if self.replicas is not None and (failover := self.replicas.observe(now)) is not None:
            self.event(f"leader failover: {failover.new_leader} leads after {failover.seconds} s")
        self.watch_slow_store(now)
        self.watch_bad_job()
        if len(self.done) >= len(self.chaos.kinds) or status.get("phase") != "Running":
            return
        here = (progress.get("epoch") or 0, progress.get("step") or 0)
        if self.next_at == 0.0:
            self.next_at = now + self.chaos.rng.uniform(*self.chaos.gap_s)
        # Due, and the job trained at least one step since the last event (else: wait for it).
        if now < self.next_at or here <= self.last_progress:
            return
        kind = self.chaos.kinds[len(self.done)]
        target = self.inject(kind)
        if target is None:  # nothing to hit for this kind now (no spot node with a worker, say)
            kind, target = "pod-delete", self.inject("pod-delete")
            if target is None:
                return
        self.done.append(
            {
                "t": round(time.time() - self.result.t0, 1),
                "kind": kind,
                "target": target,
                "world": status.get("worldSize"),
                "epoch": here[0],
                "step": here[1],
                "failures": status.get("failures") or 0,
            }
        )
        self.last_progress = here
        self.next_at = now + self.chaos.rng.uniform(*self.chaos.gap_s)

    # ---- the bad-data job ---------------------------------------------------------------------

    def submit(self) -> None:
        super().submit()
        self.submit_bad_job()

    def cleanup(self, delete_job: bool = True) -> None:
        if self.drain is not None and self.drain.proc.poll() is None:
            self.drain.proc.kill()
        self.kubectl(
            "delete", "etj", BAD_JOB, "-n", self.ns, "--ignore-not-found", "--wait=false", check=False
        )
        super().cleanup(delete_job)

    def submit_bad_job(self) -> None:
        """A job whose data path does not exist: a deterministic trainer error on every start."""
        job = self.job_manifest()
        job["metadata"]["name"] = BAD_JOB
        spec = job["spec"]
        spec["replicas"] = {"min": 1, "max": 1}
        spec["trainer"]["resources"] = {"gpu": 0, "cpu": "100m", "memory": "256Mi"}  # no GPU slot taken
        spec["trainer"]["env"] = [
            {"name": "ETJ_DATA", "value": "/nonexistent/chaos-bad-data"},
            *(e for e in spec["trainer"]["env"] if e["name"] not in ("ETJ_DATA", "ETJ_SAMPLE_LOG_DIR")),
        ]
        spec["checkpoint"]["path"] = str(self.run_dir / "bad-checkpoints")
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(job))
        self.bad["submitted_at"] = time.monotonic()
        self.event(f"submitted {BAD_JOB} (data path /nonexistent/chaos-bad-data)")

    def watch_bad_job(self) -> None:
        t0 = self.bad["submitted_at"]
        if t0 is None or (self.bad["failed_after_s"] is not None and self.bad["error"] is not None):
            return
        path = f"{GROUP_PATH}/namespaces/{self.ns}/elastictrainingjobs/{BAD_JOB}"
        status = (self.kube.get_or_none(path) or {}).get("status") or {}
        if self.bad["error"] is None:
            token = self.progress_token(BAD_JOB)
            for pod in self.pods_of(BAD_JOB, "rendezvous"):
                ip = (pod.get("status") or {}).get("podIP")
                url = f"http://{ip}:{PROGRESS_PORT}/progress"
                doc = get_json(url, timeout=1.0, token=token) if ip and token else None
                if doc and doc.get("lastError"):
                    self.bad["error"] = doc["lastError"]
                    self.bad["error_after_s"] = round(time.monotonic() - t0, 1)
                    self.event(f"{BAD_JOB} reports: {doc['lastError']}")
        if self.bad["error"] is None:
            # The trainer refuses bad input before its agent starts (agent/preflight.py), often before the
            # store answers: then the refusal reaches the user as the failed pod's termination message,
            # which the WorkerFailed Warning quotes.
            events = self.kube.get(
                f"/api/v1/namespaces/{self.ns}/events",
                fieldSelector=f"involvedObject.name={BAD_JOB},reason=WorkerFailed",
            )
            quoted = [
                e.get("message") or ""
                for e in events.get("items") or []
                if "chaos-bad-data" in (e.get("message") or "")
            ]
            if quoted:
                self.bad["error"] = quoted[0]
                self.bad["error_after_s"] = round(time.monotonic() - t0, 1)
                self.event(f"{BAD_JOB} WorkerFailed: {quoted[0]}")
        if self.bad["failed_after_s"] is None and status.get("phase") == "Failed":
            self.bad["failed_after_s"] = round(time.monotonic() - t0, 1)
            self.bad["failures"] = status.get("failures")
            self.bad["message"] = status.get("message")
            self.event(f"{BAD_JOB} Failed after {self.bad['failed_after_s']} s")

    def progress_token(self, job: str) -> str | None:
        """The job's progress token, from the Secret the operator made (the store refuses a GET without)."""
        secret = self.kube.get_or_none(f"/api/v1/namespaces/{self.ns}/secrets/{token_secret_name(job)}")
        raw = ((secret or {}).get("data") or {}).get(TOKEN_KEY)
        return base64.b64decode(raw).decode() if raw else None

    def pods_of(self, job: str, role: str) -> list[JSON]:
        sel = f"etj.dev/job={job},etj.dev/role={role}"
        items = self.kube.get(f"/api/v1/namespaces/{self.ns}/pods", labelSelector=sel).get("items") or []
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    # ---- the events -------------------------------------------------------------------------

    def od_nodes(self) -> list[str]:
        return sorted(n for n in self.nodes if n.startswith(f"{self.instance}-od"))

    def store_node(self) -> str | None:
        running = [p for p in self.pods_of(self.name, "rendezvous") if p["status"].get("phase") == "Running"]
        return running[0]["spec"].get("nodeName") if running else None

    def running_workers(self) -> list[str]:
        pods = self.kube.get(f"/api/v1/namespaces/{self.ns}/pods", labelSelector=f"etj.dev/job={self.name}")
        return sorted(
            p["metadata"]["name"]
            for p in pods.get("items") or []
            if p["metadata"].get("labels", {}).get("etj.dev/role") == "worker"
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") == "Running"
        )

    def spot_nodes(self, with_worker: bool) -> list[str]:
        spot = [n for n in self.nodes if n.startswith(f"{self.instance}-spot") and n not in self.notices]
        if with_worker:
            hosting = set(self.worker_nodes().values())
            spot = [n for n in spot if n in hosting]
        return sorted(spot)

    def inject(self, kind: str) -> str | None:
        rng = self.chaos.rng
        if kind in ("pod-delete", "pod-kill"):
            workers = self.running_workers()
            if not workers:
                return None
            pod = rng.choice(workers)
            force = ["--grace-period=0", "--force"] if kind == "pod-kill" else []
            self.kubectl("delete", "pod", pod, "-n", self.ns, "--wait=false", *force, check=False)
            self.event(f"{kind}: {pod}")
            return pod
        if kind == "node-delete":
            nodes = self.spot_nodes(with_worker=True) or self.spot_nodes(with_worker=False)
            if not nodes:
                return None
            node = rng.choice(nodes)
            self.kubectl("delete", "node", node, "--wait=false", check=False)
            self.nodes.remove(node)
            self.returns.append((time.monotonic() + rng.uniform(*RETURN_S), "spot"))
            self.event(f"node-delete: {node} (machine gone without notice)")
            return node
        if kind == "spot-interruption":
            nodes = self.spot_nodes(with_worker=True)
            if not nodes:
                return None
            node = rng.choice(nodes)
            self.interrupt(node)
            self.notices[node] = time.monotonic()
            self.event(f"spot-interruption: {node} (taint {SPOT_ITN}:NoSchedule, cordon)")
            return node
        if kind == "operator-restart":
            self.restart_operator()
            return "operator"
        if kind == "store-kill":
            stores = self.pods_of(self.name, "rendezvous")
            if not stores:
                return None
            pod = stores[0]["metadata"]["name"]
            self.kubectl("delete", "pod", pod, "-n", self.ns, "--wait=false", "--grace-period=0", "--force")
            self.event(f"store-kill: {pod}")
            return pod
        if kind == "store-node-loss":
            lost = self.store_node()
            # Another on-demand node must stay (the replacement store's place), and none is being drained.
            if lost is None or len(self.od_nodes()) < 2 or self.drain is not None:
                return None
            node = lost
            self.kubectl("delete", "node", node, "--wait=false", check=False)
            self.nodes.remove(node)
            self.returns.append((time.monotonic() + rng.uniform(*RETURN_S), "on-demand"))
            self.event(f"store-node-loss: {node} (machine gone without notice)")
            return node
        if kind in ("od-drain", "store-node-drain"):
            store = self.store_node()
            if self.drain is not None or len(self.od_nodes()) < 2:
                return None
            if kind == "store-node-drain" and not store:
                return None
            hosting = {store, *self.worker_nodes().values()}
            node = store if kind == "store-node-drain" else None
            node = node or rng.choice([n for n in self.od_nodes() if n in hosting] or self.od_nodes())
            self.start_drain(node, store=node == store)
            self.event(f"{kind}: kubectl drain {node}{' (the store runs there)' if node == store else ''}")
            return node
        if kind == "leader-kill":
            assert self.replicas is not None
            killed = self.replicas.kill_leader(time.monotonic())
            if killed is not None:
                self.event(f"leader-kill: {killed} (held the Lease) SIGKILLed; a new replica started")
            return killed
        if kind == "slow-store":
            return self.slow_store(rng.uniform(*SLOW_PULL_S))
        raise ValueError(kind)

    def start_drain(self, node: str, store: bool) -> None:
        cmd = [str(toolchain.binary("kubectl")), "--kubeconfig", str(self.kubeconfig), "drain", node,
               "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=90s"]  # fmt: skip
        with open(self.run_dir / "drains.log", "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.drain = Drain(node, proc, time.monotonic(), store)

    def slow_store(self, pull_s: float) -> str | None:
        """Every on-demand node "pulls" for ``pull_s`` before a pod starts; then the store is killed."""
        stores = self.pods_of(self.name, "rendezvous")
        if not stores or self.slow is not None:
            return None
        for node in self.od_nodes():
            self.kubectl("annotate", "node", node, f"{PULL_SECONDS_ANNOTATION}={pull_s:.0f}", "--overwrite")
        pod = stores[0]["metadata"]
        self.kubectl("delete", "pod", pod["name"], "-n", self.ns, "--wait=false",
                     "--grace-period=0", "--force")  # fmt: skip
        self.slow = {"killed": pod["uid"], "pull_s": round(pull_s), "at": time.monotonic()}
        self.event(f"slow-store: {pod['name']} killed; its replacement pulls for {pull_s:.0f} s")
        return str(pod["name"])

    def watch_slow_store(self, now: float) -> None:
        """The slow start-up is over when a new store runs: record it and take the pull delay off."""
        if self.slow is None:
            return
        running = [
            p for p in self.pods_of(self.name, "rendezvous")
            if p["status"].get("phase") == "Running" and p["metadata"]["uid"] != self.slow["killed"]
        ]  # fmt: skip
        if not running:
            return
        done = {"pull_s": self.slow["pull_s"], "store_back_after_s": round(now - self.slow["at"], 1)}
        self.slow_stores.append(done)
        for node in self.od_nodes():
            self.kubectl("annotate", "node", node, f"{PULL_SECONDS_ANNOTATION}-", check=False)
        self.event(f"slow-store: a new store runs {done['store_back_after_s']} s after the kill")
        self.slow = None

    def restart_operator(self) -> None:
        """SIGKILL every replica (no clean shutdown, the Lease is not released) and start new ones."""
        assert self.replicas is not None
        killed = self.replicas.kill_all()
        self.operator_restarts += 1
        self.event(f"operator-restart: replicas {', '.join(killed)} killed, new ones started")


@dataclass
class Drain:
    """A `kubectl drain` under way."""

    node: str
    proc: subprocess.Popen[bytes]
    started: float
    store: bool  # the store ran on the node when the drain began

    def record(self, now: float) -> JSON:
        return {
            "node": self.node,
            "store_node": self.store,
            "seconds": round(now - self.started, 1),
            "exit": self.proc.returncode,
        }


def check_samples(run_dir: Path, epochs: int) -> JSON:
    """Every training sample exactly once in every epoch (the e2e's check, against the dataset itself)."""
    from etj_trainer.core.sample_log import consumed_per_epoch
    from etj_trainer.data.digits import digits_split

    n = len(digits_split()["train"][1])
    got = consumed_per_epoch(run_dir / "samples")
    problems: list[str] = []
    if sorted(got) != list(range(epochs)):
        problems.append(f"epochs in the sample log: {sorted(got)}, want 0..{epochs - 1}")
    for epoch in sorted(got):
        counts = Counter(got[epoch])
        dup = sorted(i for i, c in counts.items() if c > 1)
        missing = sorted(set(range(n)) - set(counts))
        extra = sorted(set(counts) - set(range(n)))
        if dup:
            problems.append(f"epoch {epoch}: {len(dup)} samples trained twice, e.g. {dup[:10]}")
        if missing:
            problems.append(f"epoch {epoch}: {len(missing)} samples skipped, e.g. {missing[:10]}")
        if extra:
            problems.append(f"epoch {epoch}: unknown sample ids {extra[:10]}")
    return {"ok": not problems, "dataset_size": n, "epochs_logged": len(got), "problems": problems}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--events", type=int, default=24, help="chaos events to inject (at least 20 must land)")
    p.add_argument("--min-events", type=int, default=20)
    p.add_argument("--epochs", type=int, default=60, help="long enough for the events to land mid-training")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds")
    p.add_argument("--manifest", type=Path, default=REPO / "examples" / "demo-cpu.yaml")
    p.add_argument("--run-dir", type=Path)
    p.add_argument("--keep-cluster", action="store_true", help="leave the private cluster running")
    return p.parse_args(argv)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    os.environ.setdefault("ETJ_CLUSTER_NAME", "chaos")
    os.environ.setdefault("ETJ_CLUSTER_PORT_BASE", "18400")
    # One token key for every operator replica, as the chart's Secret gives them: with a random key each, a
    # new leader's tokens do not match the stores' and it cannot read any job's progress (seen here: 401s
    # and a frozen status after the first restart).
    os.environ.setdefault("ETJ_OPERATOR_TOKEN_KEY", secrets.token_hex(32))
    from etj_testbed.localcluster import toolchain
    from etj_testbed.localcluster.cluster import LocalCluster

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    run_dir = args.run_dir or toolchain.cache_root() / "chaos" / time.strftime("%Y%m%d-%H%M%S")
    manifest = yaml.safe_load(args.manifest.read_text())
    manifest = copy.deepcopy(manifest)
    manifest["spec"]["training"]["epochs"] = args.epochs
    chaos = Chaos(args.seed, args.events)
    cluster = LocalCluster.named()
    print(f"chaos: seed {args.seed}, {args.events} events, run directory {run_dir}", file=sys.stderr)
    t_start = time.monotonic()
    demo: ChaosDemo | None = None
    try:
        kubeconfig = cluster.up()
        # The demo's own interruption: off. Another job's rendezvous store on this machine holds ports
        # 29400/29401 (shared host network): wait up to 10 min for it.
        script = Script(interrupt_epoch=10**6, timeout_s=args.timeout)
        demo = ChaosDemo(kubeconfig, "etj-chaos", run_dir, manifest, script, instance="chaos", chaos=chaos)
        demo.start()
        result = demo.run()
    except KeyboardInterrupt:
        print("\ninterrupted: cleaning up", file=sys.stderr)
        return 130
    finally:
        if demo is not None:
            demo.cleanup(delete_job=True)
        if not args.keep_cluster:
            cluster.down()
    status = result.status.get("status") or {}
    accuracy = (status.get("progress") or {}).get("accuracy")
    if accuracy is None:
        accuracy = logged_accuracy(run_dir)
    samples = check_samples(run_dir, args.epochs)
    succeeded = result.phase == "Succeeded"
    enough = len(demo.done) >= args.min_events
    no_failures = not status.get("failures")
    drains_ok = all(d["exit"] == 0 for d in demo.drains)
    bad_ok = demo.bad["failed_after_s"] is not None and bool(demo.bad["error"])
    summary = {
        "seed": args.seed,
        "run_dir": str(run_dir),
        "succeeded": succeeded,
        "phase": result.phase,
        "exactly_once": samples["ok"],
        "sample_check": samples,
        "accuracy": accuracy,
        "failures_counted": status.get("failures") or 0,
        "bad_data_job": {k: v for k, v in demo.bad.items() if k != "submitted_at"},
        "events_injected": len(demo.done),
        "enough_events": enough,
        "counts": dict(Counter(e["kind"] for e in demo.done)),
        "events": demo.done,
        "log": [{"t": round(t, 1), "what": what} for t, what in result.events],
        "resizes": [
            {k: r.get(k) for k in ("from", "to", "reason", "pauseSeconds", "stepsLost")}
            for r in status.get("resizeHistory") or []
        ],
        "failures": status.get("failures"),
        "max_steps_lost": max(
            (r.get("stepsLost") or 0 for r in status.get("resizeHistory") or []), default=0
        ),
        "drains": demo.drains,
        "drains_completed": drains_ok,
        "leader_failovers": [
            {"killed": f.killed, "new_leader": f.new_leader, "seconds": f.seconds}
            for f in (demo.replicas.failovers if demo.replicas else [])
        ],
        "slow_stores": demo.slow_stores,
        "replica_exits": [
            {"replica": who, "code": code} for who, code in (demo.replicas.exits if demo.replicas else [])
        ],
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason", "message")}
            for c in status.get("conditions") or []
        ],
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    print(json.dumps(summary, indent=2))
    return 0 if succeeded and samples["ok"] and enough and no_failures and bad_ok and drains_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The chaos bench's scenario for `etj_testbed.demo.local.Demo`: the seeded schedule (`Chaos`) and what
each event does to the job's machines (`ChaosRun`, the demo's `Scenario`); bench/chaos.py runs it and judges.
The bad-data job beside it is bench/chaos_bad_job.py's.
"""

from __future__ import annotations

import random
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from bench.chaos_bad_job import BadJob, pods_of
from bench.chaos_replicas import Replicas, leader_flags, lease_path

from etj_testbed.demo.local import Demo
from etj_testbed.demo.scenario import Scenario
from etj_testbed.demo.script import SPOT_ITN
from etj_testbed.localcluster import toolchain
from etj_testbed.localcluster.proclet.nodes import PULL_SECONDS_ANNOTATION

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


class ChaosRun(Scenario):
    """The demo's scenario with a chaos schedule: `Demo.run` polls the job once a second and hands it to
    `poll`, which finishes what is due (notices, returns, drains) and injects the next event when due."""

    def __init__(self, chaos: Chaos, namespace: str) -> None:
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
        self._operator_args = tuple(leader_flags(namespace, "chaos-op-0"))  # two replicas, as the chart runs
        self.replicas: Replicas | None = None
        self.bad_job = BadJob()

    def operator_args(self, demo: Demo) -> tuple[str, ...]:
        return self._operator_args

    def start(self, demo: Demo) -> None:
        super().start(
            demo
        )  # the demo's four nodes; the harness and the first operator replica (procs[1]) run
        self.replicas = Replicas(
            demo.procs, [1], demo.run_dir / "operator.log", lambda: demo.kube.get_or_none(lease_path(demo.ns))
        )
        self.replicas.add([str(a) for a in demo.procs[1].args])

    # ---- the hook ---------------------------------------------------------------------------

    def poll(self, demo: Demo, job: JSON) -> None:
        try:
            self.tick(demo, job)
        except Exception as e:  # a failed injection is recorded, not fatal to the run
            demo.event(f"chaos step failed: {e!r}")

    def tick(self, demo: Demo, job: JSON) -> None:
        now = time.monotonic()
        status = job.get("status") or {}
        progress = status.get("progress") or {}
        for node, at in list(self.notices.items()):
            drained = node not in demo.worker_nodes().values()
            if drained or now - at > NOTICE_S:
                demo.remove_node(node)
                del self.notices[node]
                self.returns.append((now + self.chaos.rng.uniform(*RETURN_S), "spot"))
                demo.event(f"{node} terminated ({'after the drain' if drained else 'notice expired'})")
        for due in [r for r in self.returns if r[0] <= now]:
            self.returns.remove(due)
            capacity = due[1]
            name = f"{demo.instance}-{NODE_PREFIX[capacity]}-{self.serial[capacity]}"
            self.serial[capacity] += 1
            demo.add_node(name, capacity)
            demo.event(f"{capacity} capacity is back: {name}")
        if self.drain is not None and self.drain.proc.poll() is not None:
            done = self.drain.record(now)
            self.drains.append(done)
            demo.kubectl("uncordon", done["node"], check=False)
            demo.event(f"drain of {done['node']} done in {done['seconds']} s (kubectl exit {done['exit']})")
            self.drain = None
        for identity, code in self.replicas.restart_exited() if self.replicas is not None else []:
            demo.event(f"operator replica {identity} exited ({code}) by itself; restarted as a kubelet would")
        if self.replicas is not None and (failover := self.replicas.observe(now)) is not None:
            demo.event(f"leader failover: {failover.new_leader} leads after {failover.seconds} s")
        self.watch_slow_store(demo, now)
        self.bad_job.watch(demo)
        if len(self.done) >= len(self.chaos.kinds) or status.get("phase") != "Running":
            return
        here = (progress.get("epoch") or 0, progress.get("step") or 0)
        if self.next_at == 0.0:
            self.next_at = now + self.chaos.rng.uniform(*self.chaos.gap_s)
        # Due, and the job trained at least one step since the last event (else: wait for it).
        if now < self.next_at or here <= self.last_progress:
            return
        kind = self.chaos.kinds[len(self.done)]
        target = self.inject(demo, kind)
        if target is None:  # nothing to hit for this kind now (no spot node with a worker, say)
            kind, target = "pod-delete", self.inject(demo, "pod-delete")
            if target is None:
                return
        self.done.append(
            {
                "t": round(time.time() - demo.result.t0, 1),
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

    # ---- the bad-data job and clean-up --------------------------------------------------------

    def submitted(self, demo: Demo) -> None:
        self.bad_job.submit(demo)

    def cleanup(self, demo: Demo) -> None:
        if self.drain is not None and self.drain.proc.poll() is None:
            self.drain.proc.kill()
        self.bad_job.cleanup(demo)

    # ---- the events -------------------------------------------------------------------------

    def od_nodes(self, demo: Demo) -> list[str]:
        return sorted(n for n in demo.nodes if n.startswith(f"{demo.instance}-od"))

    def store_node(self, demo: Demo) -> str | None:
        running = [p for p in pods_of(demo, demo.name, "rendezvous") if p["status"].get("phase") == "Running"]
        return running[0]["spec"].get("nodeName") if running else None

    def running_workers(self, demo: Demo) -> list[str]:
        pods = demo.kube.get(f"/api/v1/namespaces/{demo.ns}/pods", labelSelector=f"etj.dev/job={demo.name}")
        return sorted(
            p["metadata"]["name"]
            for p in pods.get("items") or []
            if p["metadata"].get("labels", {}).get("etj.dev/role") == "worker"
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") == "Running"
        )

    def spot_nodes(self, demo: Demo, with_worker: bool) -> list[str]:
        spot = [n for n in demo.nodes if n.startswith(f"{demo.instance}-spot") and n not in self.notices]
        if with_worker:
            hosting = set(demo.worker_nodes().values())
            spot = [n for n in spot if n in hosting]
        return sorted(spot)

    def inject(self, demo: Demo, kind: str) -> str | None:
        """Do one event of ``kind``; what it hit, or None when there is nothing to hit now."""
        rng = self.chaos.rng
        if kind in ("pod-delete", "pod-kill"):
            return self.kill_worker(demo, force=kind == "pod-kill")
        if kind == "node-delete":
            nodes = self.spot_nodes(demo, with_worker=True) or self.spot_nodes(demo, with_worker=False)
            return self.lose_node(demo, rng.choice(nodes), "spot", kind) if nodes else None
        if kind == "spot-interruption":
            nodes = self.spot_nodes(demo, with_worker=True)
            if not nodes:
                return None
            node = rng.choice(nodes)
            demo.interrupt(node)
            self.notices[node] = time.monotonic()
            demo.event(f"spot-interruption: {node} (taint {SPOT_ITN}:NoSchedule, cordon)")
            return node
        if kind == "operator-restart":
            self.restart_operator(demo)
            return "operator"
        if kind == "store-kill":
            stores = pods_of(demo, demo.name, "rendezvous")
            if not stores:
                return None
            pod = stores[0]["metadata"]["name"]
            demo.kubectl("delete", "pod", pod, "-n", demo.ns, "--wait=false", "--grace-period=0", "--force")
            demo.event(f"store-kill: {pod}")
            return pod
        if kind == "store-node-loss":
            lost = self.store_node(demo)
            # Another on-demand node must stay (the replacement store's place), and none is being drained.
            if lost is None or len(self.od_nodes(demo)) < 2 or self.drain is not None:
                return None
            return self.lose_node(demo, lost, "on-demand", kind)
        if kind in ("od-drain", "store-node-drain"):
            return self.drain_node(demo, kind)
        if kind == "leader-kill":
            assert self.replicas is not None
            killed = self.replicas.kill_leader(time.monotonic())
            if killed is not None:
                demo.event(f"leader-kill: {killed} (held the Lease) SIGKILLed; a new replica started")
            return killed
        if kind == "slow-store":
            return self.slow_store(demo, rng.uniform(*SLOW_PULL_S))
        raise ValueError(kind)

    def kill_worker(self, demo: Demo, force: bool) -> str | None:
        workers = self.running_workers(demo)
        if not workers:
            return None
        pod = self.chaos.rng.choice(workers)
        flags = ["--grace-period=0", "--force"] if force else []
        demo.kubectl("delete", "pod", pod, "-n", demo.ns, "--wait=false", *flags, check=False)
        demo.event(f"{'pod-kill' if force else 'pod-delete'}: {pod}")
        return pod

    def lose_node(self, demo: Demo, node: str, capacity: str, kind: str) -> str:
        """The machine is gone without notice; a fresh one of its capacity type comes later."""
        demo.remove_node(node)
        self.returns.append((time.monotonic() + self.chaos.rng.uniform(*RETURN_S), capacity))
        demo.event(f"{kind}: {node} (machine gone without notice)")
        return node

    def drain_node(self, demo: Demo, kind: str) -> str | None:
        store = self.store_node(demo)
        if self.drain is not None or len(self.od_nodes(demo)) < 2:
            return None
        if kind == "store-node-drain" and not store:
            return None
        hosting = {store, *demo.worker_nodes().values()}
        node = store if kind == "store-node-drain" else None
        node = node or self.chaos.rng.choice(
            [n for n in self.od_nodes(demo) if n in hosting] or self.od_nodes(demo)
        )
        self.start_drain(demo, node, store=node == store)
        demo.event(f"{kind}: kubectl drain {node}{' (the store runs there)' if node == store else ''}")
        return node

    def start_drain(self, demo: Demo, node: str, store: bool) -> None:
        cmd = [str(toolchain.binary("kubectl")), "--kubeconfig", str(demo.kubeconfig), "drain", node,
               "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=90s"]  # fmt: skip
        with open(demo.run_dir / "drains.log", "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.drain = Drain(node, proc, time.monotonic(), store)

    def slow_store(self, demo: Demo, pull_s: float) -> str | None:
        """Every on-demand node "pulls" for ``pull_s`` before a pod starts; then the store is killed."""
        stores = pods_of(demo, demo.name, "rendezvous")
        if not stores or self.slow is not None:
            return None
        for node in self.od_nodes(demo):
            demo.kubectl("annotate", "node", node, f"{PULL_SECONDS_ANNOTATION}={pull_s:.0f}", "--overwrite")
        pod = stores[0]["metadata"]
        demo.kubectl("delete", "pod", pod["name"], "-n", demo.ns, "--wait=false",
                     "--grace-period=0", "--force")  # fmt: skip
        self.slow = {"killed": pod["uid"], "pull_s": round(pull_s), "at": time.monotonic()}
        demo.event(f"slow-store: {pod['name']} killed; its replacement pulls for {pull_s:.0f} s")
        return str(pod["name"])

    def watch_slow_store(self, demo: Demo, now: float) -> None:
        """The slow start-up is over when a new store runs: record it and take the pull delay off."""
        if self.slow is None:
            return
        running = [
            p for p in pods_of(demo, demo.name, "rendezvous")
            if p["status"].get("phase") == "Running" and p["metadata"]["uid"] != self.slow["killed"]
        ]  # fmt: skip
        if not running:
            return
        done = {"pull_s": self.slow["pull_s"], "store_back_after_s": round(now - self.slow["at"], 1)}
        self.slow_stores.append(done)
        for node in self.od_nodes(demo):
            demo.kubectl("annotate", "node", node, f"{PULL_SECONDS_ANNOTATION}-", check=False)
        demo.event(f"slow-store: a new store runs {done['store_back_after_s']} s after the kill")
        self.slow = None

    def restart_operator(self, demo: Demo) -> None:
        """SIGKILL every replica (no clean shutdown, the Lease is not released) and start new ones."""
        assert self.replicas is not None
        killed = self.replicas.kill_all()
        self.operator_restarts += 1
        demo.event(f"operator-restart: replicas {', '.join(killed)} killed, new ones started")


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

"""bench/spot_replay.py's arm on the bed: `Replay`, the demo's `Scenario` whose spot nodes follow a capacity
trace (with the stand-in autoscaler's on-demand nodes on the deadline arm), and the checks that stop an arm
whose rendezvous store another job on this machine took."""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.economics.accounting import ON_DEMAND, SPOT, STORE, NodeSpan
from bench.economics.provisioner import OnDemandProvisioner
from bench.economics.traces import Trace, schedule

from etj_operator.constants import LABEL_CAPACITY, ROLE_RENDEZVOUS
from etj_testbed.demo.local import Demo
from etj_testbed.demo.scenario import Scenario
from etj_testbed.demo.script import SPOT_ITN

JSON = dict[str, Any]


class StoreTaken(RuntimeError):
    """Another job's rendezvous store holds this machine's port 29400."""


@dataclass
class ArmSpec:
    name: str
    replicas_min: int
    replicas_max: int
    on_demand: int  # on-demand nodes, there throughout
    trace: Trace | None  # spot nodes over time (None: no spot nodes)
    worker_types: tuple[str, ...] = (SPOT, ON_DEMAND)  # spec.placement.capacityTypes
    # An on-demand node for the rendezvous store alone (workers may not run there); not billed: the
    # store is a small CPU service, not a training node.
    store_node: bool = False
    # spec.deadline with the operator's policy; on-demand nodes only from the stand-in autoscaler.
    deadline: bool = False


@dataclass
class CapacityLog:
    spans: list[NodeSpan] = field(default_factory=list)
    offered: list[tuple[float, int, int]] = field(default_factory=list)  # t, spot, on-demand in service


class Replay(Scenario):
    """The demo's scenario whose nodes follow a capacity trace: on each poll of the job the spot nodes are
    brought to the trace's count at that moment (bench/chaos.py's scenario polls the same way)."""

    def __init__(
        self,
        arm: ArmSpec,
        time_scale: float,
        notice_s: float,
        horizon_s: float,
        trace_from: str = "submit",
        provisioner: OnDemandProvisioner | None = None,
        operator_args: tuple[str, ...] = (),
    ) -> None:
        self.arm, self.time_scale, self.notice_s = arm, time_scale, notice_s
        self.steps = list(schedule(arm.trace, time_scale, horizon_s)) if arm.trace else []
        self.log = CapacityLog()
        self.phases: list[str | None] = []  # the job's phase at each poll
        self._clients_checked = 0.0
        self.store_ip: str | None = None
        self.notices: dict[str, float] = {}  # node → monotonic time of its interruption notice
        self.spot_live: list[str] = []  # in service (not noticed), oldest first
        self.serial = 0
        # The trace's clock: from submission, or (--trace-from first-step) from the job's first step, so a
        # slow start on a loaded machine does not move the trace's events before training.
        self.trace_from = trace_from
        self.trace_t0: float | None = 0.0 if trace_from == "submit" else None
        self.provisioner = provisioner
        self.od_auto: list[str] = []  # on-demand nodes the stand-in autoscaler brought
        self.od_serial = 0
        self.by_capacity: list[tuple[float, int, int]] = []  # t, spot, on-demand workers (status)
        self._operator_args = operator_args

    def operator_args(self, demo: Demo) -> tuple[str, ...]:
        return self._operator_args

    # Not the demo's own four nodes: the arm's on-demand ones, then spot nodes from the trace.
    def start(self, demo: Demo) -> None:
        for i in range(self.arm.on_demand):
            demo.add_node(f"{demo.instance}-od-{i + 1}", ON_DEMAND)
        if self.arm.store_node:
            # No GPU: the store's pod needs none, and no worker may take this unbilled node.
            demo.add_node(f"{demo.instance}-store", ON_DEMAND, gpus=0)
            self.log.spans[-1].capacity_type = STORE
        self.follow_trace(demo)

    def node_added(self, demo: Demo, name: str, capacity_type: str) -> None:
        self.log.spans.append(NodeSpan(name, capacity_type, demo.now()))
        if capacity_type == SPOT:
            self.spot_live.append(name)

    def remove_node(self, demo: Demo, name: str) -> None:
        demo.remove_node(name)
        for span in self.log.spans:
            if span.name == name and span.end_s is None:
                span.end_s = demo.now()

    def poll(self, demo: Demo, job: JSON) -> None:
        status = job.get("status") or {}
        # Demo.run records one sample per poll, right after this: the phase goes with that sample.
        self.phases.append(status.get("phase"))
        by = status.get("workersByCapacity") or {}
        self.by_capacity.append((demo.now(), by.get("spot") or 0, by.get("onDemand") or 0))
        if self.trace_t0 is None and ((status.get("progress") or {}).get("step") or 0) > 0:
            self.trace_t0 = demo.now()
            demo.event("first step: the trace's clock starts")
        try:
            self.follow_trace(demo)
        except Exception as e:  # a failed step is recorded, not fatal: the next poll tries again
            demo.event(f"replay step failed: {e!r}")
        self.check_store(demo)
        self.check_clients(demo)

    def check_clients(self, demo: Demo) -> None:
        """The other way round: another job's store could not bind (a store that listens on 0.0.0.0 holds
        the port), so its workers, which dial their store's pod IP on port 29400, reach ours and post
        their progress into our status. A client of our store whose process belongs to another harness
        means that. (Stores bind their pod IPs now, so this should not happen any more.)"""
        if time.monotonic() < self._clients_checked + 5 or not self.store_ip:
            return
        self._clients_checked = time.monotonic()
        ours = str(demo.run_dir / "proclet")
        for pid in store_clients(self.store_ip):
            root = proclet_root(pid)
            if root is not None and root != ours:
                raise StoreTaken(f"process {pid} of another harness ({root}) is a client of our store")

    def check_store(self, demo: Demo) -> None:
        """Process-backed pods share this machine's network, and the rendezvous store listens on
        0.0.0.0:29400: a job started here by someone else after our start takes the port, our store pod
        crash-loops, and our workers talk to theirs. The arm's numbers would be wrong: stop it (run_arm
        retries once the port is free)."""
        pods = demo.kube.get(
            f"/api/v1/namespaces/{demo.ns}/pods",
            labelSelector=f"etj.dev/job={demo.name},etj.dev/role={ROLE_RENDEZVOUS}",
        )
        for pod in pods.get("items") or []:
            self.store_ip = (pod.get("status") or {}).get("podIP") or self.store_ip
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                if cs.get("restartCount"):
                    raise StoreTaken(
                        f"the rendezvous store {pod['metadata']['name']} restarted: port 29400 taken?"
                    )

    def wanted_spot(self, demo: Demo) -> int:
        t = demo.now() - self.trace_t0 if self.trace_t0 is not None else 0.0
        count = 0
        for step in self.steps:
            if step.t_s > t:
                break
            count = step.spot
        return count

    def follow_trace(self, demo: Demo) -> None:
        now = time.monotonic()
        for node, at in list(self.notices.items()):
            drained = node not in demo.worker_nodes().values()
            if drained or now - at > self.notice_s:
                self.remove_node(demo, node)
                del self.notices[node]
                demo.event(f"{node} terminated ({'after the drain' if drained else 'notice expired'})")
        want = self.wanted_spot(demo)
        while len(self.spot_live) < want:
            self.serial += 1
            name = f"{demo.instance}-spot-{self.serial}"
            demo.add_node(name, SPOT)
            demo.event(f"spot capacity: {name} (trace: {want})")
        while len(self.spot_live) > want:
            victim = self.spot_live.pop()  # newest first
            demo.interrupt(victim)
            self.notices[victim] = now
            demo.event(f"interruption notice on {victim} (taint {SPOT_ITN}, cordon; trace: {want})")
        if self.provisioner is not None:
            self.autoscale(demo)
        offered = (demo.now(), len(self.spot_live), self.arm.on_demand + len(self.od_auto))
        if not self.log.offered or self.log.offered[-1][1:] != offered[1:]:
            self.log.offered.append(offered)

    def autoscale(self, demo: Demo) -> None:
        """The stand-in autoscaler (bench/economics/provisioner.py) on this poll's pods and nodes."""
        assert self.provisioner is not None
        pods = demo.kube.get(
            f"/api/v1/namespaces/{demo.ns}/pods", labelSelector=f"etj.dev/job={demo.name},etj.dev/role=worker"
        )
        live = [p for p in pods.get("items") or [] if not p["metadata"].get("deletionTimestamp")]
        pending = sum(
            1
            for p in live
            if (p["metadata"].get("labels") or {}).get(LABEL_CAPACITY) == ON_DEMAND
            and not p["spec"].get("nodeName")
        )
        bound = {p["spec"].get("nodeName") for p in pods.get("items") or []}
        scaling = self.provisioner.step(demo.now(), pending, {n: n in bound for n in self.od_auto})
        for _ in range(scaling.launch):
            self.od_serial += 1
            name = f"{demo.instance}-od-{self.od_serial}"
            demo.add_node(name, ON_DEMAND)
            self.od_auto.append(name)
            demo.event(
                f"on-demand capacity: {name} (autoscaler: {pending} pod(s) pinned to on-demand pending)"
            )
        for name in scaling.remove:
            self.od_auto.remove(name)
            self.remove_node(demo, name)
            demo.event(f"{name} removed (autoscaler: empty)")


def store_clients(store_ip: str) -> set[int]:
    """Pids with a TCP connection to ``store_ip`` port 29400 or 29401 (``ss``, iproute2)."""
    try:
        out = subprocess.run(
            ["ss", "-Htnp", "state", "established", "( dport = :29400 or dport = :29401 )"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    pids: set[int] = set()
    for line in out.splitlines():
        fields = line.split()
        # Recv-Q Send-Q Local:Port Peer:Port Process
        if len(fields) >= 4 and fields[3].rsplit(":", 1)[0] == store_ip:
            pids.update(int(m) for m in re.findall(r"pid=(\d+)", line))
    return pids


def proclet_root(pid: int) -> str | None:
    """The process-node harness root a pod process belongs to (its ETJ_PROCLET_ROOT), if any."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"ETJ_PROCLET_ROOT="):
            return item.split(b"=", 1)[1].decode(errors="replace")
    return None

"""Spot trace replay on the local bed: etj vs a fixed on-demand cluster vs checkpoint-restart on spot.

A real spot capacity trace (``../shared/spot-traces``, docs/economics.md) becomes spot nodes on the local
control plane, on a clock ``--time-scale`` times faster than the trace's: when the trace's count drops, the
newest spot nodes get what the AWS Node Termination Handler does on an interruption notice (the taint
``aws-node-termination-handler/spot-itn:NoSchedule`` and a cordon) and are deleted once drained (or when
the notice runs out); when it rises, new spot nodes appear. A fixed on-demand pool stands beside them. The
demo's job (examples/demo-cpu.yaml: digits CNN, global batch 64) runs through it with the real operator and
trainer (`etj_testbed.demo.local.Demo`, process-backed nodes), three times, one after the other:

- ``etj``: the elastic job, 1 to P workers (P = on-demand pool + the most spot nodes), on both pools;
- ``ckpt_restart``: the same job with min = max = P on the same nodes: it trains only while P workers
  fit, stops when one is interrupted (the world cannot shrink), waits, and restarts from its checkpoint
  when capacity is back — the plain ``torchrun --nnodes=P`` job, run by the same trainer;
- ``on_demand``: the same job with min = max = P on P on-demand nodes, never interrupted;
- ``etj_deadline`` (not run unless named in ``--arms``; issue 28): the elastic job with ``spec.deadline``
  (``--deadline-factor`` times the on-demand arm's training time, run first, or ``--deadline-seconds``) on
  the trace's spot nodes and no on-demand node at all: the operator's deadline policy asks for on-demand
  workers (pods only on-demand capacity can take) when the job falls behind, a stand-in autoscaler
  (bench/economics/provisioner.py: Karpenter's contract, an on-demand node ``--od-delay`` seconds after such
  a pod is pending, gone ``--od-idle`` seconds after it empties) brings their nodes, and the policy lets
  them go first when spot returns.

Same job, seed and data; each arm starts at the same point of the trace. For each: time to finish, node
seconds by capacity type, cost at ``--price-spot`` / ``--price-on-demand`` (USD per node-hour of trace
time: one bed second stands for ``--time-scale`` seconds), goodput and badput (ml-goodput-measurement's
vocabulary, bench/economics/accounting.py), final accuracy, exactly-once over the sample logs; then cost
and time ratios. Prints one JSON object, writes it to ``--out`` and a timeline PNG to ``--plot``.

    .venv/bin/python bench/spot_replay.py availability-16-node-us-east-2b_v100_1 [--time-scale 60]
        [--on-demand 1 --spot-nodes 3] [--price-spot 0.918 --price-on-demand 3.06]
        [--epochs 8] [--start busiest|TICK] [--arms etj,ckpt_restart,on_demand] [--traces DIR]
        [--out F.json] [--plot F.png]
        [--arms on_demand,etj_deadline --deadline-factor 1.5 --rank-rate 32 --trace-from first-step]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/ is sys.path[0], the repository is not
    sys.path.insert(0, str(REPO))

from bench.economics.accounting import (  # noqa: E402
    ON_DEMAND,
    SPOT,
    STORE,
    NodeSpan,
    Poll,
    Prices,
    cost,
    cost_curve,
    goodput,
    node_seconds,
)
from bench.economics.provisioner import OnDemandProvisioner  # noqa: E402
from bench.economics.traces import Trace, busiest_window, resolve_trace, scaled, schedule  # noqa: E402

from etj_operator.constants import LABEL_CAPACITY, ROLE_RENDEZVOUS  # noqa: E402
from etj_operator.timeutil import parse_time  # noqa: E402
from etj_testbed.demo.local import Demo  # noqa: E402
from etj_testbed.demo.script import SPOT_ITN, DemoResult, Script  # noqa: E402

JSON = dict[str, Any]
# p3.2xlarge (1 V100, the traces' instance type), us-east-1, Linux: on-demand list price; spot: 30 % of it,
# about where its spot price sat in 2023 (docs/economics.md, "Prices").
PRICE_ON_DEMAND = 3.06
PRICE_SPOT = 0.918
NOTICE_S = 120.0  # AWS's interruption notice; the node goes earlier once its workers are drained
ARMS = ("etj", "ckpt_restart", "on_demand")
DEADLINE_ARM = "etj_deadline"


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


class ReplayDemo(Demo):
    """`Demo` whose nodes follow a capacity trace. `Demo.run` polls `job()` once a second: the override
    brings the spot nodes to the trace's count at that moment (the same hook bench/chaos.py uses)."""

    def __init__(
        self,
        *args: Any,
        arm: ArmSpec,
        time_scale: float,
        notice_s: float,
        trace_from: str = "submit",
        provisioner: OnDemandProvisioner | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.arm, self.time_scale, self.notice_s = arm, time_scale, notice_s
        horizon = self.script.timeout_s + 60
        self.steps = list(schedule(arm.trace, time_scale, horizon)) if arm.trace else []
        self.log = CapacityLog()
        self.phases: list[str | None] = []  # the job's phase at each poll
        self._clients_checked = 0.0
        self.store_ip: str | None = None
        self.notices: dict[str, float] = {}  # node → monotonic time of its interruption notice
        self.spot_live: list[str] = []  # in service (not noticed), oldest first
        self.serial = 0
        self._making_demo_nodes = False
        # The trace's clock: from submission, or (--trace-from first-step) from the job's first step, so a
        # slow start on a loaded machine does not move the trace's events before training.
        self.trace_from = trace_from
        self.trace_t0: float | None = 0.0 if trace_from == "submit" else None
        self.provisioner = provisioner
        self.od_auto: list[str] = []  # on-demand nodes the stand-in autoscaler brought
        self.od_serial = 0
        self.by_capacity: list[tuple[float, int, int]] = []  # t, spot, on-demand workers (status)

    def event(self, what: str) -> None:
        if not self.result.t0:  # before submission (the first nodes): at 0 on the run's clock
            self.result.events.append((0.0, what))
            print(f"[    0.0s] {what}", flush=True)
            return
        super().event(what)

    def now(self) -> float:
        return time.time() - self.result.t0 if self.result.t0 else 0.0

    # Demo.start creates the demo's own four nodes; the replay makes its nodes from the trace instead.
    def start(self) -> None:
        self._making_demo_nodes = True
        try:
            super().start()
        finally:
            self._making_demo_nodes = False
        for i in range(self.arm.on_demand):
            self.add_node(f"{self.instance}-od-{i + 1}", ON_DEMAND)
        if self.arm.store_node:
            # No GPU: the store's pod needs none, and no worker may take this unbilled node.
            self.add_node(f"{self.instance}-store", ON_DEMAND, gpus=0)
            self.log.spans[-1].capacity_type = STORE
        self.follow_trace()

    def add_node(self, name: str, capacity_type: str, gpus: int = 1) -> None:
        if self._making_demo_nodes:
            return
        super().add_node(name, capacity_type, gpus)
        self.log.spans.append(NodeSpan(name, capacity_type, self.now()))
        if capacity_type == SPOT:
            self.spot_live.append(name)

    def remove_node(self, name: str) -> None:
        self.kubectl("delete", "node", name, "--wait=false", check=False)
        self.nodes.remove(name)
        for span in self.log.spans:
            if span.name == name and span.end_s is None:
                span.end_s = self.now()

    def job(self) -> JSON:
        job = super().job()
        status = job.get("status") or {}
        # Demo.run appends one sample per call, right after it: the phase goes with that sample.
        self.phases.append(status.get("phase"))
        by = status.get("workersByCapacity") or {}
        self.by_capacity.append((self.now(), by.get("spot") or 0, by.get("onDemand") or 0))
        if self.trace_t0 is None and ((status.get("progress") or {}).get("step") or 0) > 0:
            self.trace_t0 = self.now()
            self.event("first step: the trace's clock starts")
        try:
            self.follow_trace()
        except Exception as e:  # a failed step is recorded, not fatal: the next poll tries again
            self.event(f"replay step failed: {e!r}")
        self.check_store()
        self.check_clients()
        return job

    def check_clients(self) -> None:
        """The other way round: another job's store could not bind (a store that listens on 0.0.0.0 holds
        the port), so its workers, which dial their store's pod IP on port 29400, reach ours and post
        their progress into our status. A client of our store whose process belongs to another harness
        means that. (Stores bind their pod IPs now, so this should not happen any more.)"""
        if time.monotonic() < self._clients_checked + 5 or not self.store_ip:
            return
        self._clients_checked = time.monotonic()
        ours = str(self.run_dir / "proclet")
        for pid in store_clients(self.store_ip):
            root = proclet_root(pid)
            if root is not None and root != ours:
                raise StoreTaken(f"process {pid} of another harness ({root}) is a client of our store")

    def check_store(self) -> None:
        """Process-backed pods share this machine's network, and the rendezvous store listens on
        0.0.0.0:29400: a job started here by someone else after our start takes the port, our store pod
        crash-loops, and our workers talk to theirs. The arm's numbers would be wrong: stop it (run_arm
        retries once the port is free)."""
        pods = self.kube.get(
            f"/api/v1/namespaces/{self.ns}/pods",
            labelSelector=f"etj.dev/job={self.name},etj.dev/role={ROLE_RENDEZVOUS}",
        )
        for pod in pods.get("items") or []:
            self.store_ip = (pod.get("status") or {}).get("podIP") or self.store_ip
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                if cs.get("restartCount"):
                    raise StoreTaken(
                        f"the rendezvous store {pod['metadata']['name']} restarted: port 29400 taken?"
                    )

    def wanted_spot(self) -> int:
        t = self.now() - self.trace_t0 if self.trace_t0 is not None else 0.0
        count = 0
        for step in self.steps:
            if step.t_s > t:
                break
            count = step.spot
        return count

    def follow_trace(self) -> None:
        now = time.monotonic()
        for node, at in list(self.notices.items()):
            drained = node not in self.worker_nodes().values()
            if drained or now - at > self.notice_s:
                self.remove_node(node)
                del self.notices[node]
                self.event(f"{node} terminated ({'after the drain' if drained else 'notice expired'})")
        want = self.wanted_spot()
        while len(self.spot_live) < want:
            self.serial += 1
            name = f"{self.instance}-spot-{self.serial}"
            self.add_node(name, SPOT)
            self.event(f"spot capacity: {name} (trace: {want})")
        while len(self.spot_live) > want:
            victim = self.spot_live.pop()  # newest first
            self.interrupt(victim)
            self.notices[victim] = now
            self.event(f"interruption notice on {victim} (taint {SPOT_ITN}, cordon; trace: {want})")
        if self.provisioner is not None:
            self.autoscale()
        offered = (self.now(), len(self.spot_live), self.arm.on_demand + len(self.od_auto))
        if not self.log.offered or self.log.offered[-1][1:] != offered[1:]:
            self.log.offered.append(offered)

    def autoscale(self) -> None:
        """The stand-in autoscaler (bench/economics/provisioner.py) on this poll's pods and nodes."""
        assert self.provisioner is not None
        pods = self.kube.get(
            f"/api/v1/namespaces/{self.ns}/pods", labelSelector=f"etj.dev/job={self.name},etj.dev/role=worker"
        )
        live = [p for p in pods.get("items") or [] if not p["metadata"].get("deletionTimestamp")]
        pending = sum(
            1
            for p in live
            if (p["metadata"].get("labels") or {}).get(LABEL_CAPACITY) == ON_DEMAND
            and not p["spec"].get("nodeName")
        )
        bound = {p["spec"].get("nodeName") for p in pods.get("items") or []}
        scaling = self.provisioner.step(self.now(), pending, {n: n in bound for n in self.od_auto})
        for _ in range(scaling.launch):
            self.od_serial += 1
            name = f"{self.instance}-od-{self.od_serial}"
            self.add_node(name, ON_DEMAND)
            self.od_auto.append(name)
            self.event(
                f"on-demand capacity: {name} (autoscaler: {pending} pod(s) pinned to on-demand pending)"
            )
        for name in scaling.remove:
            self.od_auto.remove(name)
            self.remove_node(name)
            self.event(f"{name} removed (autoscaler: empty)")


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


def arm_specs(trace: Trace, on_demand: int, spot_nodes: int, arms: list[str]) -> list[ArmSpec]:
    peak = on_demand + spot_nodes
    local = scaled(trace, spot_nodes)
    table = {
        "etj": ArmSpec("etj", 1, peak, on_demand, local),
        # A fixed-size job on spot: as many workers as spot nodes at the peak, spot only.
        "ckpt_restart": ArmSpec(
            "ckpt_restart", spot_nodes, spot_nodes, 0, local, worker_types=(SPOT,), store_node=True
        ),
        "on_demand": ArmSpec("on_demand", peak, peak, peak, None),
        # Spot only to start with; on-demand only as the deadline policy asks (the stand-in autoscaler).
        DEADLINE_ARM: ArmSpec(DEADLINE_ARM, 1, peak, 0, local, store_node=True, deadline=True),
    }
    return [table[a] for a in arms]


def job_manifest(
    base: JSON, arm: ArmSpec, epochs: int, deadline_s: float | None = None, rank_rate: float = 0.0
) -> JSON:
    job = copy.deepcopy(base)
    spec = job["spec"]
    spec["training"]["epochs"] = epochs
    spec["replicas"].update({"min": arm.replicas_min, "max": arm.replicas_max})
    spec.setdefault("placement", {})["capacityTypes"] = list(arm.worker_types)
    if arm.deadline:
        if deadline_s is None:
            raise ValueError(f"arm {arm.name}: no deadline (--deadline-seconds, or the on_demand arm first)")
        spec["deadline"] = {
            "withinSeconds": max(60, round(deadline_s)),
            "maxOnDemandWorkers": arm.replicas_max,
        }
    if rank_rate > 0:  # every arm: the same job
        env = spec["trainer"].setdefault("env", [])
        env.append({"name": "ETJ_RANK_SAMPLES_PER_SECOND", "value": str(rank_rate)})
    return job


def operator_args(arm: ArmSpec, args: argparse.Namespace) -> tuple[str, ...]:
    """The deadline policy's costs, sized for the bed (its start-ups and resizes, its poll)."""
    if not arm.deadline:
        return ()
    return (
        "--resync-seconds",
        str(args.od_resync),
        "--on-demand-startup-seconds",
        str(args.od_startup),
        "--resize-seconds",
        str(args.resize_cost),
    )


def run_arm(
    kubeconfig: Path,
    arm: ArmSpec,
    args: argparse.Namespace,
    run_dir: Path,
    base: JSON,
    deadline_s: float | None = None,
) -> JSON:
    script = Script(interrupt_epoch=10**6, timeout_s=args.arm_timeout)
    instance = f"rp{arm.name.replace('_', '')[:6]}"
    for attempt in range(1, args.attempts + 1):
        demo = ReplayDemo(
            kubeconfig,
            f"etj-replay-{arm.name.replace('_', '-')}",
            run_dir / (arm.name if attempt == 1 else f"{arm.name}-{attempt}"),
            job_manifest(base, arm, args.epochs, deadline_s, args.rank_rate),
            script,
            instance,
            arm=arm,
            time_scale=args.time_scale,
            notice_s=args.notice,
            trace_from=args.trace_from,
            provisioner=OnDemandProvisioner(args.od_delay, args.od_idle) if arm.deadline else None,
        )
        demo.operator_args = operator_args(arm, args)
        print(
            f"replay: arm {arm.name} ({arm.replicas_min}-{arm.replicas_max} workers), attempt {attempt}",
            file=sys.stderr,
        )
        try:
            demo.start()
            result = demo.run()
        except StoreTaken as e:
            print(f"replay: arm {arm.name} abandoned: {e}", file=sys.stderr)
            continue
        except RuntimeError as e:  # set-up hiccups (a CRD not Established yet): start over
            print(f"replay: arm {arm.name} failed: {e}", file=sys.stderr)
            if attempt == args.attempts:
                raise
            continue
        finally:
            demo.cleanup(delete_job=True)
        out = summarize(arm, result, demo.log, args, demo.phases)
        out["workers_by_capacity"] = [list(b) for b in demo.by_capacity]
        if arm.deadline:
            out["deadline"] = deadline_outcome(result.status, out["training_s"], deadline_s, demo.by_capacity)
        out["attempt"] = attempt
        return out
    raise RuntimeError(f"arm {arm.name}: another job kept taking port 29400 ({args.attempts} attempts)")


def summarize(
    arm: ArmSpec, result: DemoResult, log: CapacityLog, args: argparse.Namespace, phases: list[str | None]
) -> JSON:
    from bench.chaos import check_samples

    from etj_testbed.demo.view import logged_accuracy

    status = result.status.get("status") or {}
    finished = result.phase == "Succeeded"
    end = result.samples[-1]["t"] if result.samples else 0.0
    prices = Prices(args.price_spot, args.price_on_demand)
    seconds = node_seconds(log.spans, end)
    phases = phases + [None] * (len(result.samples) - len(phases))
    polls = [
        Poll(s["t"], int(s["world"] or 0), s["step"], waiting=phase == "Pending")
        for s, phase in zip(result.samples, phases, strict=False)
    ]
    gp = goodput(polls, arm.replicas_min, end)
    accuracy = (status.get("progress") or {}).get("accuracy")
    if accuracy is None:
        accuracy = logged_accuracy(result.run_dir)
    samples = check_samples(result.run_dir, args.epochs) if finished else None
    return {
        "arm": arm.name,
        "replicas": [arm.replicas_min, arm.replicas_max],
        "finished": finished,
        "phase": result.phase,
        "wall_s": round(end, 1),
        "trace_hours": round(end * args.time_scale / 3600, 3),
        "node_seconds": {k: round(v, 1) for k, v in seconds.items()},
        "node_hours_trace": {k: round(v * args.time_scale / 3600, 3) for k, v in seconds.items()},
        "cost_usd": round(cost(seconds, prices, args.time_scale), 3),
        **gp.as_json(),
        "accuracy": accuracy,
        "training_s": training_s(result.status),
        "exactly_once": None if samples is None else samples["ok"],
        "sample_problems": None if samples is None else samples["problems"],
        "resizes": [
            {k: r.get(k) for k in ("from", "to", "reason", "pauseSeconds", "stepsLost")}
            for r in status.get("resizeHistory") or []
        ],
        "failures": status.get("failures"),
        "run_dir": str(result.run_dir),
        "events": [{"t": round(t, 1), "what": w} for t, w in result.events],
        # For the plot: the poll series, the capacity offered and the accumulated cost.
        "series": {
            "t": [round(s["t"], 1) for s in result.samples],
            "world": [s["world"] for s in result.samples],
            "step": [s["step"] for s in result.samples],
            "phase": phases[: len(result.samples)],
            "sps": [s["sps"] for s in result.samples],
            "cost": [
                round(c, 4)
                for c in cost_curve(log.spans, [s["t"] for s in result.samples], prices, args.time_scale)
            ],
            "offered": [list(o) for o in log.offered],
        },
    }


def training_s(job: JSON) -> float | None:
    """status.startTime (the first worker trains) to completionTime: what spec.deadline.withinSeconds
    counts."""
    st = job.get("status") or {}
    start, end = parse_time(st.get("startTime")), parse_time(st.get("completionTime"))
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 1)


def deadline_outcome(
    job: JSON, took: float | None, deadline_s: float | None, by_capacity: list[tuple[float, int, int]]
) -> JSON:
    """Was the deadline met (``took``: the arm's training_s); what the policy last said; how many
    on-demand workers there were at most."""
    st = job.get("status") or {}
    return {
        "within_s": deadline_s,
        "training_s": took,
        "met": took is not None and deadline_s is not None and took <= deadline_s,
        "schedule": st.get("schedule"),
        "cost": st.get("cost"),
        "most_on_demand_workers": max((od for _, _, od in by_capacity), default=0),
        "on_demand_reasons": [
            r.get("reason") for r in st.get("resizeHistory") or [] if "OnDemand" in str(r.get("reason"))
        ],
    }


def ratios(arms: dict[str, JSON]) -> JSON:
    out: JSON = {}
    pairs = [("etj", b) for b in ("on_demand", "ckpt_restart")] + [(DEADLINE_ARM, "on_demand")]
    for name, base in pairs:
        etj, other = arms.get(name), arms.get(base)
        if etj is None or other is None:
            continue
        out[f"{name}_vs_{base}"] = {
            "cost": round(etj["cost_usd"] / other["cost_usd"], 3) if other["cost_usd"] else None,
            "time": round(etj["wall_s"] / other["wall_s"], 3) if other["wall_s"] else None,
            # An unfinished baseline's time and cost are lower bounds: the ratios are then upper bounds.
            "baseline_finished": other["finished"],
        }
    return out


def table(arms: dict[str, JSON]) -> list[JSON]:
    keys = ("arm", "finished", "wall_s", "trace_hours", "cost_usd", "goodput", "accuracy", "exactly_once")
    return [{k: a[k] for k in keys} for a in arms.values()]


def write_plot(report: JSON, path: Path) -> Path:
    """Capacity offered and world size, throughput, accumulated cost, per arm, against time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = report["arms"]
    fig, axes = plt.subplots(3, 1, sharex=True, figsize=(10, 7.5))
    colors = {
        "etj": "tab:blue",
        "ckpt_restart": "tab:orange",
        "on_demand": "tab:green",
        DEADLINE_ARM: "tab:red",
    }
    etj = arms.get("etj") or next(iter(arms.values()))
    offered = etj["series"]["offered"]
    if offered:
        t_end = max(a["wall_s"] for a in arms.values())
        xs = [o[0] for o in offered] + [t_end]
        total = [o[1] + o[2] for o in offered]
        axes[0].fill_between(
            xs,
            [*total, total[-1]],
            step="post",
            alpha=0.15,
            color="grey",
            label="nodes offered (spot + on-demand)",
        )
        od = [o[2] for o in offered]
        axes[0].fill_between(
            xs, [*od, od[-1]], step="post", alpha=0.25, color="tab:green", label="on-demand floor"
        )
    for name, arm in arms.items():
        s = arm["series"]
        axes[0].plot(
            s["t"], s["world"], drawstyle="steps-post", color=colors.get(name), label=f"world size: {name}"
        )
        pts = [(t, v) for t, v in zip(s["t"], s["sps"], strict=True) if v is not None]
        if pts:
            axes[1].plot(*zip(*pts, strict=True), color=colors.get(name), label=name)
        axes[2].plot(s["t"], s["cost"], color=colors.get(name), label=f"{name}: ${arm['cost_usd']:.2f}")
    axes[0].set_ylabel("nodes / workers")
    axes[1].set_ylabel("samples/s")
    axes[2].set_ylabel("cost so far (USD)")
    axes[2].set_xlabel(f"seconds since submission (1 s = {report['time_scale']:g} s of trace time)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"spot replay: {report['trace']} from tick {report['start_tick']}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("trace", help="a trace file, or its name in the traces directory")
    p.add_argument("--traces", type=Path, help="the traces directory (default: ../shared/spot-traces)")
    p.add_argument(
        "--time-scale",
        type=float,
        default=60.0,
        help="trace seconds per bed second (60: a 5-min tick is 5 s)",
    )
    p.add_argument("--on-demand", type=int, default=1, help="on-demand nodes beside the spot ones")
    p.add_argument(
        "--spot-nodes", type=int, default=3, help="spot nodes at the trace's peak (counts are scaled)"
    )
    p.add_argument("--price-spot", type=float, default=PRICE_SPOT, help="USD per node-hour")
    p.add_argument("--price-on-demand", type=float, default=PRICE_ON_DEMAND, help="USD per node-hour")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument(
        "--start", default="busiest", help="first tick, or 'busiest': the window with most changes"
    )
    p.add_argument("--window", type=int, default=60, help="ticks in the window --start=busiest looks at")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument(
        "--notice", type=float, default=NOTICE_S, help="seconds (bed clock) before an interrupted node goes"
    )
    p.add_argument("--arm-timeout", type=float, default=480.0, help="give an arm up after this many seconds")
    p.add_argument(
        "--deadline-factor",
        type=float,
        default=1.5,
        help="etj_deadline: the deadline, times the on_demand arm's training time (run before it)",
    )
    p.add_argument("--deadline-seconds", type=float, help="etj_deadline: the deadline itself (bed seconds)")
    p.add_argument("--od-delay", type=float, default=3.0, help="stand-in autoscaler: a node's start-up (s)")
    p.add_argument("--od-idle", type=float, default=5.0, help="stand-in autoscaler: an empty node goes (s)")
    p.add_argument(
        "--od-startup", type=float, default=30.0, help="deadline policy: on-demand start-up it expects (s)"
    )
    p.add_argument("--resize-cost", type=float, default=5.0, help="deadline policy: a resize's stall (s)")
    p.add_argument("--od-resync", type=float, default=5.0, help="deadline policy: the operator's resync (s)")
    p.add_argument(
        "--rank-rate",
        type=float,
        default=0.0,
        help="ETJ_RANK_SAMPLES_PER_SECOND for every arm: throughput grows with the world (0: off)",
    )
    p.add_argument(
        "--trace-from",
        choices=("submit", "first-step"),
        default="submit",
        help="the trace's clock starts at submission, or at the job's first step",
    )
    p.add_argument(
        "--attempts", type=int, default=3, help="tries per arm when another job takes the store port"
    )
    p.add_argument("--manifest", type=Path, default=REPO / "examples" / "demo-cpu.yaml")
    p.add_argument("--run-dir", type=Path)
    p.add_argument("--out", type=Path, help="write the JSON here too")
    p.add_argument("--plot", type=Path, help="timeline PNG (default: <run dir>/timeline.png)")
    p.add_argument("--keep-cluster", action="store_true")
    return p.parse_args(argv)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def replay(kubeconfig: Path, args: argparse.Namespace, run_dir: Path) -> JSON:
    """Every arm on the cluster at ``kubeconfig``, one after the other; the report (also to ``--out``)."""
    trace = resolve_trace(args.trace, args.traces)
    start = busiest_window(trace.counts, args.window) if args.start == "busiest" else int(args.start)
    windowed = trace.window(start)
    names = [a for a in args.arms.split(",") if a]
    if DEADLINE_ARM in names and args.deadline_seconds is None:
        if "on_demand" not in names:
            raise SystemExit(f"{DEADLINE_ARM}: give --deadline-seconds, or run the on_demand arm too")
        # The deadline is a multiple of the on-demand arm's time: run that one first.
        names.sort(key=lambda n: n != "on_demand")
    arms = arm_specs(windowed, args.on_demand, args.spot_nodes, names)
    base = yaml.safe_load(args.manifest.read_text())
    print(
        f"replay: {trace.name} from tick {start}, x{args.time_scale:g}, run directory {run_dir}",
        file=sys.stderr,
    )
    t0 = time.monotonic()
    results: dict[str, JSON] = {}
    for arm in arms:
        deadline_s = args.deadline_seconds
        if arm.deadline and deadline_s is None:
            deadline_s = args.deadline_factor * (
                results["on_demand"]["training_s"] or results["on_demand"]["wall_s"]
            )
        results[arm.name] = run_arm(kubeconfig, arm, args, run_dir, base, deadline_s)
    report: JSON = {
        "trace": trace.name,
        "start_tick": start,
        "time_scale": args.time_scale,
        "on_demand_nodes": args.on_demand,
        "spot_nodes_at_peak": args.spot_nodes,
        "spot_counts_replayed": list(scaled(windowed, args.spot_nodes).counts[:40]),
        "prices_usd_per_node_hour": {"spot": args.price_spot, "on_demand": args.price_on_demand},
        "epochs": args.epochs,
        "table": table(results),
        "ratios": ratios(results),
        "arms": results,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    report["plot"] = str(write_plot(report, args.plot or run_dir / "timeline.png"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    os.environ.setdefault("ETJ_CLUSTER_NAME", "replay")
    os.environ.setdefault("ETJ_CLUSTER_PORT_BASE", "18600")
    from etj_testbed.localcluster import toolchain
    from etj_testbed.localcluster.cluster import LocalCluster

    run_dir = args.run_dir or toolchain.cache_root() / "replay" / time.strftime("%Y%m%d-%H%M%S")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    cluster = LocalCluster.named()
    try:
        report = replay(cluster.up(), args, run_dir)
    except KeyboardInterrupt:
        print("\ninterrupted: cleaning up", file=sys.stderr)
        return 130
    finally:
        if not args.keep_cluster:
            cluster.down()
    print(json.dumps(report, indent=2))
    arms = report["arms"].values()
    ok = all(a["finished"] and a["exactly_once"] for a in arms if a["arm"] != "ckpt_restart")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The job model and the simulator (pure): a training job on a spot capacity trace, three ways.

- ``etj``: elastic, world = on-demand floor + spot nodes ready (capped at ``max_nodes``); a node lost
  costs the survivors a graceful-leave stall (the interruption notice lets the leaver drain; nothing is
  lost), a node gained a join stall once it is ready; with no node at all the job waits and resumes from
  its just-in-time checkpoint;
- ``ckpt_restart``: a fixed world of ``n`` spot nodes (no on-demand floor) that trains only while ``n``
  are ready; when one goes the job stops and loses what it trained since its last periodic checkpoint;
  when ``n`` are ready again it restarts (``restart_s``) from that checkpoint — a plain
  ``torchrun --nnodes=n`` job on spot;
- ``on_demand``: ``n`` on-demand nodes, never interrupted.

Time advances by trace tick (``gap_s``, 5 min); inside a tick at most two phases: before and after the
tick's new nodes are ready (``node_ready_s`` after they appear). Every node the trace offers (up to the
job's size) and the floor are billed while the job runs: the cluster holds them for the job, as the
real-bed replay does and as a Kubernetes job whose pods wait for their missing peers does; the spot
node-seconds billed while the fixed-size job waits are also reported apart (``idle_cost_usd``: what a
job that gives its nodes back while it waits, as a managed-spot launcher does, would not pay).
Badput names follow ml-goodput-measurement (see accounting.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.economics.accounting import (
    INFRA_RECOVERY,
    PROGRAM_STARTUP,
    SCALE_UP,
    SLICE_DOWN,
    TRAINING_PREP,
    WASTED,
    Prices,
)
from bench.economics.traces import Trace


@dataclass(frozen=True)
class JobModel:
    """What one training run needs and how fast it goes. Every field's source is in docs/economics.md."""

    samples: float  # samples to train (epochs x dataset)
    node_throughput: float  # samples/s of one node alone
    scaling_efficiency: float  # per-node throughput factor when more than one node trains
    startup_s: float  # submission -> first step (pods, processes, data pipeline)
    leave_stall_s: float  # etj: survivors' stall when a node leaves gracefully
    join_stall_s: float  # etj: stall when a ready node joins (and to resume from nothing)
    node_ready_s: float  # a node the trace adds -> its worker ready to join
    restart_s: float  # fixed-size job: restart -> first step again (launch, rendezvous, restore)
    checkpoint_every_s: float  # fixed-size job: training seconds between its periodic checkpoints

    def throughput(self, nodes: int) -> float:
        if nodes <= 0:
            return 0.0
        return self.node_throughput * nodes * (1.0 if nodes == 1 else self.scaling_efficiency)


@dataclass(frozen=True)
class Cluster:
    floor: int  # on-demand nodes, there throughout
    max_spot: int  # spot nodes the job asks for (the trace is scaled to this)
    prices: Prices  # USD per node-hour

    @property
    def peak(self) -> int:
        return self.floor + self.max_spot


@dataclass
class Outcome:
    policy: str
    nodes: int  # the fixed size, or the elastic maximum
    finished: bool
    time_s: float
    productive_s: float
    badput_s: dict[str, float] = field(default_factory=dict)
    node_s: dict[str, float] = field(default_factory=lambda: {"spot": 0.0, "on-demand": 0.0})
    cost_usd: float = 0.0
    interruptions: int = 0
    idle_spot_s: float = 0.0  # spot node-seconds billed while the job could not train (waiting)
    idle_cost_usd: float = 0.0  # their cost: what a job that releases its nodes while it waits saves

    @property
    def goodput(self) -> float:
        return self.productive_s / self.time_s if self.time_s else 0.0


class _Run:
    """Bookkeeping shared by the policies: time, progress, badput, billing."""

    def __init__(self, policy: str, nodes: int, job: JobModel, cluster: Cluster) -> None:
        self.job, self.cluster = job, cluster
        self.out = Outcome(
            policy,
            nodes,
            False,
            0.0,
            0.0,
            dict.fromkeys(
                (PROGRAM_STARTUP, SLICE_DOWN, SCALE_UP, INFRA_RECOVERY, TRAINING_PREP, WASTED), 0.0
            ),
        )
        self.done = 0.0  # samples trained (and kept)
        self.stall = job.startup_s  # seconds of stall still to serve before steps run
        self.stall_cause = PROGRAM_STARTUP

    def bill(self, seconds: float, spot: int, on_demand: int, idle: bool = False) -> None:
        self.out.node_s["spot"] += spot * seconds
        self.out.node_s["on-demand"] += on_demand * seconds
        if idle:
            self.out.idle_spot_s += spot * seconds

    def train(self, seconds: float, world: int) -> float:
        """Serve the stall, then train at ``world`` nodes; return the seconds used (less than ``seconds``
        when the job finishes inside)."""
        served = min(seconds, self.stall)
        self.stall -= served
        self.out.badput_s[self.stall_cause] += served
        left = seconds - served
        rate = self.job.throughput(world)
        need = (self.job.samples - self.done) / rate if rate else float("inf")
        if need <= left:
            self.done = self.job.samples
            self.out.productive_s += need
            self.out.finished = True
            return served + need
        self.done += rate * left
        self.out.productive_s += left
        return seconds

    def wait(self, seconds: float) -> None:
        self.out.badput_s[INFRA_RECOVERY] += seconds

    def finish(self) -> Outcome:
        prices = self.cluster.prices
        self.out.cost_usd = (
            self.out.node_s["spot"] * prices.spot + self.out.node_s["on-demand"] * prices.on_demand
        ) / 3600.0
        self.out.idle_cost_usd = self.out.idle_spot_s * prices.spot / 3600.0
        return self.out


def _phases(trace: Trace, start: int, ready_s: float, horizon_ticks: int):  # type: ignore[no-untyped-def]
    """(seconds, spot nodes offered, spot nodes ready) per phase from tick ``start`` on: a tick whose
    count grew has the old count ready for ``ready_s``, then the new one."""
    n = len(trace.counts)
    gap = trace.gap_s
    ready_s = min(ready_s, gap)
    previous = trace.counts[start % n]  # the first tick's nodes were there before the job (ready)
    for i in range(horizon_ticks):
        count = trace.counts[(start + i) % n]
        if count > previous and ready_s > 0:
            yield ready_s, count, previous
            if gap - ready_s > 0:
                yield gap - ready_s, count, count
        else:
            yield gap, count, count
        previous = count


def simulate_etj(trace: Trace, start: int, job: JobModel, cluster: Cluster, horizon_ticks: int) -> Outcome:
    run = _Run("etj", cluster.peak, job, cluster)
    world = -1
    for seconds, offered, ready in _phases(trace, start, job.node_ready_s, horizon_ticks):
        new = cluster.floor + min(ready, cluster.max_spot)
        if world >= 0 and new != world:
            if new == 0:
                pass
            elif world == 0:  # resumes from its just-in-time checkpoint
                run.stall, run.stall_cause = run.stall + job.join_stall_s, TRAINING_PREP
            elif new < world:
                run.out.interruptions += 1
                run.stall, run.stall_cause = run.stall + job.leave_stall_s, SLICE_DOWN
            else:
                run.stall, run.stall_cause = run.stall + job.join_stall_s, SCALE_UP
        world = new
        if world == 0:
            run.wait(seconds)
            used = seconds
        else:
            used = run.train(seconds, world)
        run.bill(used, min(offered, cluster.max_spot), cluster.floor)
        run.out.time_s += used
        if run.out.finished:
            break
    return run.finish()


def simulate_ckpt_restart(
    trace: Trace, start: int, job: JobModel, cluster: Cluster, nodes: int, horizon_ticks: int
) -> Outcome:
    run = _Run("ckpt_restart", nodes, job, cluster)
    running = False
    kept = 0.0  # samples in the last periodic checkpoint
    since_ckpt = 0.0  # training seconds since it
    started = False
    for seconds, offered, ready in _phases(trace, start, job.node_ready_s, horizon_ticks):
        enough = min(ready, cluster.max_spot) >= nodes
        if running and not enough:  # a node is gone: stop, fall back to the last checkpoint
            run.out.interruptions += 1
            lost = run.done - kept
            rate = job.throughput(nodes)
            run.out.productive_s -= lost / rate
            run.out.badput_s[WASTED] += lost / rate
            run.done, since_ckpt, running = kept, 0.0, False
            run.stall = 0.0
        if enough and not running:
            running = True
            if started:
                run.stall, run.stall_cause = job.restart_s, TRAINING_PREP
            started = True
        if running:
            before = run.out.productive_s
            used = run.train(seconds, nodes)
            trained = run.out.productive_s - before
            since_ckpt += trained
            if job.checkpoint_every_s > 0 and since_ckpt >= job.checkpoint_every_s:
                # The checkpoints inside this phase: the last one holds progress up to it.
                extra = since_ckpt % job.checkpoint_every_s
                kept = run.done - extra * job.throughput(nodes)
                since_ckpt = extra
        else:
            run.wait(seconds)
            used = seconds
        run.bill(used, min(offered, nodes), 0, idle=not running)
        run.out.time_s += used
        if run.out.finished:
            break
    return run.finish()


def simulate_on_demand(job: JobModel, cluster: Cluster, nodes: int) -> Outcome:
    run = _Run("on_demand", nodes, job, cluster)
    used = run.train(float("inf"), nodes)
    run.bill(used, 0, nodes)
    run.out.time_s = used
    return run.finish()

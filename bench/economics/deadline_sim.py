"""Deadline arms of the simulator (pure): a job that must finish by a deadline, on a spot trace.

- ``deadline``: etj with spec.deadline. Spot workers as the trace offers them (up to ``max_spot``), plus
  the on-demand workers the operator's own policy asks for (``etj_operator.decide.deadline.decide``, the
  function the planner calls), looked at every ``interval_s``; an on-demand node asked for mid-run trains
  ``node_ready_s`` later, and only into room next to the spot workers training (the planner never drains a
  running spot worker for one); on-demand leaves first when spot returns.
- ``up_whole``: Uniform Progress as "Can't Be Late" applies it, to the whole job: all of it on a fixed
  spot cluster (``max_spot`` nodes, checkpoint-restart: trains only with all of them) while it is ahead of
  the straight line to the deadline, all of it on the on-demand cluster (``peak`` nodes) while behind, and on
  on-demand for good once waiting longer could miss the deadline. A switch costs a restart (and, to
  on-demand, the nodes' start-up); a spot preemption loses the work since the last checkpoint.

Time advances in steps of ``interval_s``, inside the trace's 5-minute ticks. Billing: every node the job
holds (on-demand from the moment it is asked for, spot while the job uses or waits for it).
Initial on-demand nodes are ready at submission, as the on-demand baseline's are (``startup_s`` covers both).
Both arms draw their straight line from the first step (``startup_s`` after submission: the operator's
status.startTime) to the deadline, which is counted from submission.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.economics.accounting import SCALE_UP, SLICE_DOWN, TRAINING_PREP, WASTED
from bench.economics.simulate import Cluster, JobModel, Outcome, _Run
from bench.economics.traces import Trace

from etj_operator.decide.deadline.policy import DeadlineInputs, Throughput, decide


@dataclass(frozen=True)
class DeadlineJob:
    deadline_s: float  # from submission
    max_on_demand: int  # spec.deadline.maxOnDemandWorkers
    interval_s: float = 30.0  # the operator's resync: the policy looks this often


def spot_ready(trace: Trace, start: int, t_s: float, ready_s: float) -> tuple[int, int]:
    """(offered, ready) spot nodes ``t_s`` after tick ``start``: nodes new in a tick are ready ``ready_s``
    into it (the first tick's were there before the job)."""
    n = len(trace.counts)
    tick = int(t_s // trace.gap_s)
    offered = trace.counts[(start + tick) % n]
    if tick == 0:
        return offered, offered
    before = trace.counts[(start + tick - 1) % n]
    if offered > before and t_s - tick * trace.gap_s < ready_s:
        return offered, before
    return offered, offered


def _rate(job: JobModel) -> Throughput:
    return Throughput(per_worker=job.node_throughput, efficiency=job.scaling_efficiency)


def _restall(run: _Run, old: int, new: int, job: JobModel) -> None:
    """A world change costs the survivors a stall (the same costs as simulate_etj)."""
    if old < 0 or new == old or new == 0:
        return
    if old == 0:
        run.stall, run.stall_cause = run.stall + job.join_stall_s, TRAINING_PREP
    elif new < old:
        run.stall, run.stall_cause = run.stall + job.leave_stall_s, SLICE_DOWN
    else:
        run.stall, run.stall_cause = run.stall + job.join_stall_s, SCALE_UP


def simulate_deadline(
    trace: Trace, start: int, job: JobModel, cluster: Cluster, spec: DeadlineJob, horizon_s: float
) -> Outcome:
    run = _Run("deadline", cluster.peak, job, cluster)
    rate = _rate(job)
    dt = spec.interval_s
    ready_od = 0
    pending: list[float] = []  # when each asked-for on-demand node trains
    world, t, last_spot = -1, 0.0, 0
    while t < horizon_s and not run.out.finished:
        offered, ready = spot_ready(trace, start, t, job.node_ready_s)
        ready_od += sum(1 for at in pending if at <= t)
        pending = [at for at in pending if at > t]
        spot = min(ready, cluster.max_spot)
        choice = decide(
            DeadlineInputs(
                samples_done=run.done,
                samples_total=job.samples,
                elapsed_s=max(0.0, t - job.startup_s),
                time_left_s=spec.deadline_s - t,
                spot=spot,
                on_demand=ready_od + len(pending),
                max_workers=cluster.peak,
                max_on_demand=spec.max_on_demand,
                rate=rate,
                resize_s=max(job.join_stall_s, job.leave_stall_s),
                on_demand_startup_s=job.node_ready_s,
                decision_interval_s=dt,
                stall_s=run.stall,
            )
        )
        # As the planner: new on-demand workers only where the world has room next to the spot workers
        # training now (it never drains a running spot worker for one; replicas.max bounds the pods).
        target = min(choice.on_demand, max(ready_od + len(pending), cluster.peak - spot))
        want = target - ready_od - len(pending)
        if want > 0:
            # At submission the nodes come with the job (as the on-demand baseline's); later they start up.
            pending += [t + (0.0 if t == 0 else job.node_ready_s)] * want
            ready_od += sum(1 for at in pending if at <= t)
            pending = [at for at in pending if at > t]
        elif want < 0:
            cancel = min(-want, len(pending))  # not yet started: cancel those first
            pending = pending[: len(pending) - cancel]
            ready_od -= -want - cancel
        new = min(cluster.peak, spot + ready_od)
        _restall(run, world, new, job)
        if spot < last_spot:
            run.out.interruptions += 1
        world, last_spot = new, spot
        step = min(dt, trace.gap_s - t % trace.gap_s)  # never straddle a tick: capacity changes there
        used = run.train(step, world) if world > 0 else step
        if world == 0:
            run.wait(step)
        spot_held = min(offered, cluster.max_spot, max(0, cluster.peak - ready_od))
        run.bill(used, spot_held, ready_od + len(pending))
        run.out.time_s += used
        t += used
    return run.finish()


def simulate_up_whole(
    trace: Trace, start: int, job: JobModel, cluster: Cluster, spec: DeadlineJob, horizon_s: float
) -> Outcome:
    """Uniform Progress on the whole job: a fixed spot cluster or the on-demand cluster, never both."""
    run = _Run("up_whole", cluster.peak, job, cluster)
    n_spot, n_od = cluster.max_spot, cluster.peak
    mode = "spot"
    kept, since_ckpt, running = 0.0, 0.0, False
    switch_cost = job.node_ready_s + job.restart_s
    t = 0.0
    while t < horizon_s and not run.out.finished:
        offered, ready = spot_ready(trace, start, t, job.node_ready_s)
        left = job.samples - run.done
        time_left = spec.deadline_s - t
        # The straight line starts at the first step (status.startTime), as the deadline arm's does.
        begun = max(0.0, t - job.startup_s)
        slack = run.done / job.samples * (spec.deadline_s - job.startup_s) - begun
        must = left / job.throughput(n_od) + switch_cost + spec.interval_s >= time_left
        if t == 0 and must:
            mode, running = "on-demand", True  # too tight for spot from the start: no switch to pay for
        elif mode == "spot" and (must or slack < 0):
            mode, running = "on-demand", True
            run.stall, run.stall_cause = run.stall + switch_cost, TRAINING_PREP  # checkpoint, then restart
            kept = run.done
        elif mode == "on-demand" and not must and slack > job.restart_s and ready >= n_spot:
            mode, running = "spot", True  # ahead by more than the restart the switch costs: back to spot
            run.stall, run.stall_cause = run.stall + job.restart_s, TRAINING_PREP
            kept, since_ckpt = run.done, 0.0
        step = min(spec.interval_s, trace.gap_s - t % trace.gap_s)
        if mode == "on-demand":
            used = run.train(step, n_od)
            run.bill(used, 0, n_od)
        else:
            enough = ready >= n_spot
            if running and not enough:  # preempted: back to the last checkpoint
                run.out.interruptions += 1
                lost = run.done - kept
                run.out.productive_s -= lost / job.throughput(n_spot)
                run.out.badput_s[WASTED] += lost / job.throughput(n_spot)
                run.done, since_ckpt, running, run.stall = kept, 0.0, False, 0.0
            if enough and not running:
                running = True
                if t > 0:
                    run.stall, run.stall_cause = job.restart_s, TRAINING_PREP
            if running:
                before = run.out.productive_s
                used = run.train(step, n_spot)
                since_ckpt += run.out.productive_s - before
                if job.checkpoint_every_s > 0 and since_ckpt >= job.checkpoint_every_s:
                    since_ckpt %= job.checkpoint_every_s
                    kept = run.done - since_ckpt * job.throughput(n_spot)
            else:
                run.wait(step)
                used = step
            run.bill(used, min(offered, n_spot), 0, idle=not running)
        run.out.time_s += used
        t += used
    return run.finish()

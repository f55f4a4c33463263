"""The deadline policy (pure): how many on-demand workers a job needs now to finish by its deadline.

Uniform Progress ("Can't Be Late", Wu et al., NSDI'24) moves a single-node job between one spot and one
on-demand instance: on spot while it is ahead of the straight line from start to deadline, on on-demand
while it is behind, and on on-demand for good once waiting any longer could miss the deadline (the safety
net). etj can mix the two inside one world, so the policy here asks for a *number* of on-demand workers:

1. **Safety net, generalised.** If spot vanished now, the job must still finish in time: the on-demand
   workers it holds train while the rest of ``max_on_demand`` start up (an on-demand node's start-up and
   ``SAFETY_RESIZES`` resizes), then all of them, and the policy only looks again a decision interval
   later. The policy holds the fewest on-demand workers for which that is true, so on-demand ramps in
   step by step as the slack is used up, instead of the single switch a one-instance job has.
2. **Uniform Progress, generalised.** Ahead of the line: no on-demand (spot, or nothing, is the cheap way to
   spend the slack). Behind it: the fewest on-demand workers that, with the spot workers there now, train
   fast enough to finish by the deadline less the margin.
3. **On-demand leaves first, without thrash.** Surplus on-demand workers (spot has come back) are released,
   but only while the job is ahead of its line by more than the margin plus one resize: releasing and
   having to ask again must not cost the deadline. Adding workers must pay back its resize and start-up
   before the job would finish anyway; otherwise the job keeps its world.

No clocks, no Kubernetes: everything arrives in ``DeadlineInputs``; the operator and the simulator
(bench/economics/deadline_sim.py) call the same function.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Why(StrEnum):
    """Why the policy chose its number (status.schedule.reason, Kubernetes events)."""

    FINISHED = "Finished"
    NO_RATE = "NoRateMeasured"  # nothing to project from yet: keep what the job has
    ON_DEMAND_DISABLED = "OnDemandDisabled"  # maxOnDemandWorkers 0: the deadline is only reported
    AHEAD = "AheadOfSchedule"
    BEHIND = "BehindSchedule"
    SAFETY_NET = "SafetyNet"  # spot could no longer be waited for: on-demand covers the rest
    CANNOT_MEET = "DeadlineUnreachable"  # even every on-demand worker from now on is too late
    HOLD = "HoldToAvoidThrash"  # a change would not pay back its resize/start-up within the slack


# Resizes the safety net budgets for: spot rarely leaves at once (the traces drop in steps, 16 -> 2 -> 1 ->
# 0), and each loss costs a leave plus the join of the on-demand workers that answer it: three such pairs.
SAFETY_RESIZES = 6


@dataclass(frozen=True)
class Throughput:
    """Samples per second by world size (workers): measured where seen, else a per-worker model."""

    per_worker: float  # samples/s of one worker training alone
    efficiency: float = 1.0  # per-worker factor once more than one trains (communication)
    measured: Mapping[int, float] = field(default_factory=dict)  # world size -> samples/s, from reports

    def at(self, workers: int) -> float:
        if workers <= 0:
            return 0.0
        if workers in self.measured:
            return self.measured[workers]
        return self.per_worker * workers * (1.0 if workers == 1 else self.efficiency)


@dataclass(frozen=True)
class DeadlineInputs:
    samples_done: float
    samples_total: float
    elapsed_s: float  # since the job started (the straight line starts here)
    time_left_s: float  # until the deadline (negative: already past)
    spot: int  # spot workers the job has or can place now
    on_demand: int  # on-demand workers the job has now (running or starting)
    max_workers: int  # replicas.max
    max_on_demand: int  # the cap (deadline.maxOnDemandWorkers, at most replicas.max)
    rate: Throughput
    resize_s: float  # training stall of one resize
    on_demand_startup_s: float  # asking for an on-demand worker -> it trains (node start-up, pod, join)
    decision_interval_s: float = 30.0  # the policy looks again after this long (operator resync)
    stall_s: float = 0.0  # stall already in progress before steps run again (start-up, a resize)


@dataclass(frozen=True)
class DeadlineDecision:
    on_demand: int  # on-demand workers the job should have
    why: Why
    slack_s: float  # ahead (+) or behind (-) the straight line to the deadline, in seconds
    projected_finish_s: float  # from now, at the world the decision leaves the job with (inf: never)
    required_rate: float = 0.0  # samples/s needed to finish by the deadline less the margin


def margin_s(inp: DeadlineInputs) -> float:
    """Time the job must keep in hand: start one on-demand node, absorb one resize, wait for the next look."""
    return inp.on_demand_startup_s + inp.resize_s + inp.decision_interval_s


def line_slack_s(inp: DeadlineInputs) -> float:
    """Seconds ahead of the Uniform Progress line: where the job is, minus where the line is now."""
    horizon = inp.elapsed_s + inp.time_left_s
    if horizon <= 0 or inp.samples_total <= 0:
        return 0.0
    return inp.samples_done / inp.samples_total * horizon - inp.elapsed_s


def _world(inp: DeadlineInputs, on_demand: int) -> int:
    return min(inp.max_workers, inp.spot + on_demand)


def _finish_s(inp: DeadlineInputs, left: float, on_demand: int) -> float:
    rate = inp.rate.at(_world(inp, on_demand))
    return inp.stall_s + left / rate if rate > 0 else math.inf


def _fewest_on_demand(inp: DeadlineInputs, cap: int, rate_needed: float) -> int:
    """The smallest on-demand count whose world (with today's spot) trains at ``rate_needed``; cap if none."""
    for k in range(cap + 1):
        if inp.rate.at(_world(inp, k)) >= rate_needed:
            return k
    return cap


def _adding_pays(inp: DeadlineInputs, left: float, target: int) -> bool:
    """Do ``target - inp.on_demand`` more workers finish sooner, after their start-up and a resize, than the
    world the job has? Near the end of a job they do not, and asking for them only costs."""
    now = _finish_s(inp, left, inp.on_demand)
    before = inp.rate.at(_world(inp, inp.on_demand)) * inp.on_demand_startup_s
    after_rate = inp.rate.at(_world(inp, target))
    if after_rate <= 0:
        return False
    later = inp.on_demand_startup_s + inp.resize_s + max(0.0, left - before) / after_rate
    return later < now


def _finish_if_spot_vanished(inp: DeadlineInputs, left: float, keep: int, cap: int) -> float:
    """Seconds to finish if every spot worker went now: ``keep`` on-demand workers train until ``cap`` of
    them (asked for at once) have started and joined, then all ``cap`` do."""
    now_rate, full_rate = inp.rate.at(keep), inp.rate.at(cap)
    if full_rate <= 0:
        return math.inf
    if keep >= cap:
        return inp.stall_s + left / full_rate
    ramp = inp.on_demand_startup_s
    if now_rate > 0 and left <= now_rate * ramp:
        return inp.stall_s + left / now_rate
    return inp.stall_s + ramp + SAFETY_RESIZES * inp.resize_s + (left - now_rate * ramp) / full_rate


def _fewest_safe(inp: DeadlineInputs, left: float, cap: int, ahead_s: float = 0.0) -> int | None:
    """The safety net, generalised: the fewest on-demand workers to hold now so that, if spot vanished, the
    job still finishes by the deadline less ``ahead_s`` (adding the rest of the cap then). None: not even
    the cap does."""
    for k in range(cap + 1):
        if _finish_if_spot_vanished(inp, left, k, cap) + inp.decision_interval_s + ahead_s <= inp.time_left_s:
            return k
    return None


def decide(inp: DeadlineInputs) -> DeadlineDecision:
    left = max(0.0, inp.samples_total - inp.samples_done)
    slack = line_slack_s(inp)
    cap = max(0, min(inp.max_on_demand, inp.max_workers))
    # On-demand beyond what the world has room for next to today's spot is surplus: spot is cheaper.
    room = max(0, inp.max_workers - inp.spot)

    def out(k: int, why: Why, rate_needed: float = 0.0) -> DeadlineDecision:
        return DeadlineDecision(k, why, slack, _finish_s(inp, left, k), rate_needed)

    if left <= 0:
        # Every sample is trained, but the workers still validate, report and exit 0, and only a worker
        # exiting by itself finishes the job: draining them now would leave it waiting for replacements.
        return out(inp.on_demand, Why.FINISHED)
    if cap == 0:
        return out(0, Why.ON_DEMAND_DISABLED)
    if inp.rate.at(1) <= 0:
        return out(min(inp.on_demand, cap), Why.NO_RATE)

    # 1. The safety net: hold enough on-demand that losing all spot now would still not miss the deadline.
    safe = _fewest_safe(inp, left, cap)
    if safe is None:
        return out(cap, Why.CANNOT_MEET)
    if safe > inp.on_demand:
        # Growing one worker per look would cost a resize per look: ask at once for what stays safe for
        # one more start-up's time (or the cap), so additions come in few, larger steps.
        ahead = _fewest_safe(inp, left, cap, ahead_s=inp.on_demand_startup_s)
        safe = cap if ahead is None else ahead
    # 2. Uniform Progress: ahead of the line, spend the slack on spot (or waiting); behind, buy the rate.
    usable = inp.time_left_s - margin_s(inp) - inp.stall_s
    rate_needed = left / usable if usable > 0 else math.inf
    up = 0 if slack >= 0 else min(_fewest_on_demand(inp, cap, rate_needed), room)
    target = max(safe, up)
    why = Why.SAFETY_NET if safe > 0 and safe >= up else (Why.AHEAD if slack >= 0 else Why.BEHIND)

    # 3. No thrash: a release must leave enough slack to ask again; an addition must pay for itself.
    if target < inp.on_demand:
        # Those with no place in the world next to spot, and not needed for safety, go whatever the slack.
        useful = min(inp.on_demand, max(room, safe))
        if slack < margin_s(inp) + inp.resize_s and target < useful:
            return out(useful, Why.HOLD, rate_needed)
        return out(target, why, rate_needed)
    if target > inp.on_demand and target > safe and not _adding_pays(inp, left, target):
        return out(max(inp.on_demand, safe), Why.HOLD, rate_needed)
    return out(target, why, rate_needed)

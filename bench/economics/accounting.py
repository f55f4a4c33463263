"""Cost and goodput of one run, from what was observed (pure).

Vocabulary: Google's ml-goodput-measurement (`goodput_utils.BadputType`). Goodput is the share of the
elapsed time spent on productive training steps; the rest is badput, by cause:

- ``program_startup``: submission → first training step (pods scheduled, processes started, rendezvous);
- ``elastic_slice_down`` / ``elastic_scale_up``: the stall of an elastic resize (world smaller / larger);
- ``infrastructure_recovery_from_disruption``: the job cannot train, fewer workers than it needs (waiting
  for capacity to come back);
- ``training_prep``: a restart from a checkpoint once enough capacity is back (the world re-forms below
  nothing: the job had stopped);
- ``wasted_progress_from_disruption``: steps trained, lost, and trained again (a restart from an older
  checkpoint);
- ``other``: the rest (the final validation and checkpoint, slow steps beyond the ideal step time).
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

PRODUCTIVE = "productive"
PROGRAM_STARTUP = "program_startup"
SLICE_DOWN = "elastic_slice_down"
SCALE_UP = "elastic_scale_up"
INFRA_RECOVERY = "infrastructure_recovery_from_disruption"
TRAINING_PREP = "training_prep"
WASTED = "wasted_progress_from_disruption"
OTHER = "other"
BADPUT = (PROGRAM_STARTUP, SLICE_DOWN, SCALE_UP, INFRA_RECOVERY, TRAINING_PREP, WASTED, OTHER)

SPOT, ON_DEMAND = "spot", "on-demand"
STORE = "store"  # a node that only runs the rendezvous store: not a training node, not billed


@dataclass(frozen=True)
class Prices:
    """USD per node-hour."""

    spot: float
    on_demand: float

    def of(self, capacity_type: str) -> float:
        return {SPOT: self.spot, ON_DEMAND: self.on_demand}.get(capacity_type, 0.0)


@dataclass
class NodeSpan:
    """A node that existed from ``start_s`` to ``end_s`` (None: still there) on the run's clock."""

    name: str
    capacity_type: str
    start_s: float
    end_s: float | None = None


def node_seconds(spans: Sequence[NodeSpan], until_s: float) -> dict[str, float]:
    """Node-seconds by capacity type between 0 (submission) and ``until_s`` (the end of the job)."""
    out: dict[str, float] = {SPOT: 0.0, ON_DEMAND: 0.0}
    for s in spans:
        end = until_s if s.end_s is None else min(s.end_s, until_s)
        out[s.capacity_type] = out.get(s.capacity_type, 0.0) + max(0.0, end - max(0.0, s.start_s))
    return out


def cost(seconds_by_type: dict[str, float], prices: Prices, time_scale: float = 1.0) -> float:
    """USD for these node-seconds; each second on a ``time_scale``-compressed clock stands for
    ``time_scale`` real seconds."""
    return sum(s * time_scale / 3600.0 * prices.of(ct) for ct, s in seconds_by_type.items())


def cost_curve(
    spans: Sequence[NodeSpan], times: Sequence[float], prices: Prices, time_scale: float
) -> list[float]:
    """Accumulated cost at each of ``times`` (for the timeline plot)."""
    return [cost(node_seconds(spans, t), prices, time_scale) for t in times]


@dataclass(frozen=True)
class Poll:
    """One look at the job: seconds since submission, world size, global step (None before any), and
    whether it is waiting for workers (fewer running than ``replicas.min``: the status's phase is Pending;
    the world size then still shows the last one trained at)."""

    t: float
    world: int
    step: int | None
    waiting: bool = False


@dataclass
class Goodput:
    wall_s: float
    productive_s: float
    badput_s: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    steps_redone: int = 0
    ideal_step_s: dict[int, float] = field(default_factory=dict)

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "goodput": round(self.goodput, 4),
            "wall_s": round(self.wall_s, 1),
            "productive_s": round(self.productive_s, 1),
            "badput_s": {k: round(v, 1) for k, v in self.badput_s.items() if v > 0},
            "steps": self.steps,
            "steps_redone": self.steps_redone,
            "ideal_step_s": {str(k): round(v, 4) for k, v in sorted(self.ideal_step_s.items())},
        }


def progress_changes(polls: Sequence[Poll]) -> list[Poll]:
    """The polls that saw a new step count (progress reaches the status every few seconds, so most polls
    repeat the previous one)."""
    out: list[Poll] = []
    for p in polls:
        if p.step is not None and (not out or p.step != out[-1].step):
            out.append(p)
    return out


def ideal_step_times(polls: Sequence[Poll]) -> dict[int, float]:
    """Per world size, the median seconds per step between consecutive progress changes at an unchanged
    world size (the job's own throughput, as ml-goodput-measurement's ideal step time)."""
    rates: dict[int, list[float]] = defaultdict(list)
    for a, b in itertools.pairwise(progress_changes(polls)):
        if b.step is not None and a.step is not None and b.step > a.step and a.world == b.world > 0:
            rates[b.world].append((b.t - a.t) / (b.step - a.step))
    return {w: statistics.median(r) for w, r in rates.items()}


def goodput(polls: Sequence[Poll], min_world: int, end_s: float | None = None) -> Goodput:
    """Split the elapsed time (0 → ``end_s``, default the last poll) into productive time and badput.

    Between two changes of the step count, the steps done count as productive at the ideal step time of
    that world size (never more than the stretch); the rest of the stretch is badput, each poll interval
    charged to the cause in force: start-up until the first step, then the last resize or stop, until
    steps advance again. A step counter that goes back means steps redone: their time moves from
    productive to ``wasted_progress_from_disruption``.

    Long because: one pass over the polls whose state (cause, stretch, best step, stopped) every branch
    reads and moves; split, that state would travel between functions and the charging rules with it.
    """
    polls = sorted(polls, key=lambda p: p.t)
    end = end_s if end_s is not None else (polls[-1].t if polls else 0.0)
    out = Goodput(wall_s=end, productive_s=0.0, badput_s=dict.fromkeys(BADPUT, 0.0))
    ideal = ideal_step_times(polls)
    fallback = statistics.median(ideal.values()) if ideal else 0.0
    out.ideal_step_s = ideal

    def step_s(world: int) -> float:
        if world in ideal:
            return ideal[world]
        # An unseen size: scale the nearest seen one (per-step time ~ 1/world at a fixed global batch).
        if ideal and world > 0:
            near = min(ideal, key=lambda w: abs(w - world))
            return ideal[near] * near / world
        return fallback

    cause = PROGRAM_STARTUP
    stopped = False  # fewer workers than the job needs: the next re-forming is a restart
    last_t, last_step, last_world, best = 0.0, 0, 0, 0
    # Poll intervals since the step count last changed, with their causes. When it changes, the steps
    # done are charged at the ideal step time to the end of that stretch (they were just trained), and
    # what is left of it is badput, by interval.
    stretch: list[tuple[float, str]] = []

    def settle(work: float) -> None:
        for duration, why in reversed(stretch):
            took = min(duration, work)
            work -= took
            out.badput_s[why] += duration - took
        stretch.clear()

    for p in polls:
        if p.t > end:
            break
        step = p.step if p.step is not None else last_step
        done = step - last_step
        # What the interval ending at this poll is charged to. A change seen at its end started inside
        # it, except the end of a wait, which lasted until the capacity came.
        # Before the first step it is all start-up, as in ml-goodput-measurement (the phase is Pending
        # then too, and the world grows worker by worker).
        below = best > 0 and (p.waiting or 0 < p.world < min_world)
        if below and not stopped:  # the job has stopped: waiting for capacity
            stopped = True
            stretch.append((p.t - last_t, INFRA_RECOVERY))
            cause = INFRA_RECOVERY
        elif stopped and not below:  # capacity is back: (re)start
            stretch.append((p.t - last_t, INFRA_RECOVERY))
            stopped = False
            cause = TRAINING_PREP if best > 0 else PROGRAM_STARTUP
        elif not stopped and cause != PROGRAM_STARTUP and p.world != last_world:
            if p.world == 0:  # the workers are gone: the job is finishing
                new_cause = OTHER
            elif last_world == 0:
                new_cause = TRAINING_PREP
            else:
                new_cause = SCALE_UP if p.world > last_world else SLICE_DOWN
            stretch.append((p.t - last_t, new_cause))
            cause = new_cause
        else:
            stretch.append((p.t - last_t, cause))
        if done < 0:  # restarted from an older checkpoint: the steps above it are done again
            stretch[-1] = (stretch[-1][0], TRAINING_PREP)
            settle(0.0)
            cause = OTHER
        elif done > 0:
            span = sum(d for d, _ in stretch)
            work = min(span, done * step_s(p.world or last_world))
            redone = done - max(0, step - best)
            if redone > 0:  # steps trained already, before a restart from an older checkpoint
                redo_s = work * redone / done
                out.badput_s[WASTED] += redo_s
                out.productive_s -= redo_s
                out.steps_redone += redone
            best = max(best, step)
            out.productive_s += work
            settle(work)
            if not stopped:
                cause = OTHER
        last_t, last_step, last_world = p.t, step, p.world
    settle(0.0)
    out.badput_s[OTHER] += max(0.0, end - last_t)  # after the last poll: the finish
    out.steps = best
    return out

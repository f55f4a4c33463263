"""status.resizeHistory: the operator's records of running-count changes and the trainer's measured
resizes, merged into one entry per change of the world.

Pure. The operator sees pods (a reason, when the running count changed); the trainer sees its world (when
the new world trained its first step, the pause, the steps lost). Either may arrive first, and one world
change may be several pod changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

from pydantic import ValidationError

from etj_contract.progress import ResizeRecord, TrainerResize
from etj_operator.api.models import MAX_RESIZE_HISTORY, ResizeEvent
from etj_operator.timeutil import parse_time

# A trainer-reported resize is the same event as one the operator recorded if the sizes match and
# the times are this close (the trainer's time is when training resumed, after the rendezvous).
RESIZE_MATCH_WINDOW = timedelta(seconds=300)
# status.resizeHistory[].unmeasuredReason of pods that started but never joined a world before the end.
NOT_JOINED_BEFORE_END = "NotJoinedBeforeEnd"

# Reasons the trainer puts in its own resize records; the operator's reasons say *why*.
TRAINER_REASONS = frozenset(str(r) for r in TrainerResize)


def _near(history: Sequence[ResizeEvent], a: ResizeEvent, b: ResizeEvent) -> bool:
    """Can ``a`` and ``b`` be two sides' records of one change: within the window, and no measured change
    of the world between them? A short job changes the same way twice in the window (the start-up ramp's
    2->4 and the return after an interruption's 2->4, 40 s apart on kind): the 4->2 between them says they
    are two changes (issue 36)."""
    if abs(a.time - b.time) > RESIZE_MATCH_WINDOW:
        return False
    low, high = min(a.time, b.time), max(a.time, b.time)
    return not any(
        m.pause_seconds is not None and low < m.time < high and m is not a and m is not b for m in history
    )


def _latest_same_resize(
    history: Sequence[ResizeEvent], event: ResizeEvent, unmatched: Callable[[ResizeEvent], bool]
) -> ResizeEvent | None:
    """The newest entry for the same change (sizes, near in time) that ``unmatched`` says is still
    waiting for the other side's record of it."""
    return next(
        (
            e
            for e in reversed(history)
            if unmatched(e) and (e.from_, e.to) == (event.from_, event.to) and _near(history, e, event)
        ),
        None,
    )


def record_resize(history: Sequence[ResizeEvent], event: ResizeEvent) -> list[ResizeEvent]:
    """Add the operator's record of a running-count change.

    If the trainer already reported this resize -- an in-place leave re-forms the world before the pod
    is gone, so its report can arrive first -- give that entry the operator's reason instead of adding a
    second entry for the same resize.
    """
    out = [e.model_copy() for e in history]
    match = _latest_same_resize(out, event, lambda e: e.reason in TRAINER_REASONS)
    if match is None:
        return fold_pod_steps([*out, event])[-MAX_RESIZE_HISTORY:]
    match.reason = event.reason
    return out


def _operator_only(e: ResizeEvent) -> bool:
    """An entry the operator recorded that no trainer record has measured yet."""
    return e.pause_seconds is None and e.reason not in TRAINER_REASONS


def _pod_steps(history: Sequence[ResizeEvent], world: ResizeEvent) -> list[ResizeEvent] | None:
    """The operator's unmeasured entries that walk from ``world.from_`` to ``world.to`` one running-count
    change after another (2->3, 3->4 for the trainer's 2->4), near ``world`` in time; None if there is no
    such walk of two or more."""
    up = world.to > world.from_
    steps = sorted(
        (
            e
            for e in history
            if _operator_only(e) and (e.to > e.from_) == up and e.to != e.from_ and _near(history, e, world)
        ),
        key=lambda e: e.time,
    )
    walk, at = [], world.from_
    for e in steps:
        if e.from_ == at:
            walk.append(e)
            at = e.to
        if at == world.to:
            return walk if len(walk) > 1 else None
    return None


def fold_pod_steps(history: Sequence[ResizeEvent]) -> list[ResizeEvent]:
    """One entry per change of the world.

    The operator records each running-count change as it sees it, pod by pod; the trainer's world admits
    the joiners of one rendezvous together (or loses several leavers at once) in one resize. On kind two
    replacement pods started 12 s apart and joined in one 2->4 resize: the operator's 2->3 and 3->4 stood
    without a pause beside the trainer's measured 2->4 (issue 36). Such a walk folds into the trainer's
    entry, which keeps its measured time, pause and steps lost and takes the operator's reason.
    """
    out = [e.model_copy() for e in history]
    for world in [e for e in out if e.pause_seconds is not None]:
        walk = _pod_steps(out, world)
        if walk is None:
            continue
        if world.reason in TRAINER_REASONS:
            world.reason = walk[0].reason
        out = [e for e in out if not any(e is w for w in walk)]
    return out


def mark_unjoined(history: Sequence[ResizeEvent]) -> list[ResizeEvent]:
    """At the end of training: the operator's scale-ups that no world ever measured say why."""
    return [
        e.model_copy(update={"unmeasured_reason": NOT_JOINED_BEFORE_END})
        if _operator_only(e) and e.to > e.from_ and not e.unmeasured_reason
        else e
        for e in history
    ]


def _holds(entry: ResizeEvent, rep: ResizeEvent) -> bool:
    """Whether ``entry`` already carries the trainer's record ``rep``: its time, sizes *and* fields.

    Time and sizes alone are not enough: status times are whole seconds and an in-place leave takes less
    than one, so the operator's own entry for the same resize can share them while it still waits for the
    trainer's pause (a clean-clone ``make test`` lost the pause that way).
    """
    return (entry.time, entry.from_, entry.to, entry.pause_seconds, entry.steps_lost) == (
        rep.time,
        rep.from_,
        rep.to,
        rep.pause_seconds,
        rep.steps_lost,
    )


def merge_resizes(
    history: Sequence[ResizeEvent], reported: Sequence[ResizeRecord], procs_per_worker: int = 1
) -> list[ResizeEvent]:
    """Merge the trainer's resize records into the operator's: enrich a matching entry, else append.

    The trainer's records count ranks; they become worker pods here (ranks / procs_per_worker, a pod's ranks
    come and go together) so they match the operator's records of the same change. Idempotent: an entry
    that already holds a record is left alone on the next poll.
    """
    out = [e.model_copy() for e in history]
    per = max(1, procs_per_worker)
    for record in reported:
        pods = {"from": -(-record.from_ // per), "to": -(-record.to // per)}  # ceil: a partial pod is a pod
        try:
            rep = ResizeEvent.model_validate({**record.to_json(), **pods, "time": parse_time(record.time)})
        except ValidationError:
            continue
        if any(_holds(e, rep) for e in out):
            continue
        match = _latest_same_resize(out, rep, lambda e: e.pause_seconds is None)
        if match is not None:
            match.time = rep.time
            match.pause_seconds = rep.pause_seconds
            match.steps_lost = rep.steps_lost
            match.state_path = rep.state_path
            match.reason = match.reason or rep.reason
            match.unmeasured_reason = None
        else:
            out.append(rep)
    out.sort(key=lambda e: e.time)
    return fold_pod_steps(out)[-MAX_RESIZE_HISTORY:]

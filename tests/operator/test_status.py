"""Status building pieces: trainer progress, resize merging, condition stability."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from etj_contract.progress import ResizeRecord
from etj_operator.api.models import Phase, ResizeEvent
from etj_operator.decide.plan.planner import plan
from etj_operator.decide.status.resize_history import merge_resizes, record_resize
from tests.operator.factories import NOW, cluster, job, observe, spec, started, status, store, worker

RUNNING = [worker(i, f"spot-{i}") for i in range(4)]


def test_progress_is_copied_into_status() -> None:
    progress = {
        "epoch": 2,
        "step": 340,
        "samplesSeen": 21760,
        "samplesPerSecond": 812.5,
        "loss": 0.31,
        "worldSize": 4,
        "perWorkerBatch": 16,
        "accumulationSteps": 2,
        "lrMultiplier": 1.0,
        "lastCheckpoint": {"step": 300, "path": "/ckpt/300", "time": "2026-01-01T11:59:00Z"},
        "bogus": "ignored",
    }
    st = plan(
        job(st=started(4)), observe(cluster(), [*RUNNING, store()], progress=progress, progress_time=NOW)
    ).status
    assert st.progress is not None and (st.progress.step, st.progress.samples_seen) == (340, 21760)
    assert (st.world_size, st.per_worker_batch, st.accumulation_steps) == (4, 16, 2)
    assert st.last_checkpoint is not None and st.last_checkpoint.step == 300


def test_garbage_progress_does_not_break_status() -> None:
    st = plan(
        job(st=started(4)),
        observe(
            cluster(),
            [*RUNNING, store()],
            progress={"step": -3, "worldSize": "x", "resizes": [1, {"to": "?"}]},
        ),
    ).status
    # Nothing of the garbage is copied (no negative step, no world size, no resizes); the job runs on.
    assert (st.phase, st.current_replicas, st.world_size) == (Phase.RUNNING, 4, None)
    assert st.progress is not None and st.progress.step is None
    assert st.resize_history == []


def _ev(seconds: int, frm: int, to: int, reason: str = "", pause: float | None = None) -> ResizeEvent:
    return ResizeEvent.model_validate(
        {
            "time": NOW + timedelta(seconds=seconds),
            "from": frm,
            "to": to,
            "reason": reason,
            "pauseSeconds": pause,
        }
    )


def _records(raw: list[dict[str, Any]]) -> list[ResizeRecord]:
    return [r for r in map(ResizeRecord.from_json, raw) if r is not None]


def test_trainer_resize_enriches_the_operator_record_once() -> None:
    ours = [_ev(0, 4, 3, "SpotInterruption")]
    reported = [
        {
            "time": (NOW + timedelta(seconds=20)).isoformat(),
            "from": 4,
            "to": 3,
            "reason": "rendezvous",
            "pauseSeconds": 18.5,
            "stepsLost": 3,
        }
    ]
    merged = merge_resizes(ours, _records(reported))
    assert len(merged) == 1
    assert (merged[0].reason, merged[0].pause_seconds, merged[0].steps_lost) == ("SpotInterruption", 18.5, 3)
    assert merge_resizes(merged, _records(reported)) == merged  # idempotent on the next poll


@pytest.mark.parametrize("path", ["InPlace", "InPlaceResharded", "Restart"])
def test_the_path_the_state_took_reaches_status(path: str) -> None:
    """Issue 41 item 2: the trainer's record says how the state crossed the resize (a sharded state
    resharded in memory, or a restart from the checkpoint); status.resizeHistory carries it beside the
    operator's reason and the measured cost."""
    ours = [_ev(0, 2, 1, "SpotInterruption")]
    at = (NOW + timedelta(seconds=3)).isoformat()
    reported = [{"time": at, "from": 2, "to": 1, "pauseSeconds": 1.5, "stepsLost": 0, "statePath": path}]
    (merged,) = merge_resizes(ours, _records(reported))
    assert (merged.reason, merged.state_path, merged.pause_seconds) == ("SpotInterruption", path, 1.5)
    assert merged.to_dict()["statePath"] == path
    appended = merge_resizes([], _records(reported))  # no operator record yet: the trainer's, as it is
    assert appended[0].state_path == path


def test_an_unknown_state_path_is_dropped_not_fatal() -> None:
    (record,) = _records([{"time": NOW.isoformat(), "from": 2, "to": 1, "statePath": "Teleported"}])
    assert record.path == "" and "statePath" not in record.to_json()
    assert merge_resizes([], [record])[0].state_path is None


def test_progress_in_ranks_and_resizes_in_pods_with_two_processes_per_pod() -> None:
    # The trainer counts ranks (worldSize 4, a 4 -> 2 resize); status counts the resize in worker pods, so
    # the trainer's record of a pod leaving enriches the operator's 2 -> 1 instead of standing beside it.
    two = spec(trainer={"image": "trainer:1", "resources": {"gpu": 0}, "procsPerWorker": 2})
    at = NOW + timedelta(seconds=5)
    leave = {"time": at.isoformat(), "from": 4, "to": 2, "reason": "scale-down", "pauseSeconds": 0.4}
    progress = {"step": 20, "worldSize": 2, "perRankBatch": 32, "perWorkerBatch": 64, "resizes": [leave]}
    ours = status(resizeHistory=[_ev(4, 2, 1, "SpotInterruption").to_dict()])
    st = plan(job(two, st=ours), observe(cluster(), [worker(0, "spot-0"), store()], progress=progress)).status
    assert (st.world_size, st.per_rank_batch, st.per_worker_batch) == (2, 32, 64)
    resizes = [(e.from_, e.to, e.reason, e.pause_seconds) for e in st.resize_history]
    assert (2, 1, "SpotInterruption", 0.4) in resizes and not [r for r in resizes if r[0] == 4], resizes


def test_unmatched_trainer_resize_is_appended_in_time_order() -> None:
    merged = merge_resizes(
        [_ev(100, 4, 3, "SpotInterruption")],
        _records([{"time": NOW.isoformat(), "from": 3, "to": 4, "reason": "CapacityAdded"}]),
    )
    assert [e.to for e in merged] == [4, 3]


def test_condition_transition_time_only_moves_on_a_transition() -> None:
    first = plan(job(st=started(4)), observe(cluster(), [*RUNNING, store()])).status
    later = plan(
        job(st=first), observe(cluster(), [*RUNNING, store()], now=NOW + timedelta(minutes=5))
    ).status
    assert [c.last_transition_time for c in first.conditions] == [
        c.last_transition_time for c in later.conditions
    ]


def _capacity(st: object) -> tuple[str, str]:
    cond = next(c for c in st.conditions if c.type == "CapacityAvailable")  # type: ignore[attr-defined]
    return cond.status.value, cond.reason


def test_capacity_condition_below_min_without_room() -> None:
    from tests.operator.factories import spec

    job_view = job(spec(replicas={"min": 3, "max": 4}), started(1))
    st = plan(job_view, observe(cluster(spot=1), [RUNNING[0], store()])).status
    assert _capacity(st) == ("False", "InsufficientCapacity")
    st = plan(job_view, observe(cluster(spot=4), [RUNNING[0], store()])).status
    assert _capacity(st) == ("True", "EnoughCapacity")


def _trainer_report(seconds: int) -> dict[str, object]:
    return {
        "resizes": [
            {
                "time": (NOW + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "from": 4,
                "to": 3,
                "reason": "scale-down",
                "pauseSeconds": 0.3,
                "stepsLost": 0,
            }
        ]
    }


def test_one_entry_per_resize_whichever_side_reports_first() -> None:
    # regression: an in-place leave (trainer regroup.py) reports 4->3 before the operator sees the pod
    # gone; the operator then added a second, pause-less 4->3 entry
    later = [worker(i, f"spot-{i}") for i in range(3)]
    report = _trainer_report(1)

    def history(first_running: list[Any], first_progress: dict[str, object] | None) -> list[Any]:
        st = plan(
            job(st=started(4)),
            observe(
                cluster(),
                [*first_running, store()],
                progress=first_progress,
                progress_time=NOW,
                now=NOW + timedelta(seconds=2),
            ),
        ).status
        for s in (3, 4):  # the pod is gone and the report is in; a further poll changes nothing
            st = plan(
                job(st=st),
                observe(
                    cluster(),
                    [*later, store()],
                    progress=report,
                    progress_time=NOW,
                    now=NOW + timedelta(seconds=s),
                ),
            ).status
        return [(e.from_, e.to, e.reason, e.pause_seconds) for e in st.resize_history if e.to == 3]

    trainer_first = history(RUNNING, report)
    operator_first = history(later, None)
    assert len(trainer_first) == 1 and trainer_first[0][2] != "scale-down" and trainer_first[0][3] == 0.3
    assert trainer_first == operator_first


# One interruption and one return, as both sides see them: the operator's records (reason, when it saw the
# pod count change) and the trainer's (pause, when the new world trained its first step).
OP_LEAVE = _ev(0, 4, 3, "SpotInterruption")
OP_JOIN = _ev(30, 3, 4, "CapacityAdded")
OP_END = _ev(200, 4, 0, "JobFinished")


def _rec(seconds: int, frm: int, to: int, pause: float) -> ResizeRecord:
    at = (NOW + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return ResizeRecord(at, frm, to, "scale-down" if to < frm else "scale-up", pause, 0)


TR_LEAVE, TR_JOIN = _rec(1, 4, 3, 0.16), _rec(38, 3, 4, 1.4)
ARRIVALS: dict[str, list[ResizeEvent | list[ResizeRecord]]] = {
    "the trainer's report before the operator's record": [[TR_LEAVE], OP_LEAVE, OP_JOIN, [TR_LEAVE, TR_JOIN]],
    "the trainer's report after the operator's record": [OP_LEAVE, [TR_LEAVE], OP_JOIN, [TR_LEAVE, TR_JOIN]],
    "the trainer's reports long after (both resizes and the end first)": [
        OP_LEAVE,
        OP_JOIN,
        OP_END,
        [TR_LEAVE, TR_JOIN],
    ],
    "a stale report without the join in between": [OP_LEAVE, [TR_LEAVE], OP_JOIN, [], [TR_LEAVE, TR_JOIN]],
    # regression (issue 12, found by a clean-clone make test): an in-place leave takes well under a second,
    # so the trainer's record can carry the same whole-second time as the operator's entry (status times
    # are whole seconds); "same time and sizes" was taken for "already merged" and the pause was dropped
    "the trainer's record in the same second as the operator's": [
        _ev(1, 4, 3, "SpotInterruption"),
        [TR_LEAVE],
        OP_JOIN,
        [TR_LEAVE, TR_JOIN],
    ],
    "the same second, the trainer's record first": [
        [TR_LEAVE],
        _ev(1, 4, 3, "SpotInterruption"),
        OP_JOIN,
        [TR_JOIN],
    ],
}


@pytest.mark.parametrize("order", list(ARRIVALS))
def test_one_entry_per_resize_with_both_sides_fields_whatever_the_order(order: str) -> None:
    history: list[ResizeEvent] = []
    for item in ARRIVALS[order]:
        history = (
            record_resize(history, item) if isinstance(item, ResizeEvent) else merge_resizes(history, item)
        )
        history = merge_resizes(history, [])  # a poll that brings nothing new changes nothing
    got = [(e.from_, e.to, e.reason, e.pause_seconds) for e in history if e.to > 0]
    assert got == [(4, 3, "SpotInterruption", 0.16), (3, 4, "CapacityAdded", 1.4)], order


# Two replacement pods start seconds apart (the operator records 2->3 and 3->4) and one rendezvous admits
# both (the trainer measures 2->4), or two pods leave at once for the trainer and one by one for the
# operator. Found on kind (issue 36): the scale-up stood as two pause-less entries beside the measured one.
OP_UP_1, OP_UP_2 = _ev(30, 2, 3, "CapacityAdded"), _ev(42, 3, 4, "CapacityAdded")
TR_UP = _rec(58, 2, 4, 0.42)
POD_STEPS: dict[
    str, tuple[list[ResizeEvent | list[ResizeRecord]], list[tuple[int, int, str, float | None]]]
] = {
    "two pods, one world: the trainer's record after the operator's": (
        [OP_UP_1, OP_UP_2, [TR_UP]],
        [(2, 4, "CapacityAdded", 0.42)],
    ),
    "two pods, one world: the trainer's record between the operator's": (
        [OP_UP_1, [TR_UP], OP_UP_2, [TR_UP]],
        [(2, 4, "CapacityAdded", 0.42)],
    ),
    "two pods, one world: the trainer's record first": (
        [[TR_UP], OP_UP_1, OP_UP_2],
        [(2, 4, "CapacityAdded", 0.42)],
    ),
    "two leave at once for the trainer, one by one for the operator": (
        [_ev(0, 4, 3, "SpotInterruption"), _ev(2, 3, 2, "SpotInterruption"), [_rec(3, 4, 2, 0.5)]],
        [(4, 2, "SpotInterruption", 0.5)],
    ),
    "two worlds, two records: nothing folds": (
        [OP_UP_1, [_rec(35, 2, 3, 0.3)], OP_UP_2, [_rec(35, 2, 3, 0.3), _rec(50, 3, 4, 0.2)]],
        [(2, 3, "CapacityAdded", 0.3), (3, 4, "CapacityAdded", 0.2)],
    ),
    # Found on kind (issue 36): the start-up ramp's 2->4 and the return after the interruption's 2->4 came
    # 40 s apart; the operator's record of the return took the start-up's entry, and the return's own
    # measurement had nothing left to land on.
    "the same change twice, an interruption between: each record to its own change": (
        [
            [_rec(41, 2, 4, 7.36)],
            _ev(63, 4, 2, "SpotInterruption"),
            [_rec(41, 2, 4, 7.36), _rec(64, 4, 2, 1.3)],
            _ev(80, 2, 4, "CapacityAdded"),
            [_rec(41, 2, 4, 7.36), _rec(64, 4, 2, 1.3), _rec(100, 2, 4, 0.5)],
        ],
        [(2, 4, "scale-up", 7.36), (4, 2, "SpotInterruption", 1.3), (2, 4, "CapacityAdded", 0.5)],
    ),
    "the same change twice, the second never joined: it stays unmeasured": (
        [
            [_rec(41, 2, 4, 7.36)],
            _ev(63, 4, 2, "SpotInterruption"),
            [_rec(41, 2, 4, 7.36), _rec(64, 4, 2, 1.3)],
            _ev(80, 2, 3, "CapacityAdded"),
            _ev(81, 3, 4, "CapacityAdded"),
        ],
        [
            (2, 4, "scale-up", 7.36),
            (4, 2, "SpotInterruption", 1.3),
            (2, 3, "CapacityAdded", None),
            (3, 4, "CapacityAdded", None),
        ],
    ),
    "the pods never joined: nothing folds, nothing measured": (
        [OP_UP_1, OP_UP_2, []],
        [(2, 3, "CapacityAdded", None), (3, 4, "CapacityAdded", None)],
    ),
}


@pytest.mark.parametrize("case", list(POD_STEPS))
def test_pod_by_pod_changes_fold_into_the_world_change_the_trainer_measured(case: str) -> None:
    arrivals, want = POD_STEPS[case]
    history: list[ResizeEvent] = []
    for item in arrivals:
        history = (
            record_resize(history, item) if isinstance(item, ResizeEvent) else merge_resizes(history, item)
        )
        history = merge_resizes(history, [])
    assert [(e.from_, e.to, e.reason, e.pause_seconds) for e in history] == want, case


def test_scale_ups_the_job_finished_before_admitting_say_so() -> None:
    """On kind the replacement pods started 20 s before the end and never joined: the status said
    `2->3 CapacityAdded` with no pause and nothing else (issue 36)."""
    leave = _rec(-59, 4, 2, 0.5)
    history = merge_resizes([_ev(-60, 4, 2, "SpotInterruption"), OP_UP_1, OP_UP_2], [leave])
    prev = started(4, resizeHistory=[e.to_dict() for e in history])
    done = {"step": 180, "finished": True, "resizes": [leave.to_json()]}
    pods = [worker(i, f"spot-{i}") for i in range(4)]
    st = plan(job(st=prev), observe(cluster(), [*pods, store()], progress=done, progress_time=NOW)).status
    got = [(e.from_, e.to, e.pause_seconds, e.unmeasured_reason) for e in st.resize_history]
    assert got == [(4, 2, 0.5, None), (2, 3, None, "NotJoinedBeforeEnd"), (3, 4, None, "NotJoinedBeforeEnd")]


# prev status, workers running now, does the operator read progress -> (from, to, reason) recorded, or None
TIMELINE: dict[str, tuple[Any, int, bool, tuple[int, int, str] | None]] = {
    "pods starting before the trainer's first report are not resizes (the first world waits for them)": (
        started(1, progress=None),
        3,
        True,
        None,
    ),
    "once the trainer has reported, a pod arriving resizes the world": (
        started(3),
        4,
        True,
        (3, 4, "CapacityAdded"),
    ),
    "pods exiting after the trainer's finished report are not resizes": (
        started(4, progress={"step": 180}),
        0,
        True,
        None,
    ),
    "an operator that does not read progress cannot tell: every change is recorded": (
        started(1, progress=None),
        3,
        False,
        (1, 3, "CapacityAdded"),
    ),
}


@pytest.mark.parametrize("case", list(TIMELINE), ids=list(TIMELINE))
def test_which_running_count_changes_are_resizes(case: str) -> None:
    prev, running, tracked, expected = TIMELINE[case]
    progress = {"step": 180, "finished": True} if running == 0 else None
    out = plan(
        job(st=prev),
        observe(cluster(), [*RUNNING[:running], store()], progress_tracked=tracked, progress=progress),
    )
    got = [(e.from_, e.to, e.reason) for e in out.status.resize_history]
    assert got == ([expected] if expected else []), got
    assert out.status.current_replicas == running
    # The change is still an Event, recorded as a resize or not.
    change = f"workers {prev.current_replicas or 0} -> {running}"
    assert [(e.type, e.message) for e in out.events] == [("Normal", change)]


# the trainer's progress as the operator last read it -> the job's phase once its only worker exited 0
LAST_WORKER_EXITS: dict[str, tuple[dict[str, Any], str]] = {
    "with the final report read": ({"step": 180, "finished": True}, "Succeeded"),
    "before the final report is read": ({"step": 180}, "Pending"),
}


@pytest.mark.parametrize("case", list(LAST_WORKER_EXITS), ids=list(LAST_WORKER_EXITS))
def test_the_last_worker_exiting_0_is_the_job_finishing_not_a_lost_worker(case: str) -> None:
    """Found on kind (tests/kind/test_failures.py, a one-worker job): the only worker exited 0 after the
    last step, and the Event said `WorkerLost: workers 1 -> 0`, the reason for a worker deleted by hand.
    Nothing drains it (it left by itself), so no drain's reason named the cause."""
    progress, phase = LAST_WORKER_EXITS[case]
    done = worker(0, "spot-0", phase="Succeeded", finished_at=NOW - timedelta(seconds=1))
    out = plan(job(st=started(1)), observe(cluster(), [done, store()], progress=progress))
    assert out.status.phase == phase
    changes = [(e.type, e.reason, e.message) for e in out.events if e.message.startswith("workers")]
    assert changes == [("Normal", "JobFinished", "workers 1 -> 0")], out.events
    assert not out.status.resize_history  # the world did not shrink: training is over


@pytest.mark.parametrize(("launcher", "mode"), [("Etj", "InPlace"), ("Torchrun", "Restart")])
def test_status_says_how_the_job_resizes(launcher: str, mode: str) -> None:
    """A stock torchrun script (trainer.launcher Torchrun) resizes by restarting every worker: its status
    says so plainly, as the loop API's says InPlace (issue 47, rung 0)."""
    s = spec(trainer={"image": "trainer:1", "resources": {"gpu": 1}, "launcher": launcher})
    st = plan(job(s, started(4)), observe(cluster(), [*RUNNING, store()])).status
    assert st.resize_mode is not None and st.resize_mode.value == mode

"""The progress document and the store's merge (etj_contract.progress): nothing the operator must see is
lost to reports arriving out of order or being replaced before a poll."""

from __future__ import annotations

import json

import pytest

from etj_contract.progress import MAX_ERROR_CHARS, ProgressDoc, ResizeRecord, merge

LEAVE = ResizeRecord("2026-01-01T12:00:05Z", 4, 3, "scale-down", 0.16, 0)
JOIN = ResizeRecord("2026-01-01T12:01:00Z", 3, 4, "scale-up", 1.4, 0)


def _doc(
    step: int, *resizes: ResizeRecord, finished: bool = False, accuracy: float | None = None
) -> ProgressDoc:
    return ProgressDoc(step=step, world_size=4, resizes=resizes, finished=finished, accuracy=accuracy)


def test_round_trip_through_json() -> None:
    doc = ProgressDoc(
        epoch=2,
        step=340,
        samples_seen=21760,
        samples_total=64000,
        samples_per_second=812.5,
        loss=0.31,
        world_size=4,
        per_worker_batch=16,
        accumulation_steps=2,
        lr_multiplier=1.0,
        last_checkpoint={"step": 300, "path": "/ckpt", "time": 1.0},
        failed_writes=2,
        checkpoint_error="s3://b/p/ckpt-000000340.pt: MaxRetryError: refused",
        resizes=(LEAVE, JOIN),
        finished=True,
        accuracy=0.97,
    )
    assert ProgressDoc.from_json(json.loads(json.dumps(doc.to_json()))) == doc


def test_malformed_fields_are_dropped_not_fatal() -> None:
    doc = ProgressDoc.from_json(
        {
            "step": -3,
            "worldSize": "x",
            "loss": float("nan"),
            "finished": "yes",
            "resizes": [1, {"to": "?"}, {"time": "t", "from": True, "to": 2}, LEAVE.to_json()],
        }
    )
    assert doc == ProgressDoc(resizes=(LEAVE,))
    assert ProgressDoc.from_json([1, 2]) == ProgressDoc()


@pytest.mark.parametrize(
    ("name", "arrivals"),
    [
        ("in order", [_doc(30), _doc(33, LEAVE), _doc(40, LEAVE)]),
        # A leaving rank 0's last report lands after the new rank 0's first (two senders, no ordering).
        ("stale report after the resize", [_doc(30), _doc(33, LEAVE), _doc(32)]),
        ("stale report twice", [_doc(33, LEAVE), _doc(31), _doc(32)]),
    ],
)
def test_a_resize_record_once_stored_is_never_taken_back(name: str, arrivals: list[ProgressDoc]) -> None:
    stored = None
    for doc in arrivals:
        stored = merge(stored, doc)
    assert stored is not None and stored.resizes == (LEAVE,), name


def test_resize_records_accumulate_in_time_order_without_duplicates() -> None:
    stored = merge(merge(_doc(70, JOIN), _doc(33, LEAVE)), _doc(71, LEAVE, JOIN))
    assert stored.resizes == (LEAVE, JOIN)


def test_a_record_keeps_the_pause_one_report_knew() -> None:
    bare = ResizeRecord(LEAVE.time, 4, 3, "scale-down")
    assert merge(_doc(33, LEAVE), _doc(34, bare)).resizes == (LEAVE,)


def test_a_finished_report_stays_finished() -> None:
    final = _doc(180, LEAVE, finished=True, accuracy=0.98)
    stored = merge(merge(None, final), _doc(175))  # a late report from a rank that left
    assert stored.finished and stored.accuracy == 0.98 and stored.step == 180
    assert merge(_doc(170), final) == final


ERR = ProgressDoc(last_error="worker-1: FileNotFoundError: /data/train.tar")


@pytest.mark.parametrize(
    ("name", "stored", "incoming", "want"),
    [
        (
            "an agent's error report sets lastError and keeps the counters",
            ProgressDoc(step=7, epoch=1, loss=0.5),
            ERR,
            ProgressDoc(step=7, epoch=1, loss=0.5, last_error=ERR.last_error),
        ),
        (
            "a training report without an error keeps the stored one",
            ProgressDoc(step=7, last_error=ERR.last_error),
            ProgressDoc(step=8),
            ProgressDoc(step=8, last_error=ERR.last_error),
        ),
        (
            "a newer error replaces the older",
            ProgressDoc(step=7, last_error="worker-0: old"),
            ProgressDoc(last_error="worker-0: new"),
            ProgressDoc(step=7, last_error="worker-0: new"),
        ),
        (
            "an error report keeps a finished job finished",
            ProgressDoc(step=9, finished=True, accuracy=0.9),
            ERR,
            ProgressDoc(step=9, finished=True, accuracy=0.9, last_error=ERR.last_error),
        ),
        ("an error before any report", None, ERR, ERR),
    ],
)
def test_last_error(name: str, stored: ProgressDoc | None, incoming: ProgressDoc, want: ProgressDoc) -> None:
    assert merge(stored, incoming) == want, name


def test_last_error_round_trips_and_is_bounded() -> None:
    assert ProgressDoc.from_json(ERR.to_json()) == ERR
    assert "lastError" not in ProgressDoc(step=1).to_json()
    long = ProgressDoc.from_json({"lastError": "x" * 10_000})
    assert long.last_error == "x" * MAX_ERROR_CHARS
    assert ProgressDoc.from_json({"lastError": 3}).last_error is None

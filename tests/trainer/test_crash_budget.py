"""crash_budget: which worker failures count, and when the agent stops restarting (named table)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from etj_contract.progress import MAX_ERROR_CHARS
from etj_trainer.agent.crash_budget import (
    EXIT_RESIZE,
    STOCK_RUN_PROGRESS_S,
    CrashCount,
    Progress,
    after_failure,
    error_line,
    stock_progress,
)


@dataclass(frozen=True)
class Failure:
    codes: tuple[int, ...]
    progress: Progress | None
    store_lost: bool = False


CRASH = (1,)
CASES: list[tuple[str, list[Failure], list[bool], list[bool]]] = [
    # name, failures in order, counted as crash?, give up?
    (
        "a deterministic error before any step: three restarts, then the pod fails",
        [Failure(CRASH, None)] * 4,
        [True] * 4,
        [False, False, False, True],
    ),
    (
        "the same step each time (a corrupt sample): no progress, gives up",
        [Failure(CRASH, (0, 40))] * 4,
        [True] * 4,
        [False, False, False, True],
    ),
    (
        "progress between crashes (spot reclaims of peers): never gives up",
        [Failure(CRASH, (0, s)) for s in (10, 20, 30, 40, 50, 60)],
        [True] * 6,
        [False] * 6,
    ),
    (
        "membership changes (a peer left in place, or exited 0) are not crashes",
        [Failure((EXIT_RESIZE,), None), Failure((0, EXIT_RESIZE), None)] * 4,
        [False] * 8,
        [False] * 8,
    ),
    (
        "failures while the store is lost are not counted",
        [Failure(CRASH, None, store_lost=True)] * 10 + [Failure(CRASH, None)],
        [False] * 10 + [True],
        [False] * 11,
    ),
    (
        "a signal death among resizes counts (SIGKILL of a worker = -9)",
        [Failure((EXIT_RESIZE, -9), (1, 5))],
        [True],
        [False],
    ),
]


@pytest.mark.parametrize(("name", "failures", "crashes", "give_ups"), CASES, ids=[c[0] for c in CASES])
def test_after_failure(name: str, failures: list[Failure], crashes: list[bool], give_ups: list[bool]) -> None:
    count = CrashCount()
    got_crash, got_give_up = [], []
    for f in failures:
        verdict = after_failure(count, f.codes, f.progress, store_lost=f.store_lost, max_crashes=3)
        count = verdict.count
        got_crash.append(verdict.crash)
        got_give_up.append(verdict.give_up)
    assert (got_crash, got_give_up) == (crashes, give_ups)


def test_exit_resize_is_the_trainers() -> None:
    from etj_trainer.classifier.trainer import EXIT_RESIZE as TRAINER_EXIT_RESIZE

    assert EXIT_RESIZE == TRAINER_EXIT_RESIZE


@pytest.mark.parametrize(
    ("message", "worker", "line"),
    [
        (
            "FileNotFoundError: [Errno 2] No such file: '/x'",
            "w-1",
            "w-1: FileNotFoundError: [Errno 2] No such file: '/x'",
        ),
        ("Traceback...\n  File x\nValueError: bad\n\n", "", "ValueError: bad"),
        ("", "w-0", "w-0: worker failed"),
        ({"message": "OSError: x", "extraInfo": {"py_callstack": "..."}}, "w-2", "w-2: OSError: x"),
    ],
)
def test_error_line(message: object, worker: str, line: str) -> None:
    assert error_line(message, worker) == line


def test_error_line_is_bounded() -> None:
    assert len(error_line("E" * 5000)) == MAX_ERROR_CHARS


def test_a_stock_scripts_long_run_is_progress_and_a_quick_crash_is_not() -> None:
    """A stock torchrun script reports no step (ETJ_LAUNCHER=Torchrun): each leave or kill of a peer
    crashes its survivors, which is no loop when their group had trained a while; a script that fails
    within seconds of every start is one, and the agent gives up on it as on any crash loop."""
    count, long_runs = CrashCount(), 0
    for _ in range(10):  # ten membership changes, each after a long run: never a loop
        progress = stock_progress(long_runs, ran_s=STOCK_RUN_PROGRESS_S + 1)
        long_runs = progress[1]
        verdict = after_failure(count, [1], progress, store_lost=False, max_crashes=3)
        count = verdict.count
        assert verdict.crash and not verdict.give_up and count.in_a_row == 1
    verdicts = []
    for _ in range(4):  # then a deterministic error: fails at once, four times
        progress = stock_progress(long_runs, ran_s=2.0)
        long_runs = progress[1]
        verdict = after_failure(count, [1], progress, store_lost=False, max_crashes=3)
        count = verdict.count
        verdicts.append(verdict.give_up)
    # the long run's own crash was the first of the row: the third quick one passes max_crashes=3
    assert verdicts == [False, False, True, True]

"""The retry decision for reading the shared checkpoint store (checkpoint/retry.py), by named cases: an
unreachable store is tried again with backoff, within a budget, and then fails by name -- never "empty"."""

from __future__ import annotations

import pytest

from etj_trainer.checkpoint.retry import Backoff, StoreUnreachable, next_delay, retried

POLICY = Backoff(timeout_s=30.0, first_s=0.5, cap_s=8.0)

DELAYS: dict[str, tuple[int, float, float | None]] = {
    # case -> (failed tries so far, seconds spent, the wait before the next try or None: give up)
    "the first failure waits the first delay": (1, 0.0, 0.5),
    "each next failure waits twice as long": (3, 2.0, 2.0),
    "a wait never exceeds the cap": (10, 20.0, 8.0),
    "the last wait is cut to the deadline": (6, 27.0, 3.0),
    "a spent budget gives up": (7, 30.0, None),
    "past the budget still gives up": (2, 45.0, None),
}


@pytest.mark.parametrize("case", DELAYS)
def test_next_delay(case: str) -> None:
    attempt, elapsed, want = DELAYS[case]
    assert next_delay(POLICY, attempt, elapsed) == want


class _Clock:
    """Time that moves only when the retry loop sleeps: the decision, without waiting for it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


RUNS: dict[str, tuple[int, int | None, list[float]]] = {
    # case -> (failures before the store answers, the answer or None: StoreUnreachable, waits slept)
    "a store that answers at once is read once": (0, 7, []),
    "a store back after two failures is read on the third try": (2, 7, [0.5, 1.0]),
    "a store that never answers fails after the budget": (99, None, [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 6.5]),
}


@pytest.mark.parametrize("case", RUNS)
def test_retried(case: str) -> None:
    failures, want, waits = RUNS[case]
    clock = _Clock()
    calls = 0

    def op() -> int:
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise ConnectionRefusedError(111, "Connection refused")
        return 7

    if want is None:
        with pytest.raises(StoreUnreachable) as err:
            retried(op, "list s3://b/p/", POLICY, sleep=clock.sleep, clock=lambda: clock.now)
        # The error names what could not be done, how long it was tried, the setting, and the cause.
        text = str(err.value)
        assert "cannot list s3://b/p/ after 8 tries in 30 s" in text, text
        assert "ETJ_CHECKPOINT_STORE_TIMEOUT_S=30" in text and "Connection refused" in text, text
    else:
        assert retried(op, "list s3://b/p/", POLICY, sleep=clock.sleep, clock=lambda: clock.now) == want
    assert clock.sleeps == waits

"""Waiting for a condition in the trainer tests (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(pred: Callable[[], object], timeout: float = 30.0, every: float = 0.05) -> None:
    """Poll ``pred`` every ``every`` seconds until it is true; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(every)

"""Bounded crash loops: an agent restarts crashed workers only while the job makes progress.

torch elastic restarts a failed worker group up to ``max_restarts`` times, and every membership change of
ours goes through that path too (a peer's graceful leave makes the survivors exit ``EXIT_RESIZE``), so the
agent ran with ``max_restarts`` = 1,000,000: a deterministic error (a bad data path, a corrupt JPEG, a bad
setting) restarted forever inside the pod while the job looked healthy.

Here only *crashes* count, and only while nothing advances:

- a failure whose exit codes are all 0 or ``EXIT_RESIZE`` is a membership change, not a crash;
- a failure while the rendezvous store is lost (store_link.py) is not counted either: the store is not the
  trainer's fault, and its loss is a non-event;
- a crash after the job's step advanced since the previous crash starts the count again at 1 (a node
  crashing now and then, or a peer killed by a spot reclaim, is not a loop);
- the ``max_crashes + 1``-th crash in a row without progress gives up: the agent exits 1, the pod fails, and
  the job's failure budget (``failurePolicy.maxFailures``) decides.

Progress is the (epoch, step) of the job's progress document (rank 0 reports it about once a second). A
stock torchrun script (``ETJ_LAUNCHER=Torchrun``) reports no step, and every leave or kill of a peer crashes
its survivors (their collective fails) before the agent restarts them: there, a worker group that trained at
least ``STOCK_RUN_PROGRESS_S`` before it failed counts as progress (``stock_progress``). A deterministic
error fails within seconds of every start, so it still ends the loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from etj_contract.progress import MAX_ERROR_CHARS

EXIT_RESIZE = 75  # trainer.EXIT_RESIZE (kept here so the agent needs no trainer import to count)
DEFAULT_MAX_CRASHES = 3


STOCK_RUN_PROGRESS_S = 30.0

Progress = tuple[int, int]  # (epoch, step)


def stock_progress(long_runs: int, ran_s: float, min_run_s: float = STOCK_RUN_PROGRESS_S) -> Progress:
    """The progress of a stock script's job after a worker group that ran ``ran_s`` failed: the count of
    groups that ran at least ``min_run_s`` (``long_runs`` before this one), as a step of epoch 0."""
    return (0, long_runs + (1 if ran_s >= min_run_s else 0))


@dataclass(frozen=True)
class CrashCount:
    in_a_row: int = 0  # crashes since the job last advanced
    progress: Progress | None = None  # where the job was at the last counted crash


@dataclass(frozen=True)
class Verdict:
    count: CrashCount
    crash: bool  # counted as a crash (False: a membership change, or the store's loss)
    give_up: bool  # the agent stops restarting; its pod fails


def is_crash(exit_codes: Iterable[int]) -> bool:
    """A failed worker group crashed unless every worker exited 0 or asked for a re-rendezvous."""
    return any(code not in (0, EXIT_RESIZE) for code in exit_codes)


def after_failure(
    count: CrashCount,
    exit_codes: Iterable[int],
    progress: Progress | None,
    *,
    store_lost: bool,
    max_crashes: int = DEFAULT_MAX_CRASHES,
) -> Verdict:
    """What a worker-group failure means for the crash count (pure)."""
    if store_lost or not is_crash(exit_codes):
        return Verdict(count, crash=False, give_up=False)
    advanced = progress is not None and (count.progress is None or progress > count.progress)
    in_a_row = 1 if advanced else count.in_a_row + 1
    new = CrashCount(in_a_row, progress if progress is not None else count.progress)
    return Verdict(new, crash=True, give_up=in_a_row > max_crashes)


def error_line(message: object, worker: str = "") -> str:
    """The last line of a worker's error message, for the progress document (one line, bounded).

    ``message`` is torch's ``ProcessFailure.message``: a string, or for an error recorded by the worker
    the error file's ``{"message": "Type: text", "extraInfo": {...traceback...}}``."""
    if isinstance(message, dict):
        message = message.get("message", "")
    message = str(message or "")
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else "worker failed"
    text = f"{worker}: {line}" if worker else line
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"

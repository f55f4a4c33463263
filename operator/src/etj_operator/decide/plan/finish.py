"""Has training finished, and has its final report been read? (pure; the planner's terminal step)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from etj_operator.decide.plan.model import Observed
from etj_operator.observe.pods import PodInfo

FINAL_REPORT_MISSING = "FinalReportMissing"


@dataclass(frozen=True)
class Finish:
    done: bool = False  # the job has Succeeded
    awaiting_report: bool = False  # workers exited 0 but their final report is not read yet
    report_missing: str = ""  # done without the final report: the Warning's message


def finish(workers: Sequence[PodInfo], obs: Observed) -> Finish:
    """Has training finished, and has its final report (accuracy, last resizes) been read?

    Only a worker that exited 0 by itself (not one we are deleting) finishes the job. Rank 0 posts the
    final report before any worker can exit, so it is normally in the store by then: the job is Succeeded
    once that report is read, or after ``obs.final_report_grace`` without it (with a Warning).
    """
    reported = bool(obs.progress and obs.progress.get("finished"))
    exited = [p for p in workers if p.exited_ok]
    if not exited:
        # A report alone never finishes the job: it is only as trustworthy as whoever reached the store
        # (docs/operator.md, "Threat model"); a worker the operator started must exit 0 as well.
        return Finish()
    if reported or obs.final_report_grace <= timedelta(0):
        return Finish(done=True)
    since = min((p.finished_at for p in exited if p.finished_at is not None), default=None)
    if since is not None and obs.now - since < obs.final_report_grace:
        return Finish(awaiting_report=True)
    return Finish(
        done=True,
        report_missing=(
            f"workers exited 0 but the trainer's final report (accuracy, last resizes) was not read within "
            f"{obs.final_report_grace.total_seconds():.0f} s; status.progress is from the last report read"
        ),
    )

"""A job whose spec the operator's own model refuses: say so on the job, not only in the log (issue 37).

The apiserver validates the same rules, so this happens when the installed CRD is newer than the operator
(a new field with a default: pydantic's "Extra inputs are not permitted"). The job may be fine once the
operator is upgraded, so it is not failed and its pods are left alone: Ready goes False with reason
InvalidSpec and the error, and one Warning Event is posted per distinct error. Pure, on the status as raw
dicts: the write must not need the spec model (which just refused the job) nor the status model (which a
newer CRD may have outgrown too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from etj_operator.api.models import Condition, ConditionStatus, ConditionType
from etj_operator.decide.types import KubeEvent

INVALID_SPEC = "InvalidSpec"
MAX_MESSAGE = 1000  # an Event's message is cut there too (k8s/status_write.py)


def spec_error_message(errors: Sequence[Mapping[str, Any]]) -> str:
    """pydantic's errors, compact: "spec.a.b: message" for each, "; "-joined (no input values: a spec may
    hold what its author would not have quoted in an Event)."""
    parts = [
        f"spec.{'.'.join(str(part) for part in e.get('loc') or ())}: {e.get('msg', '')}".replace(
            "spec.: ", "spec: "
        )
        for e in errors
    ]
    return f"the operator cannot read this job's spec ({'; '.join(parts)}): an operator older than the CRD?"[
        :MAX_MESSAGE
    ]


def invalid_spec_status(
    conditions: Sequence[Mapping[str, Any]],
    message: str,
    generation: int | None,
    now: datetime,
    said: str | None = None,
) -> tuple[list[dict[str, Any]], KubeEvent] | None:
    """The job's conditions with Ready False, reason InvalidSpec, and the Warning Event to post; None when
    this error was said already: Ready says exactly this (the memo that outlives the operator), or ``said``
    is it (the operator's own memo of what it last said for this job: the job it reads may predate its own
    write, and under load the next round read the old conditions and said it again, issue 37)."""
    if said == message:
        return None
    ready = next((c for c in conditions if c.get("type") == ConditionType.READY), None)
    if ready and (ready.get("reason"), ready.get("message"), ready.get("status")) == (
        INVALID_SPEC,
        message,
        ConditionStatus.FALSE,
    ):
        return None
    still_false = ready is not None and ready.get("status") == ConditionStatus.FALSE
    since = ready.get("lastTransitionTime") if still_false and ready else None
    new = Condition(
        type=ConditionType.READY,
        status=ConditionStatus.FALSE,
        reason=INVALID_SPEC,
        message=message,
        observed_generation=generation,
        last_transition_time=since or now,
    ).to_dict()
    kept = [dict(c) for c in conditions if c.get("type") != ConditionType.READY]
    return [new, *kept], KubeEvent("Warning", INVALID_SPEC, message)

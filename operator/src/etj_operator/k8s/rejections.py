"""The apiserver's refusals of the loop's creates: a 4xx that retrying will not change, told apart from
other errors (the Ready condition and a Warning Event carry its message)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.rest import ApiException

from etj_operator.decide.status.conditions import ConditionReason
from etj_operator.k8s.client import ForeignObject


def rejections(outcomes: list[Any]) -> tuple[str | None, list[BaseException]]:
    """The apiserver's refusal among the creates' outcomes (quota, admission, validation: a 4xx that
    retrying will not change), and the other errors, which fail the reconcile as before."""
    rejection: str | None = None
    errors: list[BaseException] = []
    for outcome in outcomes:
        if isinstance(outcome, ApiException) and outcome.status in (400, 403, 422):
            rejection = rejection or _api_message(outcome)
        elif isinstance(outcome, ForeignObject):  # retrying will not change it either, until someone acts
            rejection = rejection or f"{ConditionReason.OBJECT_CONFLICT}: {outcome}"
        elif isinstance(outcome, BaseException):
            errors.append(outcome)
    return rejection, errors


def _api_message(exc: ApiException) -> str:
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or exc.reason or exc.status)[:1000]

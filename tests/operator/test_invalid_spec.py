"""A spec the operator's model refuses becomes Ready False, reason InvalidSpec, and one Warning Event per
distinct error (issue 37 item 5: it was a log line every 30 s and empty `kubectl get etj` columns)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from etj_operator.api.models import ElasticTrainingJobSpec
from etj_operator.decide.status.invalid_spec import INVALID_SPEC, invalid_spec_status, spec_error_message

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
BEFORE = "2026-01-01T00:00:00Z"
MESSAGE = "the operator cannot read this job's spec (spec.newField: Extra inputs are not permitted)"


def _ready(status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": BEFORE,
    }


OTHER = {"type": "Suspended", "status": "False", "reason": "NotSuspended", "lastTransitionTime": BEFORE}
CASES: dict[str, tuple[list[dict[str, Any]], str | None]] = {
    # name: (the job's conditions, the new Ready's lastTransitionTime; None: nothing written, no Event)
    "a new job, no conditions": ([], "2026-01-02T03:04:05Z"),
    "a running job (Ready True): a transition": (
        [_ready("True", "MinWorkersRunning"), OTHER],
        "2026-01-02T03:04:05Z",
    ),
    "Ready already False for another reason: its time kept": (
        [OTHER, _ready("False", "WaitingForWorkers")],
        BEFORE,
    ),
    "a different error than the one said": ([_ready("False", INVALID_SPEC, "an older error")], BEFORE),
    "the same error said already": ([OTHER, _ready("False", INVALID_SPEC, MESSAGE)], None),
}


@pytest.mark.parametrize("case", CASES)
def test_ready_false_and_one_event_per_distinct_error(case: str) -> None:
    conditions, since = CASES[case]
    found = invalid_spec_status(conditions, MESSAGE, 4, NOW)
    if since is None:
        assert found is None
        return
    assert found is not None
    written, event = found
    ready = [c for c in written if c["type"] == "Ready"]
    assert ready == [
        {
            "type": "Ready",
            "status": "False",
            "reason": INVALID_SPEC,
            "message": MESSAGE,
            "observedGeneration": 4,
            "lastTransitionTime": since,
        }
    ]
    assert [c for c in written if c["type"] != "Ready"] == [c for c in conditions if c["type"] != "Ready"]
    assert (event.type, event.reason, event.message) == ("Warning", INVALID_SPEC, MESSAGE)


def test_the_message_names_each_field_and_quotes_no_value() -> None:
    spec = {"replicas": {"min": 1, "max": "two"}, "newField": "a value its author keeps to themselves"}
    with pytest.raises(ValidationError) as caught:
        ElasticTrainingJobSpec.model_validate(spec)
    message = spec_error_message(caught.value.errors())
    assert message.startswith("the operator cannot read this job's spec (")
    assert "spec.newField: Extra inputs are not permitted" in message
    assert "spec.replicas.max: " in message
    assert "keeps to themselves" not in message
    many = [{"loc": ("f",), "msg": "x" * 300}] * 10
    assert len(spec_error_message(many)) == 1000


def test_the_operators_memo_holds_when_the_job_it_reads_predates_its_write() -> None:
    """Under load the next round read the job from before the condition's write (the watch lags) and said
    the same error again: two Warning Events (issue 37). The operator's memo of what it said answers."""
    stale = [_ready("True", "MinWorkersRunning")]
    assert invalid_spec_status(stale, MESSAGE, 4, NOW, said=MESSAGE) is None
    assert invalid_spec_status(stale, MESSAGE, 4, NOW, said="an older error") is not None


def test_one_event_per_distinct_error_over_rounds_of_a_lagging_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    import kopf

    from etj_operator.k8s.reconciler import JobRunner
    from etj_operator.k8s.settings import Settings
    from etj_operator.k8s.store_client import StoreClient
    from tests.operator.factories import spec
    from tests.operator.test_reconciler import RecordingKube, StaticWorld

    said: list[str] = []
    monkeypatch.setattr(kopf, "event", lambda *a, **kw: said.append(kw["message"]))
    kube = RecordingKube()
    runner = JobRunner("ns", "train", StaticWorld([]), kube, Settings(progress_seconds=0), StoreClient())
    valid = spec().model_dump(mode="json", by_alias=True, exclude_none=True)
    meta = {"name": "train", "namespace": "ns", "uid": "u", "generation": 1}

    async def rounds() -> None:
        for extra, times in [("newField", 3), ("otherField", 2)]:
            for _ in range(times):
                # The same body each round: the watch has not brought the job back with its condition.
                runner.body = {"metadata": meta, "spec": {**valid, extra: 1}, "status": {}}
                await runner.reconcile()

    asyncio.run(rounds())
    assert len(said) == 2, said  # one per distinct error, not one per round
    assert "spec.newField" in said[0] and "spec.otherField" in said[1]
    assert [p["conditions"][0]["reason"] for p in kube.patches] == ["InvalidSpec", "InvalidSpec"]

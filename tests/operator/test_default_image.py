"""The operator's default trainer image (chart value trainer.image → ETJ_DEFAULT_TRAINER_IMAGE →
`--default-trainer-image`) for jobs whose spec names none: plain objects, no Kubernetes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from etj_operator.api.models import ConditionType, ElasticTrainingJobSpec, ElasticTrainingJobStatus, Phase
from etj_operator.decide.objects import manifests
from etj_operator.decide.plan.planner import JobView, plan, trainer_image
from etj_operator.decide.status.conditions import ConditionReason
from etj_operator.k8s.main import build_state, parse_args
from tests.operator.factories import cluster, job, observe, spec, started, status, store, worker

NO_IMAGE = ConditionReason.NO_TRAINER_IMAGE

DEFAULT = "registry.example.com/etj-trainer:9.9.9"


def _no_image_spec() -> ElasticTrainingJobSpec:
    s = spec()
    return s.model_copy(update={"trainer": s.trainer.model_copy(update={"image": None})})


def _job(default: str | None, st: ElasticTrainingJobStatus | None = None) -> JobView:
    return replace(job(_no_image_spec(), st), default_image=default)


def test_the_api_accepts_a_job_without_an_image() -> None:
    parsed = ElasticTrainingJobSpec.model_validate(
        {
            "trainer": {"resources": {"gpu": 1}},
            "replicas": {"min": 1, "max": 2},
            "training": {"globalBatchSize": 8, "microBatchSize": 4},
        }
    )
    assert parsed.trainer.image is None


def test_resolution_order_spec_then_recorded_then_default() -> None:
    assert trainer_image(replace(job(), default_image=DEFAULT)) == "trainer:1"  # the spec wins
    assert trainer_image(_job(DEFAULT)) == DEFAULT
    recorded = _job(DEFAULT, st=status(trainerImage="old/trainer:1"))
    assert trainer_image(recorded) == "old/trainer:1"  # a changed default does not mix images
    assert trainer_image(_job(None)) is None


def test_a_job_without_image_runs_the_default_and_records_it() -> None:
    result = plan(_job(DEFAULT), observe(cluster(), []))
    assert result.create_workers == [0, 1, 2, 3] and result.create_rendezvous
    assert result.trainer_image == DEFAULT
    assert result.status.trainer_image == DEFAULT
    assert result.status.to_patch()["trainerImage"] == DEFAULT
    s = _no_image_spec()
    pod = manifests.worker_pod(
        s, job="train", namespace="ns", uid="u", token_secret="tok", slot=0, image=result.trainer_image
    )
    assert pod["spec"]["containers"][0]["image"] == DEFAULT
    rdzv = manifests.rendezvous_pod(
        s, job="train", namespace="ns", uid="u", token_secret="tok", image=result.trainer_image
    )
    assert rdzv["spec"]["containers"][0]["image"] == DEFAULT


def test_workers_added_later_keep_the_recorded_image_when_the_default_changed() -> None:
    st = started(3, trainerImage=DEFAULT, resizeHistory=[])
    pods = [worker(i, f"spot-{i}") for i in range(3)] + [store()]
    result = plan(_job("registry.example.com/etj-trainer:10.0.0", st=st), observe(cluster(), pods))
    assert result.create_workers == [3]
    assert result.trainer_image == DEFAULT and result.status.trainer_image == DEFAULT


def test_a_spec_image_is_recorded_too() -> None:
    result = plan(replace(job(), default_image=DEFAULT), observe(cluster(), []))
    assert result.trainer_image == "trainer:1" and result.status.trainer_image == "trainer:1"


def test_without_any_image_nothing_is_created_and_the_user_is_told_once() -> None:
    result = plan(_job(None), observe(cluster(), []))
    assert result.create_workers == [] and not result.create_rendezvous
    assert result.trainer_image is None and result.status.trainer_image is None
    assert result.status.phase == Phase.PENDING
    ready = next(c for c in result.status.conditions if c.type == ConditionType.READY)
    assert (ready.status, ready.reason) == ("False", NO_IMAGE)
    assert "spec.trainer.image" in ready.message and "trainer.image" in ready.message
    warnings = [e for e in result.events if e.type == "Warning" and e.reason == NO_IMAGE]
    assert len(warnings) == 1
    # The next reconcile (status written) does not post the same Warning again.
    again = plan(_job(None, st=result.status), observe(cluster(), []))
    assert not [e for e in again.events if e.reason == NO_IMAGE]
    assert again.status.to_patch() == result.status.to_patch()  # a no-op: nothing to write


def test_a_default_arriving_later_starts_the_waiting_job() -> None:
    waiting = plan(_job(None), observe(cluster(), []))
    result = plan(_job(DEFAULT, st=waiting.status), observe(cluster(), []))
    assert result.create_workers == [0, 1, 2, 3] and result.trainer_image == DEFAULT
    ready = next(c for c in result.status.conditions if c.type == ConditionType.READY)
    assert ready.reason != NO_IMAGE


def test_building_a_pod_without_any_image_is_refused() -> None:
    with pytest.raises(ValueError, match="no trainer image"):
        manifests.worker_pod(
            _no_image_spec(), job="train", namespace="ns", uid="u", token_secret="tok", slot=0
        )


def test_the_operator_reads_the_default_from_the_charts_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETJ_DEFAULT_TRAINER_IMAGE", DEFAULT)
    assert build_state(parse_args([])).settings.default_trainer_image == DEFAULT
    flag = parse_args(["--default-trainer-image", "other:1"])
    assert build_state(flag).settings.default_trainer_image == "other:1"
    monkeypatch.setenv("ETJ_DEFAULT_TRAINER_IMAGE", "")
    assert build_state(parse_args([])).settings.default_trainer_image is None
    monkeypatch.delenv("ETJ_DEFAULT_TRAINER_IMAGE")
    assert build_state(parse_args([])).settings.default_trainer_image is None

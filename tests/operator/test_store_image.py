"""The rendezvous store pod's image (issue 26): spec.trainer.storeImage, else the operator's default store
image (chart value trainer.storeImage → ETJ_DEFAULT_STORE_IMAGE → `--default-store-image`), else the job's
trainer image (the behaviour before the store image existed). Plain objects, no Kubernetes."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from etj_operator.api.models import ElasticTrainingJobSpec
from etj_operator.decide.objects import manifests
from etj_operator.decide.plan.planner import JobView, plan, store_image
from etj_operator.k8s.main import build_state, parse_args
from tests.operator.factories import cluster, job, observe, spec, started, worker

SPEC_STORE = "registry.example.com/etj-store:spec"
DEFAULT_STORE = "registry.example.com/etj-store:2.14.1"
DEFAULT_TRAINER = "registry.example.com/etj-trainer:9.9.9"


def _spec(image: str | None = "trainer:1", store_image: str | None = None) -> ElasticTrainingJobSpec:
    s = spec()
    trainer = s.trainer.model_copy(update={"image": image, "store_image": store_image})
    return s.model_copy(update={"trainer": trainer})


def _job(
    *,
    image: str | None = "trainer:1",
    spec_store: str | None = None,
    default_store: str | None = None,
    default_trainer: str | None = None,
) -> JobView:
    return replace(
        job(_spec(image, spec_store)), default_image=default_trainer, default_store_image=default_store
    )


@dataclass(frozen=True)
class Case:
    name: str
    view: JobView
    store: str | None  # the store pod's image, None: no store pod is created
    trainer: str | None


CASES = [
    Case("nothing set: the trainer image, as before", _job(), "trainer:1", "trainer:1"),
    Case(
        "the operator default beats the trainer image",
        _job(default_store=DEFAULT_STORE),
        DEFAULT_STORE,
        "trainer:1",
    ),
    Case(
        "the spec beats the operator default",
        _job(spec_store=SPEC_STORE, default_store=DEFAULT_STORE),
        SPEC_STORE,
        "trainer:1",
    ),
    Case("the spec alone", _job(spec_store=SPEC_STORE), SPEC_STORE, "trainer:1"),
    Case(
        "the default trainer image when the spec names no image",
        _job(image=None, default_trainer=DEFAULT_TRAINER),
        DEFAULT_TRAINER,
        DEFAULT_TRAINER,
    ),
    Case(
        "the default store image with the default trainer image",
        _job(image=None, default_trainer=DEFAULT_TRAINER, default_store=DEFAULT_STORE),
        DEFAULT_STORE,
        DEFAULT_TRAINER,
    ),
    # A job that cannot run workers (Ready=False/NoTrainerImage) starts no store either, whatever image
    # the store could have had: it would wait for workers that never come.
    Case(
        "no trainer image anywhere: no store",
        _job(image=None, spec_store=SPEC_STORE, default_store=DEFAULT_STORE),
        None,
        None,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_store_image_precedence(case: Case) -> None:
    result = plan(case.view, observe(cluster(), []))
    assert store_image(case.view, result.trainer_image) == case.store
    assert (result.store_image, result.trainer_image) == (case.store, case.trainer)
    assert result.create_rendezvous == (case.store is not None)
    if case.store is None:
        return
    rdzv = manifests.rendezvous_pod(
        case.view.spec, job="train", namespace="ns", uid="u", token_secret="tok", image=result.store_image
    )
    assert rdzv["spec"]["containers"][0]["image"] == case.store
    # Workers never run the store image.
    w = manifests.worker_pod(
        case.view.spec,
        job="train",
        namespace="ns",
        uid="u",
        token_secret="tok",
        slot=0,
        image=result.trainer_image,
    )
    assert w["spec"]["containers"][0]["image"] == case.trainer


def test_the_store_image_is_not_recorded_and_workers_keep_the_recorded_trainer_image() -> None:
    """A replaced store runs the current default; the workers stay on the image the job started with."""
    st = started(3, trainerImage=DEFAULT_TRAINER, resizeHistory=[])
    pods = [worker(i, f"spot-{i}") for i in range(3)]  # the store pod is gone
    view = _job(
        image=None, default_trainer="registry.example.com/etj-trainer:10.0.0", default_store=DEFAULT_STORE
    )
    result = plan(replace(view, status=st), observe(cluster(), pods))
    assert result.create_rendezvous and result.store_image == DEFAULT_STORE
    assert result.create_workers == [3] and result.trainer_image == DEFAULT_TRAINER
    assert "storeImage" not in result.status.to_patch()


def test_a_store_pod_built_without_a_resolved_image_takes_the_specs_store_image() -> None:
    rdzv = manifests.rendezvous_pod(
        _spec(store_image=SPEC_STORE), job="train", namespace="ns", uid="u", token_secret="tok"
    )
    assert rdzv["spec"]["containers"][0]["image"] == SPEC_STORE
    assert rdzv["spec"]["containers"][0]["command"][:2] == ["etj-train", "store"]


def test_the_api_accepts_and_bounds_store_image() -> None:
    base = {
        "trainer": {"image": "t:1", "storeImage": SPEC_STORE},
        "replicas": {"min": 1, "max": 2},
        "training": {"globalBatchSize": 8, "microBatchSize": 4},
    }
    assert ElasticTrainingJobSpec.model_validate(base).trainer.store_image == SPEC_STORE
    with pytest.raises(ValueError, match="storeImage"):
        ElasticTrainingJobSpec.model_validate({**base, "trainer": {"image": "t:1", "storeImage": ""}})


def test_the_operator_reads_the_default_store_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETJ_DEFAULT_STORE_IMAGE", DEFAULT_STORE)
    assert build_state(parse_args([])).settings.default_store_image == DEFAULT_STORE
    flag = parse_args(["--default-store-image", "other:1"])
    assert build_state(flag).settings.default_store_image == "other:1"
    monkeypatch.setenv("ETJ_DEFAULT_STORE_IMAGE", "")
    assert build_state(parse_args([])).settings.default_store_image is None
    monkeypatch.delenv("ETJ_DEFAULT_STORE_IMAGE")
    assert build_state(parse_args([])).settings.default_store_image is None

"""The pydantic models: defaults, camelCase round trip, status patches, and the same rejections as the CRD."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from etj_operator.api.models import (
    MAX_RESIZE_HISTORY,
    CapacityType,
    Condition,
    ConditionStatus,
    ElasticTrainingJob,
    ElasticTrainingJobSpec,
    ElasticTrainingJobStatus,
    Phase,
    Progress,
    ResizeEvent,
    ResizePolicy,
    set_condition,
)
from tests.api.cases import CASES, Case, valid_job

REPO = Path(__file__).resolve().parents[2]
# Every ElasticTrainingJob under examples/ (examples/*/job.yaml too; not the Kueue queues beside one).
EXAMPLES = sorted(
    p for p in (REPO / "examples").rglob("*.yaml") if "kind: ElasticTrainingJob" in p.read_text().splitlines()
)


def _loc_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in part or ("-" in part and not part.isidentifier()):
            continue  # pydantic's union/validator branch tags, not field names
        else:
            out += f".{part}" if out else part
    return out


def test_minimal_spec_gets_every_default() -> None:
    spec = ElasticTrainingJobSpec.model_validate(valid_job()["spec"])
    assert spec.trainer.command == ["etj-train", "worker"]
    assert spec.training.resize_policy is ResizePolicy.FIXED_GLOBAL_BATCH
    assert spec.training.dynamic_sgd.ramp_steps == 1000
    assert spec.placement.capacity_types == [CapacityType.SPOT, CapacityType.ON_DEMAND]
    # The rendezvous store must survive spot interruptions unless the user opts in.
    assert spec.placement.rendezvous.capacity_types == [CapacityType.ON_DEMAND]
    assert spec.checkpoint.location == "/checkpoints"
    assert (spec.scaling.cooldown_seconds, spec.scaling.scale_up_delay_seconds) == (60, 30)
    assert spec.failure_policy.max_failures == 5
    assert spec.suspend is False and spec.ttl_seconds_after_finished is None
    assert spec.procs_per_worker == 1


def test_camel_case_round_trip_and_snake_case_construction() -> None:
    spec = ElasticTrainingJobSpec.model_validate(valid_job()["spec"])
    wire = spec.to_dict()
    assert wire["training"]["globalBatchSize"] == 64
    assert wire["training"]["dynamicSGD"] == {"rampSteps": 1000}
    assert "global_batch_size" not in str(wire)
    assert ElasticTrainingJobSpec.model_validate(wire) == spec
    # The operator may also build specs in Python with snake_case names.
    built = ElasticTrainingJobSpec(
        trainer={"image": "img"},
        replicas={"min": 1, "max": 2},
        training={"global_batch_size": 8, "micro_batch_size": 4},
    )
    assert built.training.global_batch_size == 8


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_parse(path: Path) -> None:
    job = ElasticTrainingJob.model_validate(yaml.safe_load(path.read_text()))
    assert job.spec.replicas.min <= job.spec.replicas.max
    assert job.spec.training.global_batch_size >= job.spec.replicas.max * job.spec.procs_per_worker


def test_demo_example_matches_the_issue() -> None:
    job = ElasticTrainingJob.model_validate(yaml.safe_load((REPO / "examples/demo-cpu.yaml").read_text()))
    assert (job.spec.replicas.min, job.spec.replicas.max) == (1, 4)
    assert job.spec.trainer.resources.gpu == 1
    assert job.spec.trainer.command == ["etj-train", "worker"]


def test_eks_example_uses_spot_and_on_demand_with_store_on_demand() -> None:
    job = ElasticTrainingJob.model_validate(yaml.safe_load((REPO / "examples/eks-resnet50.yaml").read_text()))
    assert set(job.spec.placement.capacity_types) == {CapacityType.SPOT, CapacityType.ON_DEMAND}
    assert job.spec.placement.rendezvous.capacity_types == [CapacityType.ON_DEMAND]
    assert job.spec.trainer.resources.gpu == 8 and job.spec.procs_per_worker == 8
    # Pass-through volume sources survive parsing unchanged.
    assert job.spec.trainer.volumes[0].to_dict()["persistentVolumeClaim"]["claimName"] == "imagenet-fsx"


@pytest.mark.parametrize("case", [c for c in CASES if not c.apiserver_only], ids=lambda c: c.id)
def test_pydantic_rejects_bad_manifest(case: Case) -> None:
    with pytest.raises(ValidationError) as err:
        ElasticTrainingJob.model_validate(case.manifest())
    errors = err.value.errors()
    located = [(_loc_path(e["loc"]), e["msg"]) for e in errors]
    why = (case.pydantic_why or case.why).lower()
    # The error sits on the field (or the object holding it, for cross-field rules) and says why.
    assert any(
        path.startswith("spec") and case.field.startswith(path) and why in msg.lower()
        for path, msg in located
    ), located


def test_quantities_accept_kubernetes_forms() -> None:
    for value in (2, "2", "500m", "1.5", "16Gi", "1e3", "0"):
        spec = valid_job()["spec"]
        spec["trainer"]["resources"]["memory"] = value
        assert ElasticTrainingJobSpec.model_validate(spec).trainer.resources.memory == value


def test_user_trainer_settings_with_etj_prefix_are_allowed() -> None:
    spec = valid_job()["spec"]
    spec["trainer"]["env"] = [
        {"name": "ETJ_MODEL", "value": "resnet50"},
        {"name": "ETJ_IMAGE_SIZE", "value": "224"},
    ]
    assert [e.name for e in ElasticTrainingJobSpec.model_validate(spec).trainer.env] == [
        "ETJ_MODEL",
        "ETJ_IMAGE_SIZE",
    ]


NOW = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def test_status_patch_is_camel_case_with_full_lists() -> None:
    status = ElasticTrainingJobStatus(
        phase=Phase.RUNNING,
        desired_replicas=4,
        current_replicas=3,
        world_size=3,
        per_worker_batch=22,
        accumulation_steps=2,
        lr_multiplier=1.0,
        progress=Progress(epoch=1, step=120, samples_seen=7680, samples_per_second=410.5, loss=0.31),
    )
    status.conditions = set_condition(status.conditions, "Ready", True, "Training", "3 of 4 workers", now=NOW)
    status.add_resize(ResizeEvent(time=NOW, from_=4, to=3, reason="SpotInterruption", pause_seconds=4.2))
    patch = status.to_patch()
    assert patch["workers"] == "3/4"
    assert patch["progress"]["samplesPerSecond"] == 410.5
    assert patch["perWorkerBatch"] == 22 and patch["lrMultiplier"] == 1.0
    # metav1.Time: RFC 3339, UTC, whole seconds.
    assert patch["conditions"][0]["lastTransitionTime"] == "2025-01-02T03:04:05Z"
    assert patch["resizeHistory"] == [
        {
            "time": "2025-01-02T03:04:05Z",
            "from": 4,
            "to": 3,
            "reason": "SpotInterruption",
            "pauseSeconds": 4.2,
        }
    ]
    assert "startTime" not in patch  # unset fields are left alone by the merge patch
    assert ElasticTrainingJobStatus.model_validate(patch).resize_history[0].from_ == 4


def test_empty_lists_are_still_written_so_a_merge_patch_clears_them() -> None:
    patch = ElasticTrainingJobStatus(phase=Phase.PENDING).to_patch()
    assert patch["conditions"] == [] and patch["resizeHistory"] == []


def test_set_condition_moves_transition_time_only_on_status_change() -> None:
    later = NOW + timedelta(minutes=5)
    conds = set_condition([], "Ready", False, "Waiting", now=NOW)
    conds = set_condition(conds, "Ready", False, "StillWaiting", "no capacity", now=later)
    assert conds[0].last_transition_time == NOW and conds[0].reason == "StillWaiting"
    conds = set_condition(conds, "Ready", ConditionStatus.TRUE, "Training", generation=3, now=later)
    assert conds[0].last_transition_time == later and conds[0].observed_generation == 3
    conds = set_condition(conds, "Resizing", True, "SpotInterruption", now=later)
    assert [c.type for c in conds] == ["Ready", "Resizing"]


def test_condition_reason_must_be_camel_case() -> None:
    with pytest.raises(ValidationError):
        Condition(type="Ready", status="True", reason="not a reason", last_transition_time=NOW)


def test_resize_history_is_bounded() -> None:
    status = ElasticTrainingJobStatus()
    for i in range(MAX_RESIZE_HISTORY + 5):
        status.add_resize(ResizeEvent(time=NOW, from_=i, to=i + 1))
    assert len(status.resize_history) == MAX_RESIZE_HISTORY
    assert status.resize_history[0].from_ == 5  # the oldest were dropped


def test_status_parsing_tolerates_unknown_fields() -> None:
    # A newer operator may write fields this one does not know; reading them must not fail.
    status = ElasticTrainingJobStatus.model_validate({"phase": "Running", "somethingNew": 1})
    assert status.phase is Phase.RUNNING


def test_deadline_and_prices_default_to_todays_behaviour() -> None:
    spec = ElasticTrainingJob.model_validate(valid_job()).spec
    assert spec.deadline is None  # no deadline: no on-demand workers added for a schedule
    assert spec.prices.spot_per_hour is None and spec.prices.on_demand_per_hour is None


def test_deadline_forms_parse() -> None:
    doc = valid_job()
    doc["spec"]["deadline"] = {"withinSeconds": 7200, "maxOnDemandWorkers": 3}
    d = ElasticTrainingJob.model_validate(doc).spec.deadline
    assert d is not None and (d.within_seconds, d.max_on_demand_workers, d.finish_by) == (7200, 3, None)
    doc["spec"]["deadline"] = {"finishBy": "2026-12-04T17:00:00Z"}
    d = ElasticTrainingJob.model_validate(doc).spec.deadline
    assert d is not None and d.finish_by is not None and d.finish_by.hour == 17
    assert d.to_dict() == {"finishBy": "2026-12-04T17:00:00Z"}

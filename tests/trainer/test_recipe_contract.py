"""One source of truth: spec.training's recipe -> the operator's ETJ_* env -> trainer config and flags."""

from __future__ import annotations

from etj_operator.api.models import TrainingSpec
from etj_operator.decide.objects.pod_env import recipe_env
from etj_trainer import cli
from etj_trainer.batching.schedule import LrSchedule, ScheduleType
from etj_trainer.config import TrainConfig
from etj_trainer.data.augment import Augmentation

RESNET50 = {
    "globalBatchSize": 8192,
    "microBatchSize": 256,
    "epochs": 90,
    "optimizer": {
        "lrPer256": 0.1,
        "nesterov": True,
        "weightDecay": 1e-4,
        "labelSmoothing": 0.1,
    },
    "lrSchedule": {"warmupEpochs": 5, "type": "step", "milestones": [30, 60, 80]},
    "precision": "bf16",
    "augmentation": {"type": "standard", "validationResize": 256},
}


def _config(training: dict[str, object]) -> TrainConfig:
    spec = TrainingSpec.model_validate(training)
    env = {k.name: str(v) for k, v in recipe_env(spec).items()}
    return TrainConfig.from_env({**env, "ETJ_EPOCHS": str(spec.epochs)})


def test_resnet50_recipe_reaches_the_trainer() -> None:
    cfg = _config(RESNET50)
    assert cfg.lr == 3.2  # 0.1 x 8192 / 256
    assert (cfg.momentum, cfg.nesterov, cfg.weight_decay, cfg.no_wd_norm_bias) == (0.9, True, 1e-4, True)
    assert cfg.label_smoothing == 0.1
    assert cfg.schedule() == LrSchedule(
        ScheduleType.STEP, epochs=90, warmup_epochs=5, milestones=(30, 60, 80), gamma=0.1
    )
    assert (cfg.precision, cfg.augment, cfg.val_resize, cfg.min_crop_scale, cfg.augment_flip) == (
        "bf16",
        Augmentation.STANDARD,
        256,
        0.08,
        True,
    )


def test_a_job_can_turn_the_flip_off() -> None:
    digits = {"globalBatchSize": 64, "microBatchSize": 32, "augmentation": {"type": "standard"}}
    assert _config(digits).augment_flip
    digits["augmentation"] = {"type": "standard", "horizontalFlip": False}
    assert not _config(digits).augment_flip


def test_defaults_keep_the_old_behaviour_but_for_the_lr_rule() -> None:
    cfg = _config({"globalBatchSize": 64, "microBatchSize": 16})
    assert cfg.lr == 0.1 * 64 / 256  # unset: lrPer256 = 0.1
    assert cfg.schedule() == LrSchedule(epochs=1)  # constant, no warm-up
    assert (cfg.precision, cfg.augment, cfg.val_resize, cfg.weight_decay) == ("fp32", Augmentation.NONE, 0, 0)
    assert not cfg.nesterov and cfg.no_wd_norm_bias


def test_trainer_flags_set_the_same_variables() -> None:
    spec_env = {v.name: str(x) for v, x in recipe_env(TrainingSpec.model_validate(RESNET50)).items()}
    # every recipe variable the operator sets has an etj-train flag of the same meaning
    assert set(spec_env) <= set(cli.TRAIN_FLAGS.values())
    ap = cli.argparse.ArgumentParser()
    cli._add_train_flags(ap)
    ns = ap.parse_args(
        ["--lr-schedule", "step", "--lr-milestones", "30,60,80", "--nesterov", "--no-wd-norm-bias", "false",
         "--precision", "bf16", "--augment", "standard", "--warmup-epochs", "5"]
    )  # fmt: skip
    cfg = TrainConfig.from_env({**cli._train_env(ns), "ETJ_EPOCHS": "90"})
    assert cfg.schedule() == LrSchedule(
        ScheduleType.STEP, epochs=90, warmup_epochs=5, milestones=(30, 60, 80)
    )
    assert cfg.nesterov and not cfg.no_wd_norm_bias and cfg.precision == "bf16"

"""Resize equivalence: a run whose world size goes 2 -> 3 -> 1 -> 2 ends with the same parameters as a fixed
2-worker run (real trainer, real gloo process groups, handing over through checkpoints as a resize does)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from etj_testbed.worldsim import run_world
from etj_trainer.checkpoint.store import load_latest
from etj_trainer.config import TrainConfig


def _final_params(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    loaded = load_latest(ckpt_dir)
    assert loaded is not None
    return dict(loaded.state["model"])


def test_elastic_run_matches_fixed_run(tiny_cfg: TrainConfig, tmp_path: Path) -> None:
    total = 110  # > 100 steps, crossing two epoch boundaries (1438 samples / 32 per step)
    fixed = replace(tiny_cfg, max_steps=total, checkpoint_dir=tmp_path / "fixed", local_checkpoint_dir=None)
    run_world(fixed, 2)

    elastic = replace(tiny_cfg, checkpoint_dir=tmp_path / "elastic", local_checkpoint_dir=tmp_path / "shm")
    for world, until in ((2, 25), (3, 50), (1, 80), (2, total)):
        run_world(replace(elastic, max_steps=until), world)

    a, b = _final_params(tmp_path / "fixed"), _final_params(tmp_path / "elastic")
    loaded = load_latest(tmp_path / "elastic")
    assert loaded is not None and loaded.step == total
    assert [(r["from"], r["to"]) for r in loaded.state["meta"]["resizes"]] == [(2, 3), (3, 1), (1, 2)]
    num = max(float((a[k] - b[k]).abs().max()) for k in a)
    den = max(float(a[k].abs().max()) for k in a)
    assert num / den <= 1e-4, f"max relative difference {num / den:.3e}"
    # and training really moved the parameters (the comparison is not between two untouched inits)
    torch.manual_seed(tiny_cfg.seed)
    from etj_trainer.classifier.models import build_model

    init = build_model(tiny_cfg.model, 10).double().state_dict()
    assert max(float((a[k] - init[k]).abs().max()) for k in a) > 1e-2


def _max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = max(float((a[k] - b[k]).abs().max()) for k in a)
    return num / max(float(a[k].abs().max()) for k in a)


def test_elastic_run_matches_fixed_run_with_the_full_recipe(tiny_cfg: TrainConfig, tmp_path: Path) -> None:
    """Augmentation, warm-up + cosine, Nesterov, weight decay (not on biases), label smoothing: an elastic run
    whose resizes fall in warm-up (step 25 of 45) and in the decay (50, 80) ends with the fixed run's
    parameters (float64, <= 1e-9 relative) after training on the same LR at every step."""
    from etj_trainer.batching.schedule import ScheduleType
    from etj_trainer.core.sample_log import lr_per_step
    from etj_trainer.data.augment import Augmentation

    total = 110
    recipe = replace(
        tiny_cfg,
        augment=Augmentation.STANDARD,
        min_crop_scale=0.3,
        lr_schedule=ScheduleType.COSINE,
        warmup_epochs=1.0,
        lr_final_fraction=0.05,
        nesterov=True,
        weight_decay=1e-3,
        label_smoothing=0.1,
    )
    fixed = replace(
        recipe,
        max_steps=total,
        checkpoint_dir=tmp_path / "fixed",
        local_checkpoint_dir=None,
        sample_log_dir=tmp_path / "fixed-log",
    )
    run_world(fixed, 2)
    elastic = replace(
        recipe,
        checkpoint_dir=tmp_path / "elastic",
        local_checkpoint_dir=tmp_path / "shm",
        sample_log_dir=tmp_path / "elastic-log",
    )
    for world, until in ((2, 25), (3, 50), (1, 80), (2, total)):
        run_world(replace(elastic, max_steps=until), world)

    lr_fixed, lr_elastic = lr_per_step(tmp_path / "fixed-log"), lr_per_step(tmp_path / "elastic-log")
    assert list(lr_fixed) == list(range(1, total + 1))
    assert lr_elastic == lr_fixed  # exactly: the schedule reads the samples seen, not the world
    assert lr_fixed[1] < lr_fixed[25] < lr_fixed[45] and lr_fixed[50] > lr_fixed[80] > lr_fixed[total]
    rel = _max_rel_diff(_final_params(tmp_path / "fixed"), _final_params(tmp_path / "elastic"))
    assert rel <= 1e-9, f"max relative difference {rel:.3e}"


def test_fp16_grad_scaler_state_survives_a_checkpoint(tiny_cfg: TrainConfig, tmp_path: Path) -> None:
    """The GradScaler's scale is checkpointed and restored (a resize must not reset it to 65536)."""
    from etj_trainer.checkpoint.store import CheckpointStore
    from etj_trainer.classifier.trainer import train

    cfg = replace(tiny_cfg, precision="fp16", dtype="float32", local_checkpoint_dir=None, max_steps=3)
    first = train(cfg)
    assert first.step == 3
    loaded = load_latest(tmp_path / "ckpt")
    assert loaded is not None and "scaler" in loaded.state
    assert loaded.state["scaler"]["scale"] > 0
    # A scale no fresh scaler has: if the restart did not restore it, the next checkpoint would show 65536
    # (or a power of two near it after overflow back-offs), never 3 x 2^k.
    state = dict(loaded.state)
    state["scaler"] = {**state["scaler"], "scale": 3.0 * 1024, "_growth_tracker": 7}
    CheckpointStore(tmp_path / "ckpt", None).save(state, 3, shared=True)
    second = train(replace(cfg, max_steps=5))
    assert second.step == 5
    after = load_latest(tmp_path / "ckpt")
    assert after is not None
    scale = after.state["scaler"]["scale"]
    assert scale in (3.0 * 1024, 3.0 * 512, 3.0 * 256), scale
    if scale == 3.0 * 1024:
        assert after.state["scaler"]["_growth_tracker"] == 9  # two more good steps counted on top of 7

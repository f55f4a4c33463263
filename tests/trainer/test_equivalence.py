"""Resize equivalence: a run whose world size goes 2 -> 3 -> 1 -> 2 ends with the same parameters as a fixed
2-worker run (real trainer, real gloo process groups, handing over through checkpoints as a resize does)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from etj_trainer.checkpoint import load_latest
from etj_trainer.config import TrainConfig
from etj_trainer.worldsim import run_world


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
    from etj_trainer.models import build_model

    init = build_model(tiny_cfg.model, 10).double().state_dict()
    assert max(float((a[k] - init[k]).abs().max()) for k in a) > 1e-2

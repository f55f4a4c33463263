from __future__ import annotations

from pathlib import Path

import pytest
import torch

from etj_trainer.config import TrainConfig


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tiny_cfg(tmp_path: Path) -> TrainConfig:
    """Tiny, deterministic, float64 training on the in-memory digits (fast on 2 cores)."""
    return TrainConfig(
        data="digits-tensor",
        val_data="digits-tensor",
        model="etj_trainer.models:tiny_mlp",
        global_batch_size=32,
        micro_batch_size=8,
        epochs=3,
        seed=3,
        lr=0.05,
        momentum=0.9,
        dtype="float64",
        checkpoint_dir=tmp_path / "ckpt",
        local_checkpoint_dir=tmp_path / "shm",
        checkpoint_interval_steps=20,
    )

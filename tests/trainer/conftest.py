from __future__ import annotations

from collections.abc import Callable
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
        model="etj_trainer.classifier.models:tiny_mlp",
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


def _tiny_job_env(tmp: Path, **overrides: str) -> dict[str, str]:
    """The loopback e2e tests' tiny float64 job (`etj-train local`), as the pods' env; ``overrides`` win."""
    return {
        "ETJ_DATA": "digits-tensor",
        "ETJ_MODEL": "etj_trainer.classifier.models:tiny_mlp",
        "ETJ_DTYPE": "float64",
        "ETJ_SEED": "3",
        "ETJ_LR": "0.05",
        "ETJ_MOMENTUM": "0.9",
        "ETJ_EPOCHS": "3",
        "ETJ_GLOBAL_BATCH_SIZE": "32",
        "ETJ_MICRO_BATCH_SIZE": "8",
        "ETJ_MIN_STEP_SECONDS": "0.1",
        "ETJ_SAMPLE_LOG_DIR": str(tmp / "samples"),
        # a survivor starved of CPU on a loaded CI machine must not be taken for dead
        "ETJ_PEER_DEAD_AFTER_S": "3",
        **overrides,
    }


@pytest.fixture
def tiny_job_env() -> Callable[..., dict[str, str]]:
    return _tiny_job_env

"""Fashion-MNIST (Debian's dataset-fashion-mnist, installed by scripts/setup.sh): prepare + a one-epoch smoke
of the JPEG/DALI pipeline with the standard recipe."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from etj_trainer import cli
from etj_trainer.batching.schedule import ScheduleType
from etj_trainer.config import TrainConfig
from etj_trainer.data import fashion_mnist
from etj_trainer.data.augment import Augmentation
from etj_trainer.data.dali_input import list_tar_samples

needs_data = pytest.mark.skipif(
    not fashion_mnist.available(),
    reason=f"Debian package {fashion_mnist.PACKAGE} not installed (scripts/setup.sh installs it)",
)


def test_prepare_without_the_package_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ETJ_FASHION_MNIST_DIR", str(tmp_path / "nowhere"))
    assert cli.main(["prepare", "fashion-mnist", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fashion_mnist.INSTALL in err[0]


@needs_data
def test_idx_files_hold_the_official_splits() -> None:
    images, labels = fashion_mnist.load_split("train")
    assert images.shape == (60_000, 28, 28) and images.dtype == np.uint8
    assert sorted(np.bincount(labels).tolist()) == [6000] * 10
    val_images, val_labels = fashion_mnist.load_split("val")
    assert val_images.shape == (10_000, 28, 28) and np.bincount(val_labels).tolist() == [1000] * 10


@needs_data
def test_one_epoch_smoke_of_the_fashion_mnist_pipeline(tmp_path: Path, tiny_cfg: TrainConfig) -> None:
    from etj_trainer.classifier.trainer import train

    data = tmp_path / "fmnist"
    assert cli.main(["prepare", "fashion-mnist", str(data), "--limit", "2000"]) == 0
    table = list_tar_samples(data / "train.tar")
    assert len(table) == 2000 and list_tar_samples(data / "val.tar").labels.shape == (2000,)
    cfg = replace(
        tiny_cfg,
        data=str(data / "train.tar"),
        val_data=str(data / "val.tar"),
        model="etj_trainer.classifier.models:small_cnn",
        image_size=28,
        dtype="float32",
        epochs=1,
        global_batch_size=64,
        micro_batch_size=64,
        lr=0.1,
        lr_schedule=ScheduleType.COSINE,
        warmup_epochs=0.2,
        augment=Augmentation.STANDARD,
        min_crop_scale=0.6,
        label_smoothing=0.1,
        weight_decay=5e-4,
    )
    result = train(cfg)
    assert result.step == 32 and result.accuracy is not None
    assert result.accuracy > 0.4, result.accuracy  # chance is 0.1

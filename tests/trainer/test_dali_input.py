"""DALI input: folder tree and tar shards decode to the same images, fed by the elastic sampler's indices."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from etj_trainer.classifier.trainer import train
from etj_trainer.config import TrainConfig
from etj_trainer.data.dali_input import (
    CorruptImageError,
    DaliImageSource,
    list_folder_samples,
    list_tar_samples,
)
from etj_trainer.data.sources import ensure_digits


@pytest.fixture(scope="module")
def digits_dir() -> Path:
    return ensure_digits()


def _by_label_and_pixels(src: DaliImageSource, idx: np.ndarray) -> list[tuple[int, float]]:
    (x, y), *_ = list(src.batches(iter([idx])))
    return sorted((int(lbl), round(float(img.sum()), 1)) for img, lbl in zip(x, y, strict=True))


def test_folder_and_tar_hold_the_same_samples(digits_dir: Path) -> None:
    folder = DaliImageSource(list_folder_samples(digits_dir / "val"), image_size=32, use_gpu=False)
    tar = DaliImageSource(list_tar_samples(digits_dir / "val.tar"), image_size=32, use_gpu=False)
    assert folder.num_samples == tar.num_samples == 359
    everything = np.arange(folder.num_samples)
    # Same multiset of (label, decoded image) regardless of layout (ids differ: folder order is by class).
    a = sorted(
        _by_label_and_pixels(folder, everything[:200]) + _by_label_and_pixels(folder, everything[200:])
    )
    b = sorted(_by_label_and_pixels(tar, everything[:200]) + _by_label_and_pixels(tar, everything[200:]))
    assert a == b


def test_variable_batches_follow_the_index_stream(digits_dir: Path) -> None:
    table = list_tar_samples(digits_dir / "train.tar")
    src = DaliImageSource(table, image_size=16, use_gpu=False, max_batch=8)
    stream = [np.array([5, 1, 9]), np.array([2]), np.array([7, 7, 3, 0, 4, 6, 8, 10])]
    out = list(src.batches(iter(stream)))
    assert [tuple(x.shape) for x, _ in out] == [(3, 3, 16, 16), (1, 3, 16, 16), (8, 3, 16, 16)]
    for (_, y), idx in zip(out, stream, strict=True):
        assert y.tolist() == table.labels[idx].tolist()


def test_trainer_learns_digits_through_dali(tiny_cfg: TrainConfig) -> None:
    cfg = replace(
        tiny_cfg,
        data="digits",
        val_data="digits",
        model="etj_trainer.classifier.models:small_cnn",
        dtype="float32",
        epochs=1,
        global_batch_size=32,
        micro_batch_size=32,
        lr=0.05,
    )
    result = train(cfg)
    assert result.step == 45 and result.accuracy is not None
    assert result.accuracy > 0.5  # well above chance (0.1) after one epoch of real JPEGs


def _corrupt(path: Path) -> None:
    """Keep the JPEG's first bytes (a valid start of image), then garbage: what a torn copy leaves."""
    path.write_bytes(path.read_bytes()[:40] + b"garbage" * 10)


def test_a_corrupt_jpeg_is_named_in_the_error(digits_dir: Path, tmp_path: Path) -> None:
    """DALI says only "nvImageCodec failure: '#3'" and "Current pipeline object is no longer valid": the
    operator shows the trainer's last error line as the cause, so the sample must be named (issue 15)."""
    shutil.copytree(digits_dir / "val", tmp_path / "val")
    table = list_folder_samples(tmp_path / "val")
    assert table.paths is not None
    _corrupt(table.paths[21])
    src = DaliImageSource(table, image_size=16, use_gpu=False, max_batch=8)
    stream = [np.arange(0, 8), np.arange(8, 16), np.arange(16, 24), np.arange(24, 32)]
    with pytest.raises(CorruptImageError, match=rf"sample 21 \({table.paths[21]}\) does not decode"):
        list(src.batches(iter(stream)))


def test_a_corrupt_jpeg_in_a_tar_is_named_by_its_member(digits_dir: Path, tmp_path: Path) -> None:
    tar = tmp_path / "val.tar"
    shutil.copy(digits_dir / "val.tar", tar)
    table = list_tar_samples(tar)
    assert table.offsets is not None and table.names is not None
    with open(tar, "r+b") as f:  # overwrite sample 3's bytes after its first 40 in place
        f.seek(int(table.offsets[3]) + 40)
        f.write(b"\xff\xd9" * 30)
    src = DaliImageSource(table, image_size=16, use_gpu=False, max_batch=8)
    with pytest.raises(CorruptImageError, match=rf"sample 3 \({tar}:{table.names[3]}\)"):
        list(src.batches(iter([np.arange(0, 8)])))


@pytest.mark.gpu
def test_gpu_mixed_decoding(digits_dir: Path) -> None:
    src = DaliImageSource(list_folder_samples(digits_dir / "val"), image_size=32, use_gpu=True)
    (x, _y), *_ = list(src.batches(iter([np.arange(16)])))
    assert x.is_cuda and x.shape == (16, 3, 32, 32) and torch.isfinite(x).all()


def test_augmented_sample_is_the_same_in_any_micro_batch(digits_dir: Path) -> None:
    """Crop + flip come from (seed, epoch, id) through external_source: regrouping ids (another world size)
    gives every sample the same pixels; another epoch gives other crops."""
    from etj_trainer.data.augment import Augmentation
    from etj_trainer.data.stream import Augmenter, Micro

    table = list_tar_samples(digits_dir / "train.tar")
    aug = Augmenter(Augmentation.STANDARD, seed=5, min_scale=0.2)
    src = DaliImageSource(table, image_size=24, use_gpu=False, max_batch=8, augment=aug)
    ids = np.array([3, 14, 15, 92, 65, 35, 89, 79])
    (whole, y), *_ = list(src.batches(iter([Micro(2, ids)])))
    parts = list(src.batches(iter([Micro(2, ids[5:]), Micro(2, ids[:2]), Micro(2, ids[2:5])])))
    regrouped = torch.cat([parts[1][0], parts[2][0], parts[0][0]])
    assert whole.shape == (8, 3, 24, 24)
    assert torch.equal(whole, regrouped)
    assert y.tolist() == table.labels[ids].tolist()
    (other_epoch, _), *_ = list(src.batches(iter([Micro(3, ids)])))
    assert not torch.equal(whole, other_epoch)
    plain = DaliImageSource(table, image_size=24, use_gpu=False, max_batch=8)
    (unaugmented, _), *_ = list(plain.batches(iter([ids])))
    assert not torch.equal(whole, unaugmented)


def test_micro_batch_above_256(digits_dir: Path) -> None:
    """The pipeline's batch is the trainer's micro batch (DALI's old fixed 256 crash-looped a larger one)."""
    table = list_tar_samples(digits_dir / "train.tar")
    src = DaliImageSource(table, image_size=16, use_gpu=False, max_batch=300)
    (x, y), *_ = list(src.batches(iter([np.arange(300)])))
    assert x.shape == (300, 3, 16, 16) and y.tolist() == table.labels[:300].tolist()


def test_validation_resizes_the_shorter_side_then_center_crops(digits_dir: Path) -> None:
    table = list_tar_samples(digits_dir / "val.tar")
    src = DaliImageSource(table, image_size=24, use_gpu=False, val_resize=32)
    (x, _), *_ = list(src.batches(iter([np.arange(4)])))
    full = DaliImageSource(table, image_size=32, use_gpu=False)
    (ref, _), *_ = list(full.batches(iter([np.arange(4)])))
    assert x.shape == (4, 3, 24, 24)
    assert torch.allclose(x, ref[:, :, 4:28, 4:28])  # the center 24x24 of the 32x32 image

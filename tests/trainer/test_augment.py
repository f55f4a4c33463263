"""Augmentation draws depend on (seed, epoch, sample id) only: not on the rank, the batch or its order."""

from __future__ import annotations

import numpy as np
import torch

from etj_trainer.data.augment import Augmentation, draw_crops, pixel_box, uniforms
from etj_trainer.data.sources import digits_tensor_source
from etj_trainer.data.stream import Augmenter, Micro


def test_draws_are_per_sample_and_independent_of_the_batch() -> None:
    ids = np.array([5, 17, 900, 3, 42])
    whole = draw_crops(7, 2, ids, 0.08)
    for i, sid in enumerate(ids):  # each sample alone, as a different rank would draw it
        alone = draw_crops(7, 2, np.array([sid]), 0.08)
        assert np.array_equal(alone.anchor[0], whole.anchor[i])
        assert np.array_equal(alone.shape[0], whole.shape[i])
        assert alone.flip[0] == whole.flip[i]
    assert not np.array_equal(draw_crops(7, 3, ids, 0.08).anchor, whole.anchor)  # a new epoch, new crops
    assert not np.array_equal(draw_crops(8, 2, ids, 0.08).anchor, whole.anchor)  # a new seed too


def test_flip_off_keeps_the_windows_and_mirrors_nothing() -> None:
    ids = np.arange(1000)
    on, off = draw_crops(4, 1, ids, 0.5), draw_crops(4, 1, ids, 0.5, flip=False)
    assert on.flip.any() and not off.flip.any()
    assert np.array_equal(on.anchor, off.anchor) and np.array_equal(on.shape, off.shape)
    src = digits_tensor_source("train", torch.float64, Augmenter(Augmentation.STANDARD, 4, 0.5, flip=False))
    ((x, _),) = list(src.batches(iter([Micro(1, ids[:50])])))
    plain = digits_tensor_source("train", torch.float64, Augmenter(Augmentation.STANDARD, 4, 0.5))
    ((y, _),) = list(plain.batches(iter([Micro(1, ids[:50])])))
    mirrored = np.flatnonzero(on.flip[:50])  # a sample's draws do not depend on its batch
    assert len(mirrored) > 0
    assert torch.equal(x[mirrored], y[mirrored].flip(-1))  # the same crop, not mirrored


def test_crops_are_valid_random_resized_crops() -> None:
    ids = np.arange(20_000)
    c = draw_crops(0, 0, ids, 0.25)
    area = c.shape[:, 0] * c.shape[:, 1]
    assert (c.shape > 0).all() and (c.shape <= 1).all()
    assert (c.anchor >= 0).all() and (c.anchor + c.shape <= 1 + 1e-6).all()
    assert area.min() >= 0.25 - 1e-6
    assert 0.45 < c.flip.mean() < 0.55
    u = uniforms(0, 0, ids, 3)
    assert 0.49 < u.mean() < 0.51 and u.min() >= 0 and u.max() < 1
    for i in range(50):
        top, left, h, w = pixel_box(c, i, 28, 28)
        assert top >= 0 and top + h <= 28 and left >= 0 and left + w <= 28 and h >= 1 and w >= 1


def test_in_memory_source_gives_a_sample_the_same_image_in_any_micro_batch() -> None:
    src = digits_tensor_source(
        "train", torch.float64, Augmenter(Augmentation.STANDARD, seed=3, min_scale=0.3)
    )
    ids = np.array([10, 11, 12, 13, 14, 15])
    ((x, _),) = list(src.batches(iter([Micro(1, ids)])))
    parts = list(src.batches(iter([Micro(1, ids[3:]), Micro(1, ids[:3][::-1])])))
    regrouped = torch.cat([parts[1][0].flip(0), parts[0][0]])
    assert torch.equal(x, regrouped)
    plain = digits_tensor_source("train", torch.float64)
    ((y, _),) = list(plain.batches(iter([ids])))
    assert not torch.equal(x, y)  # augmentation did something

"""Augmentation whose every random choice is a function of ``(seed, epoch, sample id)`` only.

With elasticity a sample lands on a different rank (and a different input pipeline) in every run, so a
per-rank or per-pipeline RNG (DALI's per-operator seeds, a DataLoader worker's torch seed) would make an
elastic run train on different crops than a fixed one. Here the crop window and the flip are drawn in
Python from a counter-based hash of ``(seed, epoch, id)`` (splitmix64: no state, vectorised, the same on
every machine), and the input pipelines only *apply* them: DALI through ``external_source`` into
``fn.decoders.image_slice`` + ``fn.crop_mirror_normalize(mirror=...)`` (dali_input.py), the in-memory
sources with torch (``apply_to_tensors``).

"standard" is torchvision's RandomResizedCrop (area fraction in ``[min_scale, 1]``, aspect ratio in
``[3/4, 4/3]``, 10 tries, else the whole image) followed by a horizontal flip with probability 1/2 (none
with ``horizontalFlip: false``: digits or text mean something else mirrored). The window is drawn in
*normalised* coordinates (fractions of width and height), so it is the same whatever decoder or
resolution applies it; the aspect ratio is relative to the image's own (the same thing for the square
images used here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch
import torch.nn.functional as F

TRIES = 10
RATIO = (3 / 4, 4 / 3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class Augmentation(StrEnum):
    NONE = "none"
    STANDARD = "standard"


@dataclass(frozen=True)
class Crops:
    """Per-sample windows in normalised coordinates: ``anchor`` (x, y), ``shape`` (w, h), and flips."""

    anchor: np.ndarray  # (n, 2) float32
    shape: np.ndarray  # (n, 2) float32
    flip: np.ndarray  # (n,) bool


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64's finaliser; uint64 array arithmetic wraps modulo 2**64, which is what the hash wants.
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def uniforms(seed: int, epoch: int, ids: np.ndarray, k: int) -> np.ndarray:
    """``(len(ids), k)`` uniforms in [0, 1): a pure function of (seed, epoch, id, column)."""
    h = _mix(np.full(len(ids), seed, dtype=np.uint64))
    h = _mix(h ^ np.uint64(epoch))
    h = _mix(h ^ np.asarray(ids, dtype=np.int64).astype(np.uint64))
    cols = _mix(h[:, None] ^ (np.arange(k, dtype=np.uint64)[None, :] * _GOLDEN))
    return (cols >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def draw_crops(seed: int, epoch: int, ids: np.ndarray, min_scale: float, flip: bool = True) -> Crops:
    """RandomResizedCrop windows + flips for ``ids`` (see the module docstring); ``flip=False``: no flips,
    the same windows."""
    n = len(ids)
    u = uniforms(seed, epoch, ids, 4 * TRIES + 1)
    area = min_scale + (1 - min_scale) * u[:, 0:TRIES]
    log_r = math.log(RATIO[0]) + (math.log(RATIO[1]) - math.log(RATIO[0])) * u[:, TRIES : 2 * TRIES]
    w = np.sqrt(area * np.exp(log_r))
    h = np.sqrt(area / np.exp(log_r))
    ok = (w <= 1) & (h <= 1)
    first = np.where(ok.any(1), ok.argmax(1), -1)  # the first try that fits, as torchvision does
    rows = np.arange(n)
    pick = np.maximum(first, 0)
    cw = np.where(first >= 0, w[rows, pick], 1.0)
    ch = np.where(first >= 0, h[rows, pick], 1.0)
    ax = u[rows, 2 * TRIES + pick] * (1 - cw)
    ay = u[rows, 3 * TRIES + pick] * (1 - ch)
    return Crops(
        anchor=np.stack([ax, ay], 1).astype(np.float32),
        shape=np.stack([cw, ch], 1).astype(np.float32),
        flip=(u[:, 4 * TRIES] < 0.5) & flip,
    )


def pixel_box(crops: Crops, i: int, height: int, width: int) -> tuple[int, int, int, int]:
    """Sample ``i``'s window in whole pixels of an ``height x width`` image: (top, left, h, w)."""
    w = min(width, max(1, round(float(crops.shape[i, 0]) * width)))
    h = min(height, max(1, round(float(crops.shape[i, 1]) * height)))
    left = min(width - w, round(float(crops.anchor[i, 0]) * width))
    top = min(height - h, round(float(crops.anchor[i, 1]) * height))
    return top, left, h, w


def apply_to_tensors(images: torch.Tensor, crops: Crops) -> torch.Tensor:
    """Crop, resize back to the input size (bilinear) and flip a batch of ``(n, C, H, W)`` images."""
    n, _, height, width = images.shape
    out = torch.empty_like(images)
    for i in range(n):
        top, left, h, w = pixel_box(crops, i, height, width)
        win = images[i : i + 1, :, top : top + h, left : left + w]
        img = F.interpolate(win, size=(height, width), mode="bilinear", align_corners=False)[0]
        out[i] = img.flip(-1) if crops.flip[i] else img
    return out

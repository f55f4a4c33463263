"""The digits split is cached as .npz (restarts skip importing scikit-learn) and stays identical."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from etj_trainer.data.digits import digits_split


def test_cached_split_equals_the_built_one_and_survives_a_torn_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ETJ_DATA_CACHE", str(tmp_path))
    built = digits_split()
    (cache,) = tmp_path.glob("digits-split-*.npz")
    cached = digits_split()
    cache.write_bytes(cache.read_bytes()[:100])  # a torn write must not break (or change) anything
    rebuilt = digits_split()
    for split in ("train", "val"):
        for got in (cached, rebuilt):
            np.testing.assert_array_equal(got[split][0], built[split][0])
            np.testing.assert_array_equal(got[split][1], built[split][1])
    assert len(built["train"][1]) == 1438 and len(built["val"][1]) == 359

"""Atomic writes, verification, and falling back to the previous good checkpoint."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from etj_trainer.checkpoint.store import (
    CheckpointStore,
    CorruptCheckpoint,
    checkpoint_path,
    decode,
    encode,
    list_checkpoints,
    load_latest,
)
from etj_trainer.classifier.trainer import train
from etj_trainer.config import TrainConfig


def _state(step: int) -> dict[str, object]:
    return {"step": step, "w": torch.full((4,), float(step))}


def test_round_trip_and_pruning(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "shared", tmp_path / "local", keep=2)
    for step in (1, 2, 3):
        store.save(_state(step), step, shared=step != 2)
    assert [s for s, _ in list_checkpoints(tmp_path / "local")] == [3, 2]
    assert [s for s, _ in list_checkpoints(tmp_path / "shared")] == [3, 1]
    latest = store.latest()
    assert latest is not None and latest.step == 3
    assert torch.equal(latest.state["w"], torch.full((4,), 3.0))
    assert not [p for p in (tmp_path / "local").iterdir() if p.name.startswith(".")]  # no temp leftovers


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_corrupt_newest_falls_back_to_previous(tmp_path: Path, damage: str) -> None:
    store = CheckpointStore(tmp_path, None, keep=5)
    store.save(_state(10), 10, shared=True, local=False)
    store.save(_state(20), 20, shared=True, local=False)
    p = checkpoint_path(tmp_path, 20)
    blob = p.read_bytes()
    if damage == "truncate":
        p.write_bytes(blob[: len(blob) // 2])
    elif damage == "flip":
        p.write_bytes(blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:])
    elif damage == "empty":
        p.write_bytes(b"")
    else:
        p.write_bytes(os.urandom(len(blob)))
    loaded = load_latest(tmp_path)
    assert loaded is not None and loaded.step == 10
    with pytest.raises(CorruptCheckpoint):
        decode(p.read_bytes())


def test_partial_temp_file_is_ignored(tmp_path: Path) -> None:
    CheckpointStore(tmp_path, None).save(_state(5), 5, shared=True, local=False)
    (tmp_path / ".ckpt-000000009.pt.tmp-123").write_bytes(encode(_state(9))[:50])  # a writer died
    loaded = load_latest(tmp_path)
    assert loaded is not None and loaded.step == 5


def test_trainer_resumes_from_previous_good_checkpoint(tiny_cfg: TrainConfig, tmp_path: Path) -> None:
    """The real trainer, handed a corrupt newest checkpoint, resumes from the one before it and ends with
    the same parameters as an uninterrupted run."""
    cfg = replace(tiny_cfg, max_steps=40, checkpoint_interval_steps=20, local_checkpoint_dir=None)
    train(cfg)
    assert cfg.checkpoint_dir is not None
    assert [s for s, _ in list_checkpoints(cfg.checkpoint_dir)] == [40, 20]
    p40 = checkpoint_path(cfg.checkpoint_dir, 40)
    p40.write_bytes(p40.read_bytes()[:-100])  # a partial newest checkpoint
    log_dir = tmp_path / "samples"
    resumed = train(replace(cfg, max_steps=45, sample_log_dir=log_dir))
    steps = sorted(
        {
            int(line.split('"step": ')[1].split(",")[0])
            for f in log_dir.iterdir()
            for line in f.read_text().splitlines()
        }
    )
    assert steps == list(range(21, 46))  # resumed after step 20, not from the corrupt 40 nor from 0
    straight = train(replace(cfg, max_steps=45, checkpoint_dir=tmp_path / "other"))
    for k, v in straight.params.items():
        torch.testing.assert_close(resumed.params[k], v, rtol=0, atol=0)

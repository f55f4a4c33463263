"""The node-local copy costs no step (issue 14 item 5) and still holds the last committed step after a
failed collective (survivors lose at most the step in progress).

The commit point of a step is its stop-code all-reduce, which runs *before* the optimizer step: a failure
before it leaves parameters and optimizer untouched, and the forward pass's side effects (BatchNorm
statistics, the RNG) are undone, so the copy written on the way out equals a run that simply stopped there.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from etj_trainer.checkpoint.store import list_checkpoints, load_latest
from etj_trainer.classifier.trainer import StopFlag, train
from etj_trainer.config import TrainConfig
from etj_trainer.core.stopping import StopCode

FAIL_AT_STEP = 6


class CollectiveFails(Exception):
    pass


class FailsAtTheCommit(StopFlag):
    """Raises where the step's commit all-reduce is built (the code is read once a step), after the step's
    forward and backward passes: what a peer's crash looks like to a survivor."""

    def __init__(self) -> None:
        self.reads = 0
        self.requested = False

    @property  # type: ignore[override]
    def code(self) -> StopCode:
        self.reads += 1
        if self.reads == FAIL_AT_STEP:
            raise CollectiveFails
        return StopCode.RUN


def test_no_local_copy_is_written_per_step(tiny_cfg: TrainConfig) -> None:
    """Regression: the trainer wrote the whole state to the local copy after every step (~0.5 s a step at
    ResNet-50 size). Now only the end writes it (and a snapshot every local_snapshot_interval_s)."""
    cfg = replace(tiny_cfg, max_steps=12, checkpoint_interval_steps=0, local_snapshot_interval_s=3600)
    assert cfg.local_checkpoint_dir is not None
    train(cfg)
    assert [s for s, _ in list_checkpoints(cfg.local_checkpoint_dir)] == [12]


def test_the_periodic_snapshot_writes_in_the_background(tiny_cfg: TrainConfig) -> None:
    cfg = replace(tiny_cfg, max_steps=8, checkpoint_interval_steps=4, local_snapshot_interval_s=1e-9)
    assert cfg.local_checkpoint_dir is not None and cfg.checkpoint_dir is not None
    train(cfg)
    local = [s for s, _ in list_checkpoints(cfg.local_checkpoint_dir)]
    assert local[0] == 8 and len(local) >= 2  # snapshots in the background, then the end
    assert [s for s, _ in list_checkpoints(cfg.checkpoint_dir)] == [8, 4]
    snap = load_latest(cfg.local_checkpoint_dir)
    assert snap is not None and snap.state["step"] == 8


@pytest.mark.parametrize(
    "model", ["etj_trainer.classifier.models:resnet_tiny_w8", "etj_trainer.classifier.models:tiny_mlp"]
)
def test_a_failed_step_leaves_the_last_committed_step_in_the_local_copy(
    tiny_cfg: TrainConfig, tmp_path: Path, model: str
) -> None:
    """resnet_tiny_w8 has BatchNorm: its running statistics move in the failed step's forward pass and must
    be rolled back (without the step's undo (StepUndo) the copy's buffers differ from a clean stop's)."""
    cfg = replace(
        tiny_cfg,
        model=model,
        max_steps=20,
        checkpoint_dir=None,
        checkpoint_interval_steps=0,
        local_snapshot_interval_s=3600,
    )
    assert cfg.local_checkpoint_dir is not None
    with pytest.raises(CollectiveFails):
        train(cfg, stop=FailsAtTheCommit())
    failed = load_latest(cfg.local_checkpoint_dir)
    assert failed is not None and failed.step == FAIL_AT_STEP - 1

    clean = train(replace(cfg, max_steps=FAIL_AT_STEP - 1, local_checkpoint_dir=tmp_path / "clean"))
    assert clean.step == FAIL_AT_STEP - 1
    expected = load_latest(tmp_path / "clean")
    assert expected is not None
    for k, v in expected.state["model"].items():
        torch.testing.assert_close(failed.state["model"][k], v, rtol=0, atol=0, msg=k)
    for a, b in zip(
        failed.state["optimizer"]["state"].values(),
        expected.state["optimizer"]["state"].values(),
        strict=True,
    ):
        torch.testing.assert_close(a["momentum_buffer"], b["momentum_buffer"], rtol=0, atol=0)
    assert failed.state["sampler"] == expected.state["sampler"]
    assert torch.equal(failed.state["rng"]["torch"], expected.state["rng"]["torch"])

    # and training on from the failure's copy ends exactly where an uninterrupted run does
    resumed = train(replace(cfg, max_steps=10))
    straight = train(replace(cfg, max_steps=10, local_checkpoint_dir=tmp_path / "straight"))
    for k, v in straight.params.items():
        torch.testing.assert_close(resumed.params[k], v, rtol=0, atol=0, msg=k)


def test_snapshots_take_at_most_their_budget_of_the_time(tmp_path: Path) -> None:
    """A snapshot that took 2 s (a slow disk, a busy CPU) makes the next one due after 200 s at a 1 %
    budget, not after the configured 60 s."""
    from etj_trainer.checkpoint.store import CheckpointStore, StateWriter

    writer = StateWriter(CheckpointStore(None, tmp_path), local_interval_s=60.0, budget=0.01)
    writer._last_local -= 61
    assert writer.local_due()
    writer._snapshot_s = 2.0
    assert not writer.local_due()
    writer._last_local -= 140
    assert writer.local_due()

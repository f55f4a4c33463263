"""Dynamic SGD against the paper's formula gamma_t = 1 + (t - t0)(k - 1)/T, then k."""

from __future__ import annotations

import pytest
import torch

from etj_trainer.batching.dynamic_sgd import DynamicSGD, LinearRamp


@pytest.mark.parametrize(("k", "T", "t0"), [(2.0, 10, 5), (4.0, 7, 0), (1.5, 4, 3), (0.5, 4, 3)])
def test_ramp_matches_formula(k: float, T: int, t0: int) -> None:
    ramp = LinearRamp(ramp_steps=T)
    ramp.retarget(t0, k)
    for t in range(t0, t0 + 3 * T):
        # the paper's ramp for a growing batch (k > 1); a shrink (k < 1) takes effect at once
        expected = 1 + (t - t0) * (k - 1) / T if (t < t0 + T and k > 1) else k
        assert ramp.value(t) == pytest.approx(expected)


def test_optimizer_lr_follows_ramp_and_keeps_momentum() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    opt = DynamicSGD([p], lr=0.1, ramp_steps=4, momentum=0.9)
    lrs = []
    for t in range(8):
        if t == 2:
            buf_before = opt.state[p]["momentum_buffer"].clone()
            opt.rescale(32, 64)  # k = 2 at t0 = 2
            assert torch.equal(opt.state[p]["momentum_buffer"], buf_before)  # momentum kept
        lrs.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(3)
        opt.step()
    expected = [0.1, 0.1] + [0.1 * (1 + (t - 2) * (2 - 1) / 4) for t in range(2, 6)] + [0.2, 0.2]
    assert lrs == pytest.approx(expected)


def test_change_during_ramp_starts_from_current_value() -> None:
    ramp = LinearRamp(ramp_steps=10)
    ramp.retarget(0, 3.0)
    mid = ramp.value(5)  # 2.0
    ramp.retarget(5, 4.0)  # a further increase ramps on from where the multiplier is, not from 3
    assert ramp.value(5) == pytest.approx(mid)
    assert ramp.value(10) == pytest.approx(mid + 5 * (4.0 - mid) / 10)
    assert ramp.value(15) == pytest.approx(4.0)


@pytest.mark.parametrize("during_ramp", [False, True])
def test_a_shrink_drops_at_once(during_ramp: bool) -> None:
    # regression (bench/dynamic_sgd_cnn.py, spot schedule): ramping *down* kept an LR too large for the
    # smaller batch for T steps, and the immediate jump won on final loss
    ramp = LinearRamp(ramp_steps=10)
    ramp.retarget(0, 4.0)
    t = 5 if during_ramp else 20
    ramp.retarget(t, 2.0)
    assert [ramp.value(t + i) for i in range(3)] == [2.0, 2.0, 2.0]
    ramp.retarget(t + 3, 0.5)  # below the base multiplier too
    assert ramp.value(t + 3) == 0.5


def test_state_dict_round_trip_preserves_ramp() -> None:
    p = torch.nn.Parameter(torch.ones(2))
    opt = DynamicSGD([p], lr=0.1, ramp_steps=10, momentum=0.9)
    opt.rescale(1, 3)
    for _ in range(4):
        p.grad = torch.ones(2)
        opt.step()
    q = torch.nn.Parameter(torch.ones(2))
    opt2 = DynamicSGD([q], lr=0.1, ramp_steps=10, momentum=0.9)
    opt2.load_state_dict(opt.state_dict())
    assert opt2.lr_multiplier == pytest.approx(opt.lr_multiplier) == pytest.approx(1 + 4 * 2 / 10)
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.1 * opt.lr_multiplier)


def test_zero_ramp_is_an_immediate_jump() -> None:
    p = torch.nn.Parameter(torch.ones(1))
    opt = DynamicSGD([p], lr=1.0, ramp_steps=0)
    opt.rescale(1, 4)
    assert opt.param_groups[0]["lr"] == 4.0

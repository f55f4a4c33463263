"""The Dynamic SGD experiment (bench/dynamic_sgd_experiment.py) is sound, whatever its outcome: arms share
initial weights and data order, each arm's LR follows its schedule, and the verdict follows the numbers."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "dynamic_sgd_experiment.py"


@pytest.fixture(scope="module")
def exp() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dynamic_sgd_experiment", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


K, B, T0, AFTER, T, LR = 3, 8, 6, 12, 4, 0.05


@pytest.fixture(scope="module")
def result(exp: ModuleType) -> dict[str, Any]:
    cfg = exp.Config(
        ks=(K,),
        batch=B,
        t0=T0,
        steps_after=AFTER,
        ramps=(T,),
        seeds=2,
        selection_seeds=(7,),
        base_lr=LR,
        keep_traces=True,
    )
    out: dict[str, Any] = exp.run_experiment(cfg)
    return out


def _runs(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    arms = result["experiments"][f"given/k{K}"]["arms"]
    assert set(arms) == {"no_scaling", "jump", f"dynamic_T{T}"}
    return {name: arm["runs"] for name, arm in arms.items()}


def test_arms_share_initial_weights_data_order_and_pre_change_trajectory(result: dict[str, Any]) -> None:
    runs = _runs(result)
    n_seeds = len(runs["jump"])
    assert n_seeds == 2
    for s in range(n_seeds):
        ref = runs["no_scaling"][s]
        assert ref["batch_sizes"] == [B] * T0 + [K * B] * AFTER
        for name, rs in runs.items():
            r = rs[s]
            assert r["init_param_sha"] == ref["init_param_sha"], name
            assert r["data_order_sha"] == ref["data_order_sha"], name
            assert r["batch_sizes"] == ref["batch_sizes"], name
            # identical LR and samples before the change => bit-identical losses up to t0
            assert r["minibatch_losses"][:T0] == ref["minibatch_losses"][:T0], name
            assert r["loss_before_change"] == ref["loss_before_change"], name
    # different seeds really are different runs
    assert runs["jump"][0]["init_param_sha"] != runs["jump"][1]["init_param_sha"]
    assert runs["jump"][0]["data_order_sha"] != runs["jump"][1]["data_order_sha"]


def test_lr_trajectories_follow_each_arms_schedule(result: dict[str, Any]) -> None:
    runs = _runs(result)
    for s in range(2):
        assert runs["no_scaling"][s]["lrs"] == pytest.approx([LR] * (T0 + AFTER))
        assert runs["jump"][s]["lrs"] == pytest.approx([LR] * T0 + [K * LR] * AFTER)
        ramp = [LR * (1 + j * (K - 1) / T) if j < T else K * LR for j in range(AFTER)]
        assert runs[f"dynamic_T{T}"][s]["lrs"] == pytest.approx([LR] * T0 + ramp)
        # after the change the arms do diverge (the schedules matter)
        assert (
            runs["jump"][s]["minibatch_losses"][T0 + 1] != runs["no_scaling"][s]["minibatch_losses"][T0 + 1]
        )


def test_summary_and_verdict_follow_the_per_seed_numbers(exp: ModuleType, result: dict[str, Any]) -> None:
    e = result["experiments"][f"given/k{K}"]
    assert result["config"]["base_lr"] == LR == e["base_lr"]
    for arm in e["arms"].values():
        losses = arm["per_seed"]["final_train_loss"]
        assert len(losses) == 2
        finite = [x for x in losses if x is not None]
        if finite:
            assert arm["final_train_loss"]["mean"] == pytest.approx(sum(finite) / len(finite), abs=1e-3)
        for r, peak, before in zip(
            arm["runs"],
            arm["per_seed"]["peak_loss_after_change"],
            arm["per_seed"]["loss_before_change"],
            strict=True,
        ):
            assert r["diverged"] or peak >= before - 1e-3  # the peak window includes the pre-change point
    name = f"dynamic_T{T}"
    dyn = [r["final_train_loss"] for r in e["arms"][name]["runs"]]
    jump = [r["final_train_loss"] for r in e["arms"]["jump"]["runs"]]
    assert e["dynamic_vs_jump"][name]["final_train_loss"] == exp.compare(dyn, jump)
    assert result["verdict"] == {f"given/k{K}/{name}": e["verdict"][name]}
    assert e["verdict"][name] == e["dynamic_vs_jump"][name]["final_train_loss"]["verdict"]


def test_compare_is_symmetric_and_needs_evidence(exp: ModuleType) -> None:
    better = exp.compare([1.0] * 10, [2.0] * 10)
    assert better["verdict"] == "dynamic_better" and better["seeds_dynamic_better"] == 10
    assert exp.compare([2.0] * 10, [1.0] * 10)["verdict"] == "jump_better"
    assert exp.compare([1.0, 2.0] * 5, [2.0, 1.0] * 5)["verdict"] == "no_significant_difference"
    assert exp.compare([1.0] * 3, [2.0] * 3)["verdict"] == "no_significant_difference"  # 3 seeds: p = 0.25
    # a diverged jump run counts against the jump; accuracy is higher-is-better
    assert exp.compare([1.0], [math.inf])["seeds_dynamic_better"] == 1
    assert exp.compare([0.9] * 10, [0.5] * 10, lower_is_better=False)["verdict"] == "dynamic_better"


def test_base_lr_rule_rejects_unstable_and_keeps_stable_lrs(exp: ModuleType) -> None:
    from etj_trainer.data import digits_tensor_source

    cfg = exp.Config(batch=16, t0=60, lr_grid=(0.05, 100.0), selection_seeds=(7,))
    lr, table = exp.select_base_lr(cfg, digits_tensor_source("train"))
    assert table == {"0.05": True, "100.0": False}
    assert lr == 0.05
    # "scaling_valid" also needs k*lr to pass at k*B: 0.05 * 4000 = 200 does not
    with pytest.raises(RuntimeError):
        exp.select_base_lr(cfg, digits_tensor_source("train"), k=4000)

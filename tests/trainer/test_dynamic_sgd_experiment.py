"""The Dynamic SGD experiment (bench/dynamic_sgd_experiment.py) is sound, whatever its outcome: arms share
initial weights and data order, each arm's LR follows its schedule, and the verdict follows the numbers."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
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
    from etj_trainer.data.sources import digits_tensor_source

    cfg = exp.Config(batch=16, t0=60, lr_grid=(0.05, 100.0), selection_seeds=(7,))
    lr, table = exp.select_base_lr(cfg, digits_tensor_source("train"))
    assert table == {"0.05": True, "100.0": False}
    assert lr == 0.05
    # "scaling_valid" also needs k*lr to pass at k*B: 0.05 * 4000 = 200 does not
    with pytest.raises(RuntimeError):
        exp.select_base_lr(cfg, digits_tensor_source("train"), k=4000)


@pytest.fixture(scope="module")
def stats(exp: ModuleType) -> ModuleType:
    """bench/dynamic_sgd_stats.py, the statistics both experiments import (the module they loaded)."""
    assert exp.compare.__module__ == "dynamic_sgd_stats"
    return sys.modules["dynamic_sgd_stats"]


# ---- bench/dynamic_sgd_cnn.py: the BatchNorm-CNN experiment (docs/dynamic-sgd.md), run in its --quick mode


@pytest.fixture(scope="module")
def cnn() -> ModuleType:
    path = BENCH.with_name("dynamic_sgd_cnn.py")
    spec = importlib.util.spec_from_file_location("dynamic_sgd_cnn", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def quick(cnn: ModuleType) -> dict[str, Any]:
    out: dict[str, Any] = cnn.run_experiment(dataclasses.replace(cnn.QUICK, keep_traces=True))
    return out


QUICK_KEYS = {"scaling_valid/x8_early", "stable_at_B/x8_early", "scaling_valid/spot"}
COMPARE_KEYS = {
    "seeds_dynamic_better",
    "seeds_jump_better",
    "mean_paired_diff_dynamic_minus_jump",
    "paired_t",
    "paired_t_p",
    "sign_test_p",
    "verdict",
}


def test_cnn_quick_json_structure(cnn: ModuleType, quick: dict[str, Any]) -> None:
    json.loads(json.dumps(quick, allow_nan=False))  # strict JSON: no NaN/inf anywhere
    assert quick["benchmark"] == "dynamic_sgd_cnn"
    assert set(quick["experiments"]) == QUICK_KEYS
    assert set(quick["config"]["lr_grid_passes_rule"]) == QUICK_KEYS
    metrics = {"final_train_loss", "val_loss", "val_accuracy", "peak_excess"}
    for key, e in quick["experiments"].items():
        table = quick["config"]["lr_grid_passes_rule"][key]
        assert table["100.0"] is False  # the rule rejects an absurd LR
        assert e["base_lr"] == max(float(lr) for lr, ok in table.items() if ok)
        assert set(e["arms"]) == {"no_scaling", "jump", "dynamic_T4"}
        for arm in e["arms"].values():
            assert set(arm["per_seed"]) == metrics
            assert all(len(v) == 2 for v in arm["per_seed"].values())
        assert set(e["dynamic_vs_jump"]) == {"dynamic_T4"}
        assert set(e["dynamic_vs_jump"]["dynamic_T4"]) == metrics
        for m in metrics:
            assert set(e["dynamic_vs_jump"]["dynamic_T4"][m]) == COMPARE_KEYS
            assert (
                quick[f"verdict_{m}"][f"{key}/dynamic_T4"] == e["dynamic_vs_jump"]["dynamic_T4"][m]["verdict"]
            )
    # the aggressive rule never picks a smaller LR than the one that also needs k*eta stable at k*B
    assert (
        quick["experiments"]["stable_at_B/x8_early"]["base_lr"]
        >= (quick["experiments"]["scaling_valid/x8_early"]["base_lr"])
    )
    finals = list(quick["verdict_final_train_loss"].values())
    dyn, jump = finals.count("dynamic_better"), finals.count("jump_better")
    assert quick["conclusion"].startswith(
        "over the 3 distinct (rule, scenario, T) comparisons: final_train_loss: "
        f"dynamic better in {dyn}/3, jump better in {jump}/3; "
    )


def test_cnn_arms_are_paired_and_follow_their_lr_schedules(cnn: ModuleType, quick: dict[str, Any]) -> None:
    for key, e in quick["experiments"].items():
        lr, sc = e["base_lr"], cnn.QUICK.scenarios[key.split("/")[1]]
        batches, decay = sc.batches, sc.decay_step
        b0, n_before = batches[0], sc.segments[0][0]
        runs = {name: arm["runs"] for name, arm in e["arms"].items()}
        for s in range(2):
            ref = runs["jump"][s]
            for name, rs in runs.items():
                r = rs[s]
                assert (r["init_param_sha"], r["data_order_sha"]) == (
                    ref["init_param_sha"],
                    ref["data_order_sha"],
                )
                assert r["batch_sizes"] == ref["batch_sizes"], name
                # the nominal batch, short only where an epoch ends (a step never crosses epochs)
                assert all(a <= b for a, b in zip(r["batch_sizes"], batches, strict=True)), name
                assert r["minibatch_losses"][:n_before] == ref["minibatch_losses"][:n_before], name
            assert runs["jump"][0]["init_param_sha"] != runs["jump"][1]["init_param_sha"]
            dec = [0.1 if decay is not None and t >= decay else 1.0 for t in range(len(batches))]
            assert runs["no_scaling"][s]["lrs"] == pytest.approx([lr * d for d in dec])
            assert runs["jump"][s]["lrs"] == pytest.approx(
                [lr * b / b0 * d for b, d in zip(batches, dec, strict=True)]
            )
    # Dynamic SGD's ramp, written out for the two quick schedules (T = 4): x8 at step 12; x4 at 8, /2 at 14
    x8 = [1.0] * 12 + [1 + j * 7 / 4 for j in range(4)] + [8.0] * 6
    spot = (
        [1.0] * 8
        + [1 + j * 3 / 4 for j in range(4)]
        + [4.0] * 2
        + [2.0] * 6  # a shrink drops at once (only increases ramp)
    )
    for key, mult, decay in (("scaling_valid/x8_early", x8, 19), ("scaling_valid/spot", spot, 14)):
        e = quick["experiments"][key]
        expected = [e["base_lr"] * m * (0.1 if t >= decay else 1.0) for t, m in enumerate(mult)]
        for r in e["arms"]["dynamic_T4"]["runs"]:
            assert r["lrs"] == pytest.approx(expected)


def test_cnn_runs_are_deterministic(cnn: ModuleType, quick: dict[str, Any]) -> None:
    e = quick["experiments"]["scaling_valid/spot"]
    sc = cnn.QUICK.scenarios["spot"]
    again = cnn.run(1, e["base_lr"], 4, sc.batches, sc.decay_step, cnn.Data(), keep_traces=True)
    assert dataclasses.asdict(again) == e["arms"]["dynamic_T4"]["runs"][1]


def test_cnn_summaries_are_recomputed_from_the_runs(cnn: ModuleType, quick: dict[str, Any]) -> None:
    for e in quick["experiments"].values():
        runs = {name: arm["runs"] for name, arm in e["arms"].items()}
        for m, lower in cnn.METRICS.items():
            dyn = [r[m] for r in runs["dynamic_T4"]]
            jump = [r[m] for r in runs["jump"]]
            assert e["dynamic_vs_jump"]["dynamic_T4"][m] == cnn.compare(dyn, jump, lower_is_better=lower)
            vals = [r[m] for r in runs["jump"] if math.isfinite(r[m])]
            if vals:
                assert e["arms"]["jump"][m]["mean"] == pytest.approx(sum(vals) / len(vals), abs=1e-4)


def test_statistics_on_fixed_input(exp: ModuleType, cnn: ModuleType, stats: ModuleType) -> None:
    # diffs -1, -0.5, -0.5, -2: mean -1, sd sqrt(0.5), t = -1 / (sqrt(0.5) / 2) = -2.828, df 3
    c = exp.compare([1.0, 2.0, 3.0, 4.0], [2.0, 2.5, 3.5, 6.0])
    assert c == {
        "seeds_dynamic_better": 4,
        "seeds_jump_better": 0,
        "mean_paired_diff_dynamic_minus_jump": -1.0,
        "paired_t": -2.828,
        "paired_t_p": 0.0663,  # two-sided Student t, df 3
        "sign_test_p": 0.125,  # 2 * (1/2)^4
        "verdict": "no_significant_difference",
    }
    # 9 of 10 seeds better: sign test p = 2 * (1 + 10) / 2^10; ties are dropped
    assert stats.sign_test_p(9, 1) == pytest.approx(22 / 1024)
    nine = exp.compare([0.0] * 9 + [2.0, 5.0], [1.0] * 10 + [5.0])
    assert (nine["seeds_dynamic_better"], nine["seeds_jump_better"], nine["sign_test_p"]) == (9, 1, 0.0215)
    assert nine["verdict"] == "dynamic_better"
    # Student t two-sided p against tabulated 5% critical values, and the symmetric/zero cases
    for t, df in ((12.7062, 1), (4.3027, 2), (3.1824, 3), (2.7764, 4), (2.2622, 9), (2.1314, 15)):
        assert stats.t_two_sided_p(t, df) == pytest.approx(0.05, abs=2e-5)
        assert stats.t_two_sided_p(-t, df) == stats.t_two_sided_p(t, df)
    assert stats.t_two_sided_p(0.0, 7) == pytest.approx(1.0)
    assert stats.t_two_sided_p(2.0, 1) == pytest.approx(1 - 2 / math.pi * math.atan(2.0))
    # the transient: a loss of 1 that jumps to 3 for five steps after the change at step 10 -> excess 2
    losses = [1.0] * 10 + [3.0] * 5 + [1.0] * 20
    assert cnn._peak_excess(losses, [16] * 10 + [128] * 25) == pytest.approx(2.0)
    assert math.isnan(cnn._peak_excess(losses, [16] * 35))  # no change, no transient

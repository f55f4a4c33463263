"""Dynamic SGD vs an immediate LR jump when the global batch grows by k (B = n*b: workers join).

The regime of Lin, Zhang et al. 2019 ("Dynamic Mini-batch SGD for Elastic Distributed Training"): training
first makes real progress at batch B with LR eta (momentum 0.9); at step t0 the global batch becomes k*B
and the linear scaling rule asks for LR k*eta. Arms (same seed => same initial weights and same sample
order in every arm; everything goes through the trainer's own ``DynamicSGD``/``LinearRamp``):

* ``no_scaling``   -- batch grows, LR stays eta (context: what linear scaling is supposed to beat);
* ``jump``         -- ``DynamicSGD(ramp_steps=0).rescale(B, kB)``: multiplier k from step t0 on;
* ``dynamic_T<T>`` -- ``DynamicSGD(ramp_steps=T).rescale(B, kB)``: gamma ramps 1 -> k over T steps.

Base LR: chosen before and independently of the arms' outcome, by a stability test on separate
selection seeds (never the evaluation seeds): t0 steps at the given batch, every loss finite, the full
training-set loss never above its initial value and at most half of it at the end (real progress). Two
rules, both run and reported, because they answer different questions:

* ``stable_at_B``   -- eta = the largest grid LR passing the test at batch B. k*eta is then beyond what
  was shown stable, i.e. the aggressive regime in which the paper says the jump hurts;
* ``scaling_valid`` -- eta = the largest grid LR passing it at batch B *and* with k*eta at batch k*B
  (from scratch): the linear scaling rule holds, only the transition is in question.

Metrics per run: final full training-set loss and validation accuracy/loss after the last step, the full
training-set loss just before the change and its peak over the post-change steps (the instability a ramp
is meant to prevent). The verdict per (k, T) is computed from the paired per-seed differences
(dynamic - jump): an exact two-sided sign test and a paired t statistic.

    .venv/bin/python bench/dynamic_sgd_experiment.py [--k 4 8] [--seeds 10] [--ramps 50 200] [--rules ...]

(~2-3 CPU-minutes with the defaults: 2 rules x 2 k x 4 arms x 10 seeds; results are deterministic.)

Prints JSON. Single process, CPU, in-memory scikit-learn digits, ``etj_trainer.models:tiny_mlp``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from etj_trainer.batching.dynamic_sgd import DynamicSGD
from etj_trainer.batching.sampler import ElasticSampler
from etj_trainer.classifier.models import build_model
from etj_trainer.data.sources import TensorSource, digits_tensor_source

# The statistics and fingerprints both Dynamic SGD experiments share (this one and dynamic_sgd_cnn.py).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynamic_sgd_stats import MOMENTUM, compare, mean_std, sha

MODEL = "etj_trainer.models:tiny_mlp"


@dataclass(frozen=True)
class Config:
    ks: tuple[int, ...] = (4, 8)
    batch: int = 16  # B before the change; k*B after it
    t0: int = 200  # steps at batch B before the change
    steps_after: int = 300  # steps at batch k*B after it
    ramps: tuple[int, ...] = (50, 200)  # Dynamic SGD's T
    seeds: int = 10  # evaluation seeds 0..seeds-1
    lr_grid: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
    selection_seeds: tuple[int, ...] = (1000, 1001, 1002)
    base_lr: float | None = None  # None: chosen by each rule in ``rules`` (see RULES)
    rules: tuple[str, ...] = ("stable_at_B", "scaling_valid")
    keep_traces: bool = False  # per-run LR trajectory, losses and fingerprints (for tests)


@dataclass
class RunResult:
    final_train_loss: float  # full training set, after the last step (inf if diverged)
    val_accuracy: float
    val_loss: float
    loss_before_change: float  # full training set, just before step t0
    peak_loss_after_change: float  # max full training-set loss over the post-change steps
    diverged: bool
    init_param_sha: str = ""
    data_order_sha: str = ""
    lrs: list[float] = field(default_factory=list)  # LR used by every step
    batch_sizes: list[int] = field(default_factory=list)
    minibatch_losses: list[float] = field(default_factory=list)


@torch.no_grad()
def _full_loss(model: torch.nn.Module, src: TensorSource) -> float:
    return float(F.cross_entropy(model(src.images), src.labels))


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)  # the only source of randomness in the initial weights
    return build_model(MODEL, 10)


def run(
    seed: int,
    base_lr: float,
    k: int,
    ramp_steps: int | None,
    cfg: Config,
    train: TensorSource,
    val: TensorSource,
) -> RunResult:
    """One arm. ``ramp_steps=None``: no LR scaling; ``0``: immediate jump; ``T > 0``: Dynamic SGD ramp."""
    model = _model(seed)
    init_sha = sha(*(p.detach().numpy() for p in model.parameters()))
    opt = DynamicSGD(model.parameters(), lr=base_lr, ramp_steps=ramp_steps or 0, momentum=MOMENTUM)
    sampler = ElasticSampler(train.num_samples, seed)
    order = hashlib.sha256()
    lrs: list[float] = []
    sizes: list[int] = []
    mb_losses: list[float] = []
    loss_before = peak = math.nan
    diverged = False
    for step in range(cfg.t0 + cfg.steps_after):
        batch = cfg.batch if step < cfg.t0 else k * cfg.batch
        if step == cfg.t0:
            loss_before = peak = _full_loss(model, train)
            if ramp_steps is not None:
                opt.rescale(cfg.batch, k * cfg.batch)
        idx = sampler.next_global_batch(batch)
        sampler.commit(len(idx))
        order.update(idx.tobytes())
        sizes.append(len(idx))
        lrs.append(opt.param_groups[0]["lr"])  # the LR this step() uses
        t_idx = torch.from_numpy(idx)
        loss = F.cross_entropy(model(train.images[t_idx]), train.labels[t_idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        mb_losses.append(float(loss.detach()))
        if step >= cfg.t0:
            full = _full_loss(model, train)
            if not math.isfinite(full) or not math.isfinite(mb_losses[-1]):
                diverged = True
                break
            peak = max(peak, full)
    with torch.no_grad():
        logits = model(val.images)
        val_acc = float((logits.argmax(1) == val.labels).float().mean())
        val_loss = float(F.cross_entropy(logits, val.labels))
    res = RunResult(
        final_train_loss=math.inf if diverged else _full_loss(model, train),
        val_accuracy=0.0 if diverged else val_acc,
        val_loss=math.inf if diverged else val_loss,
        loss_before_change=loss_before,
        peak_loss_after_change=math.inf if diverged else peak,
        diverged=diverged,
    )
    if cfg.keep_traces:
        res.init_param_sha, res.data_order_sha = init_sha, order.hexdigest()[:16]
        res.lrs, res.batch_sizes, res.minibatch_losses = lrs, sizes, mb_losses
    return res


def stable_at_batch(
    lr: float, seed: int, cfg: Config, train: TensorSource, batch: int | None = None, every: int = 5
) -> bool:
    """The LR rule's test: ``t0`` steps at batch B, finite, never above the initial loss, halves it."""
    batch = batch or cfg.batch
    model = _model(seed)
    opt = DynamicSGD(model.parameters(), lr=lr, ramp_steps=0, momentum=MOMENTUM)
    sampler = ElasticSampler(train.num_samples, seed)
    initial = _full_loss(model, train)
    full = initial
    for step in range(cfg.t0):
        idx = torch.from_numpy(sampler.next_global_batch(batch))
        sampler.commit(len(idx))
        loss = F.cross_entropy(model(train.images[idx]), train.labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not math.isfinite(float(loss.detach())):
            return False
        if step % every == every - 1 or step == cfg.t0 - 1:
            full = _full_loss(model, train)
            if not math.isfinite(full) or full > initial:
                return False
    return full <= 0.5 * initial


RULES = {
    "stable_at_B": (
        "eta = the largest LR in lr_grid that, at batch B with momentum {m}, trains t0={t0} steps on every "
        "selection seed {sel} with finite losses, the full training-set loss never above its initial value "
        "and at most half of it at the end (k*eta may then be beyond what is stable at k*B)"
    ),
    "scaling_valid": (
        "eta = the largest LR in lr_grid such that eta passes that test at batch B AND k*eta passes the "
        "same test from scratch at batch k*B (the linear scaling rule itself holds; only the transition "
        "is in question)"
    ),
}


def select_base_lr(cfg: Config, train: TensorSource, k: int | None = None) -> tuple[float, dict[str, bool]]:
    """``k=None``: rule ``stable_at_B``; else rule ``scaling_valid`` for that k. Evaluation seeds unused."""

    def ok(lr: float) -> bool:
        sel = cfg.selection_seeds
        if not all(stable_at_batch(lr, s, cfg, train) for s in sel):
            return False
        return k is None or all(stable_at_batch(k * lr, s, cfg, train, batch=k * cfg.batch) for s in sel)

    table = {str(lr): ok(lr) for lr in cfg.lr_grid}
    stable = [lr for lr in cfg.lr_grid if table[str(lr)]]
    if not stable:
        raise RuntimeError(f"no LR in {cfg.lr_grid} passes the stability rule (k={k}, batch {cfg.batch})")
    return max(stable), table


def _arm_summary(results: list[RunResult], keep_traces: bool) -> dict[str, Any]:
    per_seed: dict[str, Any] = {
        "final_train_loss": [round(r.final_train_loss, 4) if not r.diverged else None for r in results],
        "val_accuracy": [round(r.val_accuracy, 4) for r in results],
        "loss_before_change": [round(r.loss_before_change, 4) for r in results],
        "peak_loss_after_change": [
            round(r.peak_loss_after_change, 4) if not r.diverged else None for r in results
        ],
    }
    out: dict[str, Any] = {
        "final_train_loss": mean_std([r.final_train_loss for r in results]),
        "val_accuracy": mean_std([r.val_accuracy for r in results]),
        "val_loss": mean_std([r.val_loss for r in results]),
        "loss_before_change": mean_std([r.loss_before_change for r in results]),
        "peak_loss_after_change": mean_std([r.peak_loss_after_change for r in results]),
        "peak_excess_over_before": mean_std(
            [r.peak_loss_after_change - r.loss_before_change for r in results]
        ),
        "diverged": sum(r.diverged for r in results),
        "per_seed": per_seed,
    }
    if keep_traces:
        out["runs"] = [asdict(r) for r in results]
    return out


def _one(cfg: Config, k: int, base_lr: float, train: TensorSource, val: TensorSource) -> dict[str, Any]:
    arm_specs: dict[str, int | None] = {"no_scaling": None, "jump": 0}
    arm_specs.update({f"dynamic_T{t}": t for t in cfg.ramps})
    results = {
        name: [run(s, base_lr, k, ramp, cfg, train, val) for s in range(cfg.seeds)]
        for name, ramp in arm_specs.items()
    }
    jump = results["jump"]
    vs_jump = {}
    for t in cfg.ramps:
        dyn = results[f"dynamic_T{t}"]
        vs_jump[f"dynamic_T{t}"] = {
            "final_train_loss": compare(
                [r.final_train_loss for r in dyn], [r.final_train_loss for r in jump]
            ),
            "val_accuracy": compare(
                [r.val_accuracy for r in dyn], [r.val_accuracy for r in jump], lower_is_better=False
            ),
            "peak_loss_after_change": compare(
                [r.peak_loss_after_change for r in dyn], [r.peak_loss_after_change for r in jump]
            ),
        }
    return {
        "k": k,
        "base_lr": base_lr,
        "batch": f"{cfg.batch} -> {k * cfg.batch} at step {cfg.t0}",
        "lr": f"{base_lr} -> {k * base_lr:g} (linear scaling; no_scaling stays at {base_lr})",
        # context, not used for any choice: is k*eta itself stable (same test) from scratch at k*B?
        "k_lr_stable_from_scratch_at_kB": all(
            stable_at_batch(k * base_lr, s, cfg, train, batch=k * cfg.batch) for s in cfg.selection_seeds
        ),
        "arms": {name: _arm_summary(res, cfg.keep_traces) for name, res in results.items()},
        "dynamic_vs_jump": vs_jump,
        "verdict": {name: v["final_train_loss"]["verdict"] for name, v in vs_jump.items()},
    }


def run_experiment(cfg: Config) -> dict[str, Any]:
    torch.set_num_threads(1)
    started = time.monotonic()
    train, val = digits_tensor_source("train"), digits_tensor_source("val")
    fmt = {"m": MOMENTUM, "t0": cfg.t0, "sel": list(cfg.selection_seeds)}
    rules = (
        {"given": "given on the command line (--lr)"}
        if cfg.base_lr is not None
        else {name: RULES[name].format(**fmt) for name in cfg.rules}
    )
    out: dict[str, Any] = {
        "benchmark": "dynamic_sgd",
        "config": {
            **{k: v for k, v in asdict(cfg).items() if k != "keep_traces"},
            "model": MODEL,
            "momentum": MOMENTUM,
            "data": "sklearn digits, in-memory (etj_trainer.data.digits_tensor_source)",
            "train_samples": train.num_samples,
            "val_samples": val.num_samples,
            "base_lr_rules": rules,
            "lr_grid_passes_rule": {},
            "metrics": (
                "final_train_loss: full training set after the last step; peak_loss_after_change: max "
                "full training-set loss over the post-change steps (incl. the point just before t0); "
                "loss_before_change: just before t0; verdict per (rule, k, T): exact two-sided sign test "
                "p < 0.05 on the paired per-seed final_train_loss (dynamic vs jump); diverged runs count "
                "as the worst in the paired comparison and are left out of means"
            ),
        },
        "experiments": {},
    }
    for rule in rules:
        for k in cfg.ks:
            if cfg.base_lr is not None:
                base_lr = cfg.base_lr
            else:
                base_lr, table = select_base_lr(cfg, train, None if rule == "stable_at_B" else k)
                out["config"]["lr_grid_passes_rule"][f"{rule}/k{k}"] = table
            out["experiments"][f"{rule}/k{k}"] = _one(cfg, k, base_lr, train, val)
    conclude(out)
    out["wall_s"] = round(time.monotonic() - started, 1)
    return out


def conclude(out: dict[str, Any]) -> None:
    """The verdicts of every (rule, k, T), and the conclusion in words, from the experiments in ``out``."""
    exps = out["experiments"]
    out["verdict"] = {f"{key}/{name}": v for key, e in exps.items() for name, v in e["verdict"].items()}
    out["verdict_peak_loss_after_change"] = {
        f"{key}/{name}": v["peak_loss_after_change"]["verdict"]
        for key, e in exps.items()
        for name, v in e["dynamic_vs_jump"].items()
    }
    n = len(out["verdict"])
    best = [
        key
        for key, e in exps.items()
        if min(e["arms"], key=lambda a: e["arms"][a]["final_train_loss"]["mean"] or math.inf) == "no_scaling"
    ]
    final, peak = list(out["verdict"].values()), list(out["verdict_peak_loss_after_change"].values())
    out["conclusion"] = (
        f"final training loss: dynamic beats the jump in {final.count('dynamic_better')}/{n} (rule, k, T) "
        f"configurations, the jump beats dynamic in {final.count('jump_better')}/{n}, the rest are not "
        f"significant; peak loss after the change: dynamic lower in {peak.count('dynamic_better')}/{n}, "
        f"higher in {peak.count('jump_better')}/{n}; "
        f"no_scaling has the lowest mean final training loss in {len(best)}/{len(exps)} (rule, k) settings"
    )


def main() -> None:
    d = Config()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, nargs="+", default=list(d.ks))
    ap.add_argument("--batch", type=int, default=d.batch)
    ap.add_argument("--t0", type=int, default=d.t0)
    ap.add_argument("--steps-after", type=int, default=d.steps_after)
    ap.add_argument("--ramps", type=int, nargs="+", default=list(d.ramps))
    ap.add_argument("--seeds", type=int, default=d.seeds)
    ap.add_argument("--lr-grid", type=float, nargs="+", default=list(d.lr_grid))
    ap.add_argument("--rules", nargs="+", choices=sorted(RULES), default=list(d.rules))
    ap.add_argument("--lr", type=float, default=None, help="override the base-LR rules")
    ns = ap.parse_args()
    cfg = Config(
        ks=tuple(ns.k),
        batch=ns.batch,
        t0=ns.t0,
        steps_after=ns.steps_after,
        ramps=tuple(ns.ramps),
        seeds=ns.seeds,
        lr_grid=tuple(ns.lr_grid),
        base_lr=ns.lr,
        rules=tuple(ns.rules),
    )
    print(json.dumps(run_experiment(cfg), indent=2))


if __name__ == "__main__":
    main()

"""Dynamic SGD vs the immediate LR jump, closer to the paper's regime: a BatchNorm CNN, momentum SGD with
weight decay, augmentation, batch changes of x4 / x8 early in training (high LR) or several grow/shrink
changes (a spot schedule), a step LR decay before the end, 16 paired seeds.

The question (Lin, Zhang et al. 2019, "Dynamic Mini-batch SGD for Elastic Distributed Training"): when the
global batch changes by k and the LR follows the linear scaling rule, does ramping the LR multiplier over T
steps (``DynamicSGD(ramp_steps=T)``) give a lower *final* loss than jumping at once
(``DynamicSGD(ramp_steps=0)``)? bench/dynamic_sgd_experiment.py (tiny MLP, no BatchNorm) found no
final-loss difference; this asks again in a setting nearer to the paper's (ResNet, CIFAR-10).

Everything below was fixed before any arm was run on an evaluation seed; all of it is reported.

* Data: scikit-learn digits (the only image set installed offline), 1,437 train / 360 val, 3x8x8,
  augmented by a random shift of up to one pixel per sample (drawn from (seed, step): identical in
  every arm). Model ``bn_cnn``: conv-BN-ReLU x2, max-pool, conv-BN-ReLU, global average pool, linear
  (7.8k parameters; the layer types of a CIFAR ResNet, without skips). Momentum 0.9, weight decay 5e-4.
* Scenarios (steps x global batch; b = 16 per worker, so the batch is 16 x workers; about 30 epochs each):
  ``x8_early``: 2 epochs at 16, then 128 (k = 8); ``x4_early``: 2 epochs at 16, then 64 (k = 4);
  ``x8_mid``: 15 epochs at 16, then 128; ``spot``: 16 -> 64 -> 128 -> 32 -> 128 -> 64 (x4, x2, /4, x4,
  /2: grows and shrinks; since this experiment the trainer's DynamicSGD ramps only on grows and a shrink
  drops at once); ``x8_early_const``: x8_early
  without the LR decay (the trainer has no schedule). All but ``x8_early_const`` divide every arm's base
  LR by 10 for the last quarter of the samples.
* Arms (same seed => same initial weights, same sample order, same augmentation in every arm):
  ``jump`` (``rescale`` with T = 0), ``dynamic_T20`` and ``dynamic_T100`` (``rescale`` with a ramp of
  20 / 100 steps; 100 is ~9 epochs at batch 128); ``no_scaling`` (LR stays eta; context, off in the full
  run for CPU budget, on with ``--no-scaling-arm`` and in ``--quick``).
* Base LR eta, chosen on selection seeds 1000-1002 (never the evaluation seeds), from a grid, by a
  stability test: 180 steps from scratch at the given batch; every loss finite, the 10-step moving
  average of the mini-batch loss never above the initial full training-set loss, the final full
  training-set loss at most half the initial one. Rule ``scaling_valid`` (every scenario): the largest
  grid LR passing at batch 16 whose k_max-fold passes at batch 16*k_max (k_max = the scenario's largest
  multiplier): linear scaling itself is sound, only the transition is in question. Rule ``stable_at_B``
  (``x8_early`` only, the aggressive regime the paper's argument is about): the largest grid LR passing
  at batch 16; 8*eta may be beyond what is stable at 128.
* Metrics: final full training-set loss (un-augmented, BN in eval mode) after the last step, val
  accuracy and loss; the transient: for every change, the peak of the 5-step moving average of the
  mini-batch loss over the 50 steps after it minus the mean over the 5 steps before it (max over changes).
* Statistics: per (rule, scenario, T), the paired per-seed differences dynamic - jump; verdict = exact
  two-sided sign test p < 0.05 (ties dropped; a diverged run counts as the worst); the paired t and its
  two-sided p are reported beside it. Twelve (rule, scenario, T) comparisons per metric: uncorrected p.
  Two rules choosing the same eta for a scenario give the same runs: they are run once
  (``same_runs_as``) and the conclusion counts distinct comparisons only.
* Supplementary, added after the main run (post hoc, reported apart): ``x16_early``, 2 epochs at 16, then
  256 (k = 16), both rules: the main run's two rules chose the same eta for x8_early, so the regime where
  k*eta is beyond what is stable at k*B was never reached; k = 16 is the next try at it. Also post hoc,
  as context for reading the results: ``--no-scaling-only`` runs the ``no_scaling`` arm alone.

    .venv/bin/python bench/dynamic_sgd_cnn.py            # the full run (~30 CPU-minutes, 1 thread)
    .venv/bin/python bench/dynamic_sgd_cnn.py --scenarios x16_early   # the supplementary run (~5 minutes)
    .venv/bin/python bench/dynamic_sgd_cnn.py --quick    # the same code on tiny schedules (seconds)

Prints JSON. Deterministic: single process, one CPU thread, in-memory data. Results: docs/dynamic-sgd.md.

Long because: the protocol above, fixed before any evaluation run, stays beside the code it fixes (the
shared statistics are dynamic_sgd_stats.py's already).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from etj_trainer.batching.dynamic_sgd import DynamicSGD
from etj_trainer.batching.sampler import ElasticSampler
from etj_trainer.data.sources import TensorSource, digits_tensor_source
from etj_trainer.data.stream import MEAN, STD

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynamic_sgd_stats import MOMENTUM, compare, mean_std, sha

WEIGHT_DECAY = 5e-4
DECAY_FACTOR = 0.1
BACKGROUND = (0.0 - MEAN) / STD  # a blank pixel after normalisation: the shift's padding
MA_PEAK, PEAK_WINDOW, MA_STABLE = 5, 50, 10


def bn_cnn(num_classes: int = 10, in_channels: int = 3, width: int = 16) -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *block(in_channels, width),
        *block(width, width),
        nn.MaxPool2d(2),
        *block(width, 2 * width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, num_classes),
    )


@dataclass(frozen=True)
class Scenario:
    segments: tuple[tuple[int, int], ...]  # (steps, global batch), in order
    decay: bool = True  # every arm's base LR x DECAY_FACTOR for the last quarter of the samples
    rules: tuple[str, ...] = ("scaling_valid",)

    @property
    def batches(self) -> list[int]:
        return [b for steps, b in self.segments for _ in range(steps)]

    @property
    def k_max(self) -> int:
        return max(b for _, b in self.segments) // self.segments[0][1]

    @property
    def decay_step(self) -> int | None:
        """First step at which 75% of the (nominal) samples have been trained on."""
        if not self.decay:
            return None
        batches = self.batches
        cum = np.cumsum(batches)
        return int(np.searchsorted(cum, 0.75 * cum[-1]))


# ~30 epochs of the 1,437 training samples each; 180 steps at 16 = 2 epochs.
SCENARIOS = {
    "x8_early": Scenario(((180, 16), (315, 128)), rules=("scaling_valid", "stable_at_B")),
    "x4_early": Scenario(((180, 16), (630, 64))),
    "x8_mid": Scenario(((1350, 16), (169, 128))),
    "spot": Scenario(((180, 16), (90, 64), (67, 128), (180, 32), (67, 128), (180, 64))),
    "x8_early_const": Scenario(((180, 16), (315, 128)), decay=False),
}
# Added after the main run had shown both rules picking the same eta for x8_early (so the aggressive regime
# was never reached); chosen before any of its arms ran, reported apart from the main set: k = 16.
SUPPLEMENTARY = {
    "x16_early": Scenario(((180, 16), (157, 256)), rules=("scaling_valid", "stable_at_B")),
}
QUICK_SCENARIOS = {
    "x8_early": Scenario(((12, 16), (10, 128)), rules=("scaling_valid", "stable_at_B")),
    "spot": Scenario(((8, 16), (6, 64), (6, 32))),
}


@dataclass(frozen=True)
class Config:
    scenarios: dict[str, Scenario] = field(default_factory=lambda: dict(SCENARIOS))
    ramps: tuple[int, ...] = (20, 100)
    seeds: int = 16  # evaluation seeds 0..seeds-1
    lr_grid: tuple[float, ...] = (0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4)
    selection_seeds: tuple[int, ...] = (1000, 1001, 1002)
    stability_steps: int = 180
    progress: float = 0.5  # the stability test's "final loss at most this fraction of the initial one"
    no_scaling_arm: bool = False  # context arm: the batch changes, the LR never does (off: CPU budget)
    no_scaling_only: bool = False  # run the context arm alone (no comparison): a cheap follow-up
    keep_traces: bool = False  # per-run LR trajectory, batch sizes, losses and fingerprints (for tests)


QUICK = Config(
    scenarios=QUICK_SCENARIOS,
    ramps=(4,),
    seeds=2,
    lr_grid=(0.02, 0.05, 100.0),
    selection_seeds=(1000,),
    stability_steps=20,
    progress=1.0,
    no_scaling_arm=True,
)


@dataclass
class RunResult:
    initial_train_loss: float
    final_train_loss: float  # full training set, un-augmented, BN in eval mode (inf if diverged)
    val_accuracy: float
    val_loss: float
    peak_excess: float  # max over changes of (post-change peak of the MA - pre-change mean); nan if none
    diverged: bool
    init_param_sha: str = ""
    data_order_sha: str = ""
    lrs: list[float] = field(default_factory=list)  # LR used by every step
    batch_sizes: list[int] = field(default_factory=list)
    minibatch_losses: list[float] = field(default_factory=list)


class Data:
    def __init__(self) -> None:
        self.train, self.val = digits_tensor_source("train"), digits_tensor_source("val")
        self.padded = F.pad(self.train.images, (1, 1, 1, 1), value=BACKGROUND)
        self._ar = torch.arange(self.train.images.shape[-1])

    def augmented(self, idx: np.ndarray, seed: int, step: int) -> torch.Tensor:
        """Each sample shifted by (dy, dx) in {-1, 0, 1}^2, drawn from (seed, step) only."""
        shifts = torch.from_numpy(np.random.default_rng([seed, step]).integers(0, 3, size=(len(idx), 2)))
        rows = (shifts[:, 0:1] + self._ar)[:, None, :, None]
        cols = (shifts[:, 1:2] + self._ar)[:, None, None, :]
        n, c = torch.arange(len(idx))[:, None, None, None], torch.arange(self.padded.shape[1])
        return self.padded[torch.from_numpy(idx)][n, c[None, :, None, None], rows, cols]


@torch.no_grad()
def _evaluate(model: nn.Module, src: TensorSource) -> tuple[float, float]:
    model.eval()
    logits = model(src.images)
    model.train()
    return float(F.cross_entropy(logits, src.labels)), float((logits.argmax(1) == src.labels).float().mean())


def _peak_excess(losses: list[float], batches: list[int]) -> float:
    changes = [t for t in range(MA_PEAK, len(batches)) if batches[t] != batches[t - 1]]
    excess = []
    for c in changes:
        window = losses[c : c + PEAK_WINDOW]
        if len(window) < MA_PEAK:
            continue
        ma = np.convolve(window, np.ones(MA_PEAK) / MA_PEAK, mode="valid")
        excess.append(float(ma.max()) - float(np.mean(losses[c - MA_PEAK : c])))
    return max(excess) if excess else math.nan


def run(
    seed: int,
    base_lr: float,
    ramp_steps: int | None,
    batches: list[int],
    decay_step: int | None,
    data: Data,
    keep_traces: bool = False,
) -> RunResult:
    """One arm. ``ramp_steps=None``: LR never rescaled; ``0``: immediate jump; ``T > 0``: Dynamic SGD.

    Long because: the arm's training loop, whole: what each step applies (rescale, decay, samples, the LR
    logged) reads in step order, and the result is read from the same loop's traces.
    """
    torch.manual_seed(seed)  # the only source of randomness in the initial weights
    model = bn_cnn()
    init_sha = sha(*(p.detach().numpy() for p in model.parameters()))
    initial, _ = _evaluate(model, data.train)
    opt = DynamicSGD(
        model.parameters(),
        lr=base_lr,
        ramp_steps=ramp_steps or 0,
        momentum=MOMENTUM,
        weight_decay=WEIGHT_DECAY,
    )
    sampler = ElasticSampler(data.train.num_samples, seed)
    order = hashlib.sha256()
    lrs: list[float] = []
    sizes: list[int] = []
    losses: list[float] = []
    diverged = False
    for step, batch in enumerate(batches):
        if step > 0 and batch != batches[step - 1] and ramp_steps is not None:
            opt.rescale(batches[step - 1], batch)
        if step == decay_step:
            for group in opt.param_groups:
                group["base_lr"] = base_lr * DECAY_FACTOR
        idx = sampler.next_global_batch(batch)
        sampler.commit(len(idx))
        order.update(idx.tobytes())
        sizes.append(len(idx))
        lrs.append(opt.param_groups[0]["base_lr"] * opt.lr_multiplier)  # what this step() applies
        loss = F.cross_entropy(
            model(data.augmented(idx, seed, step)), data.train.labels[torch.from_numpy(idx)]
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            diverged = True
            break
    final, _ = _evaluate(model, data.train)
    val_loss, val_acc = _evaluate(model, data.val)
    diverged = diverged or not math.isfinite(final)
    res = RunResult(
        initial_train_loss=initial,
        final_train_loss=math.inf if diverged else final,
        val_accuracy=0.0 if diverged else val_acc,
        val_loss=math.inf if diverged else val_loss,
        peak_excess=math.inf if diverged else _peak_excess(losses, batches),
        diverged=diverged,
    )
    if keep_traces:
        res.init_param_sha, res.data_order_sha = init_sha, order.hexdigest()[:16]
        res.lrs, res.batch_sizes, res.minibatch_losses = lrs, sizes, losses
    return res


def stable(lr: float, batch: int, seed: int, cfg: Config, data: Data) -> bool:
    """The LR rules' test, from scratch at a constant batch (see the module docstring)."""
    r = run(seed, lr, 0, [batch] * cfg.stability_steps, None, data, keep_traces=True)
    if r.diverged:
        return False
    ma = np.convolve(r.minibatch_losses, np.ones(MA_STABLE) / MA_STABLE, mode="valid")
    return (
        bool(ma.max() <= r.initial_train_loss) and r.final_train_loss <= cfg.progress * r.initial_train_loss
    )


class LrSelector:
    """Both rules over the grid; every (lr, batch) stability verdict is computed once."""

    def __init__(self, cfg: Config, data: Data) -> None:
        self.cfg, self.data = cfg, data
        self._cache: dict[tuple[float, int], bool] = {}

    def passes(self, lr: float, batch: int) -> bool:
        key = (lr, batch)
        if key not in self._cache:
            self._cache[key] = all(
                stable(lr, batch, s, self.cfg, self.data) for s in self.cfg.selection_seeds
            )
        return self._cache[key]

    def select(self, rule: str, sc: Scenario) -> tuple[float, dict[str, bool]]:
        b, k = sc.segments[0][1], sc.k_max

        def ok(lr: float) -> bool:
            return self.passes(lr, b) and (rule == "stable_at_B" or self.passes(k * lr, k * b))

        table = {str(lr): ok(lr) for lr in self.cfg.lr_grid}
        passing = [lr for lr in self.cfg.lr_grid if table[str(lr)]]
        if not passing:
            raise RuntimeError(f"no LR in {self.cfg.lr_grid} passes rule {rule} (k_max={k}, batch {b})")
        return max(passing), table


RULES = {
    "scaling_valid": (
        "eta = the largest lr_grid LR that passes the stability test at the first batch AND whose "
        "k_max-fold passes it at k_max times that batch"
    ),
    "stable_at_B": "eta = the largest lr_grid LR that passes the stability test at the first batch",
}
STABILITY_TEST = (
    "{n} steps from scratch at a constant batch on every selection seed {sel}: losses finite, the "
    "{ma}-step moving average of the mini-batch loss never above the initial full training-set loss, "
    "final full training-set loss <= {p} x the initial one"
)
METRICS = {
    "final_train_loss": True,  # lower is better
    "val_loss": True,
    "val_accuracy": False,
    "peak_excess": True,
}


def _arm_summary(results: list[RunResult], keep_traces: bool) -> dict[str, Any]:
    out: dict[str, Any] = {m: mean_std([getattr(r, m) for r in results]) for m in METRICS}
    out["diverged"] = sum(r.diverged for r in results)
    out["per_seed"] = {
        m: [round(v, 4) if math.isfinite(v := getattr(r, m)) else None for r in results] for m in METRICS
    }
    if keep_traces:
        out["runs"] = [asdict(r) for r in results]
    return out


def _one(cfg: Config, sc: Scenario, base_lr: float, data: Data) -> dict[str, Any]:
    arm_specs: dict[str, int | None] = (
        {"no_scaling": None} if cfg.no_scaling_arm or cfg.no_scaling_only else {}
    )
    ramps = () if cfg.no_scaling_only else cfg.ramps
    if not cfg.no_scaling_only:
        arm_specs["jump"] = 0
        arm_specs.update({f"dynamic_T{t}": t for t in ramps})
    batches, decay = sc.batches, sc.decay_step
    results = {
        name: [run(s, base_lr, ramp, batches, decay, data, cfg.keep_traces) for s in range(cfg.seeds)]
        for name, ramp in arm_specs.items()
    }
    vs_jump = {
        f"dynamic_T{t}": {
            m: compare(
                [getattr(r, m) for r in results[f"dynamic_T{t}"]],
                [getattr(r, m) for r in results["jump"]],
                lower_is_better=lower,
            )
            for m, lower in METRICS.items()
        }
        for t in ramps
    }
    b0 = sc.segments[0][1]
    return {
        "base_lr": base_lr,
        "segments": [f"{steps} steps x batch {b} (lr multiplier {b / b0:g})" for steps, b in sc.segments],
        "decay_step": decay,
        "arms": {name: _arm_summary(res, cfg.keep_traces) for name, res in results.items()},
        "dynamic_vs_jump": vs_jump,
        "verdict": {name: v["final_train_loss"]["verdict"] for name, v in vs_jump.items()},
    }


def run_experiment(cfg: Config) -> dict[str, Any]:
    torch.set_num_threads(1)
    started = time.monotonic()
    data = Data()
    selector = LrSelector(cfg, data)
    out: dict[str, Any] = {
        "benchmark": "dynamic_sgd_cnn",
        "config": {
            "scenarios": {
                name: asdict(sc) | {"decay_step": sc.decay_step} for name, sc in cfg.scenarios.items()
            },
            **{k: v for k, v in asdict(cfg).items() if k not in ("scenarios", "keep_traces")},
            "model": "bn_cnn (this file)",
            "momentum": MOMENTUM,
            "weight_decay": WEIGHT_DECAY,
            "decay_factor": DECAY_FACTOR,
            "data": "sklearn digits, in-memory, random +-1 pixel shifts drawn from (seed, step)",
            "train_samples": data.train.num_samples,
            "val_samples": data.val.num_samples,
            "base_lr_rules": RULES,
            "stability_test": STABILITY_TEST.format(
                n=cfg.stability_steps, sel=list(cfg.selection_seeds), ma=MA_STABLE, p=cfg.progress
            ),
            "lr_grid_passes_rule": {},
            "verdict_rule": "exact two-sided sign test p < 0.05 on the paired per-seed final_train_loss",
        },
        "experiments": {},
    }
    ran: dict[tuple[str, float], str] = {}  # two rules choosing the same eta: same runs, run once
    for name, sc in cfg.scenarios.items():
        for rule in sc.rules:
            base_lr, table = selector.select(rule, sc)
            key = f"{rule}/{name}"
            out["config"]["lr_grid_passes_rule"][key] = table
            if (name, base_lr) in ran:
                out["experiments"][key] = dict(
                    out["experiments"][ran[name, base_lr]], same_runs_as=ran[name, base_lr]
                )
                continue
            ran[name, base_lr] = key
            out["experiments"][key] = e = _one(cfg, sc, base_lr, data)
            progress = {"experiment": f"{rule}/{name}", "elapsed_s": round(time.monotonic() - started, 1)}
            print(
                json.dumps(progress | {k: v for k, v in e.items() if k != "arms"}),
                file=sys.stderr,
                flush=True,
            )
    conclude(out)
    out["wall_s"] = round(time.monotonic() - started, 1)
    return out


def conclude(out: dict[str, Any]) -> None:
    """The verdicts per metric and the conclusion over the distinct comparisons, from the experiments."""
    exps = out["experiments"]
    for m in METRICS:
        out[f"verdict_{m}"] = {
            f"{key}/{arm}": v[m]["verdict"]
            for key, e in exps.items()
            for arm, v in e["dynamic_vs_jump"].items()
        }
    distinct = {key for key, e in exps.items() if "same_runs_as" not in e}
    n = sum(len(exps[key]["verdict"]) for key in distinct)
    counts = {
        m: {
            v: sum(1 for k, x in out[f"verdict_{m}"].items() if x == v and k.rsplit("/", 1)[0] in distinct)
            for v in ("dynamic_better", "jump_better")
        }
        for m in METRICS
    }
    out["conclusion"] = f"over the {n} distinct (rule, scenario, T) comparisons: " + "; ".join(
        f"{m}: dynamic better in {c['dynamic_better']}/{n}, jump better in {c['jump_better']}/{n}"
        for m, c in counts.items()
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny schedules, 2 seeds: a smoke run (seconds)")
    ap.add_argument(
        "--scenarios", nargs="+", help="only these (default: the main set; x16_early: supplementary)"
    )
    ap.add_argument("--seeds", type=int, help="evaluation seeds 0..N-1")
    ap.add_argument("--no-scaling-arm", action="store_true", help="add the no_scaling context arm")
    ap.add_argument("--no-scaling-only", action="store_true", help="run the no_scaling context arm alone")
    ns = ap.parse_args()
    cfg = QUICK if ns.quick else Config()
    if ns.scenarios:
        known = cfg.scenarios | ({} if ns.quick else SUPPLEMENTARY)
        cfg = replace(cfg, scenarios={k: known[k] for k in ns.scenarios})
    if ns.seeds:
        cfg = replace(cfg, seeds=ns.seeds)
    if ns.no_scaling_arm or ns.no_scaling_only:
        cfg = replace(cfg, no_scaling_arm=True, no_scaling_only=ns.no_scaling_only)
    print(json.dumps(run_experiment(cfg), indent=2))


if __name__ == "__main__":
    main()

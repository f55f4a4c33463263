"""Recipe parity on Fashion-MNIST: the real recipe, fixed vs elastic vs DynamicSGD, 4 workers on loopback.

A small ResNet with BatchNorm (``etj_trainer.classifier.models:resnet_tiny``) on Fashion-MNIST (Debian package
``dataset-fashion-mnist``, the in-memory ``fashion-mnist-tensor`` source; the official 10,000-image test
split is the validation set), trained by ``etj-train local`` (store + one agent per worker, exactly the
pods' processes) under the standard recipe: linear warm-up then cosine decay over samples seen, SGD with
Nesterov momentum, weight decay not on BatchNorm/biases, label smoothing, random-resized crop + flip drawn
from (seed, epoch, sample id). Arms:

- ``fixed``: 4 workers throughout, FixedGlobalBatch, one run per seed;
- ``elastic``: the same job under a spot-like schedule -- at 10 %, 35 %, 55 % and 75 % of the steps a
  graceful leave (4->3, in process), a hard kill (SIGKILL of an agent's whole process tree, 3->2), two
  joins (2->3->4) during the decay -- FixedGlobalBatch, one run per seed; the claim is
  ``|mean(elastic) - mean(fixed)| <= 0.3 pp``;
- ``baseline``: 4 workers, constant LR, no augmentation, no label smoothing/weight decay (what the trainer
  did before the recipe), so the recipe's effect is visible;
- ``dynamic_sgd``: the elastic schedule under DynamicSGD (per-worker batch fixed, B follows the world size,
  the Dynamic SGD multiplier multiplies the scheduled LR; 4 workers = the fixed run's batch and LR).

Prints one JSON object (also written to ``--out`` after every run, so a cut-off run keeps what finished):
per run the validation accuracy, steps, resizes and wall time; per arm mean and sample sd.

    .venv/bin/python bench/recipe_parity.py --epochs 18 --width 16 --min-crop-scale 0.8 --seeds 0,1,2 \\
        --out bench/results/recipe_parity.json
    .venv/bin/python bench/recipe_parity.py --table bench/results/recipe_parity*.json   # markdown
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from etj_trainer.agent.local_launcher import parse_schedule, run_local
from etj_trainer.data import fashion_mnist

TRAIN_SAMPLES = 60_000
WORKERS = 4


def recipe_env(args: argparse.Namespace, seed: int) -> dict[str, str]:
    return {
        "ETJ_DATA": "fashion-mnist-tensor",
        "ETJ_VAL_DATA": "fashion-mnist-tensor",
        "ETJ_MODEL": f"etj_trainer.classifier.models:resnet_tiny_w{args.width}",
        "ETJ_EPOCHS": str(args.epochs),
        "ETJ_SEED": str(seed),
        "ETJ_GLOBAL_BATCH_SIZE": str(args.batch),
        "ETJ_MICRO_BATCH_SIZE": str(args.batch // WORKERS),
        "ETJ_LR": str(args.lr),
        "ETJ_MOMENTUM": "0.9",
        "ETJ_NESTEROV": "true",
        "ETJ_WEIGHT_DECAY": str(args.weight_decay),
        "ETJ_NO_WD_NORM_BIAS": "true",
        "ETJ_LABEL_SMOOTHING": "0.1",
        "ETJ_LR_SCHEDULE": "cosine",
        "ETJ_WARMUP_EPOCHS": str(args.warmup),
        "ETJ_AUGMENT": "standard",
        "ETJ_MIN_CROP_SCALE": str(args.min_crop_scale),
        "ETJ_CHECKPOINT_INTERVAL_STEPS": "100000",  # shared copies only just in time and at the end
        "ETJ_DTYPE": "float32",
        "OMP_NUM_THREADS": "1",  # 4 workers on a 2-core machine: no thread oversubscription
    }


def baseline_env(args: argparse.Namespace, seed: int) -> dict[str, str]:
    return {
        **recipe_env(args, seed),
        "ETJ_NESTEROV": "false",
        "ETJ_WEIGHT_DECAY": "0",
        "ETJ_LABEL_SMOOTHING": "0",
        "ETJ_LR_SCHEDULE": "constant",
        "ETJ_WARMUP_EPOCHS": "0",
        "ETJ_AUGMENT": "none",
    }


def spot_schedule(epochs: int, batch: int) -> str:
    """Graceful leave, hard kill, then two joins during the decay, at 10, 35, 55 and 75 % of the steps."""
    steps = epochs * -(-TRAIN_SAMPLES // batch)
    at = [int(steps * f) for f in (0.1, 0.35, 0.55, 0.75)]
    return f"{at[0]}:-1,{at[1]}:!1,{at[2]}:+1,{at[3]}:+1"


def run(arm: str, env: dict[str, str], schedule: str, timeout_s: float) -> dict[str, Any]:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"etj-recipe-{arm}-") as tmp:
        doc = run_local(WORKERS, parse_schedule(schedule), env, Path(tmp), timeout_s=timeout_s)
    return {
        "arm": arm,
        "seed": int(env["ETJ_SEED"]),
        "accuracy": doc.get("accuracy"),
        "finished": bool(doc.get("finished")),
        "steps": doc.get("step"),
        "finalLr": doc.get("lr"),
        "resizes": [(r.get("from"), r.get("to")) for r in doc.get("resizes", [])],
        "schedule": schedule,
        "wallSeconds": round(time.monotonic() - t0, 1),
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for arm in ("fixed", "elastic", "baseline", "dynamic_sgd"):
        acc = [100 * r["accuracy"] for r in runs if r["arm"] == arm and r["accuracy"] is not None]
        if acc:
            arms[arm] = {
                "n": len(acc),
                "meanPct": round(statistics.fmean(acc), 2),
                "sdPct": round(statistics.stdev(acc), 2) if len(acc) > 1 else None,
            }
    out: dict[str, Any] = {"arms": arms}
    if "fixed" in arms and "elastic" in arms:
        out["elasticMinusFixedPp"] = round(arms["elastic"]["meanPct"] - arms["fixed"]["meanPct"], 2)
        out["parityWithin0.3pp"] = abs(out["elasticMinusFixedPp"]) <= 0.3
        # Same seed = same initial weights, sample order and crops: the pair differs only by the resizes.
        acc = {(r["arm"], r["seed"]): 100 * r["accuracy"] for r in runs if r["accuracy"] is not None}
        seeds = sorted({s for a, s in acc if a == "fixed"} & {s for a, s in acc if a == "elastic"})
        out["elasticMinusFixedPpBySeed"] = {s: round(acc["elastic", s] - acc["fixed", s], 2) for s in seeds}
    if "fixed" in arms:
        out["fixedAtLeast92"] = arms["fixed"]["meanPct"] >= 92.0
    return out


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table of every run in ``results`` (several JSON outputs of this script), then the arms."""
    runs = [r for res in results for r in res["runs"]]
    lines = ["| arm | seed | val accuracy | resizes (from→to) | wall s |", "|---|---|---|---|---|"]
    for r in runs:
        acc = f"{100 * r['accuracy']:.2f} %" if r["accuracy"] is not None else "did not finish"
        sizes = ", ".join(f"{a}→{b}" for a, b in r["resizes"]) or "none"
        lines.append(f"| {r['arm']} | {r['seed']} | {acc} | {sizes} | {r['wallSeconds']:.0f} |")
    summary = summarise(runs)
    lines += ["", "| arm | runs | mean | sd |", "|---|---|---|---|"]
    for arm, a in summary["arms"].items():
        sd = f"{a['sdPct']:.2f} pp" if a["sdPct"] is not None else "–"
        lines.append(f"| {arm} | {a['n']} | {a['meanPct']:.2f} % | {sd} |")
    if "elasticMinusFixedPp" in summary:
        by_seed = ", ".join(f"seed {s} {d:+.2f}" for s, d in summary["elasticMinusFixedPpBySeed"].items())
        diff = summary["elasticMinusFixedPp"]
        lines.append(f"\nelastic − fixed: **{diff:+.2f} pp** (same seed: {by_seed})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--table"]:
        print(table([json.loads(Path(f).read_text()) for f in argv[1:]]))
        return 0
    args = parse_args(argv)
    if not fashion_mnist.available():
        print(f"recipe_parity: Fashion-MNIST missing: {fashion_mnist.INSTALL}", file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",")]
    spot = spot_schedule(args.epochs, args.batch)
    plan = make_plan(args, seeds, spot)
    result: dict[str, Any] = {
        "config": {**{k: v for k, v in vars(args).items() if k != "out"}, "workers": WORKERS, "spot": spot},
        "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "runs": [],
    }
    for arm, env, schedule in plan:
        r = run(arm, env, schedule, args.timeout)
        result["runs"].append(r)
        result["summary"] = summarise(result["runs"])
        print(json.dumps(r), file=sys.stderr, flush=True)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    result["machine"]["loadavg_end"] = os.getloadavg()
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=18)
    ap.add_argument("--width", type=int, default=16, choices=(8, 16), help="resnet_tiny width")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.2, help="at --batch")
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--min-crop-scale", type=float, default=0.8)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default="fixed,elastic,baseline,dynamic_sgd")
    ap.add_argument("--timeout", type=float, default=3600, help="per run, seconds")
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args(argv)


def make_plan(args: argparse.Namespace, seeds: list[int], spot: str) -> list[tuple[str, dict[str, str], str]]:
    """The runs, in order: (arm, the trainer's env, the spot schedule or "")."""
    plan: list[tuple[str, dict[str, str], str]] = []
    arms = args.arms.split(",")
    for seed in seeds:  # interleaved, so a cut-off run still has both arms for the first seeds
        # Fixed runs wait for all 4 workers before the first step (on a loaded machine the agents start
        # seconds apart, and a first round of fewer workers would make it a resize); elastic ones may
        # start with 2.
        if "fixed" in arms:
            plan.append(("fixed", {**recipe_env(args, seed), "ETJ_MIN_WORKERS": str(WORKERS)}, ""))
        if "elastic" in arms:
            plan.append(("elastic", {**recipe_env(args, seed), "ETJ_MIN_WORKERS": "2"}, spot))
    if "baseline" in arms:
        plan.append(("baseline", {**baseline_env(args, seeds[0]), "ETJ_MIN_WORKERS": str(WORKERS)}, ""))
    if "dynamic_sgd" in arms:
        # Per-worker batch B/4 at every size: base LR belongs to the batch at ETJ_MIN_WORKERS = 2 (B/2), so 4
        # workers train with the fixed run's batch and LR; the multiplier follows 3, 2, 3, 4 workers.
        env = {
            **recipe_env(args, seeds[0]),
            "ETJ_RESIZE_POLICY": "DynamicSGD",
            "ETJ_MIN_WORKERS": "2",
            "ETJ_GLOBAL_BATCH_SIZE": str(args.batch // 2),
            "ETJ_LR": str(args.lr / 2),
            "ETJ_DSGD_RAMP_STEPS": "50",
        }
        plan.append(("dynamic_sgd", env, spot))
    return plan


if __name__ == "__main__":
    sys.exit(main())

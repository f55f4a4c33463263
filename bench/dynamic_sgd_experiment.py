"""Dynamic SGD vs an immediate LR jump when the global batch grows (B = n*b, world 1 -> 4 at step t0).

Single process, the trainer's own DynamicSGD optimizer and loss weighting, digits (in-memory), small CNN.
Phase 1: batch 16 at the base LR for t0 steps; then batch 64 with the LR multiplier 4 (linear scaling),
reached either at once (ramp_steps=0, the "jump") or linearly over T steps (Dynamic SGD). Same seeds and
sample order in both arms. Reports the final training loss (mean over the last 20 steps) and validation
accuracy, over several seeds. Prints JSON.

    .venv/bin/python bench/dynamic_sgd_experiment.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from etj_trainer.data import digits_tensor_source
from etj_trainer.dynamic_sgd import DynamicSGD
from etj_trainer.models import build_model
from etj_trainer.sampler import ElasticSampler


def run(seed: int, ramp_steps: int, base_lr: float, t0: int, steps: int) -> tuple[float, float]:
    torch.manual_seed(seed)
    train, val = digits_tensor_source("train"), digits_tensor_source("val")
    model = build_model("etj_trainer.models:small_cnn", 10)
    opt = DynamicSGD(model.parameters(), lr=base_lr, ramp_steps=ramp_steps, momentum=0.9)
    sampler = ElasticSampler(train.num_samples, seed)
    losses = []
    for step in range(steps):
        batch = 16 if step < t0 else 64
        if step == t0:
            opt.rescale(16, 64)
        idx = torch.from_numpy(sampler.next_global_batch(batch))
        sampler.commit(len(idx))
        loss = F.cross_entropy(model(train.images[idx]), train.labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        acc = float((model(val.images).argmax(1) == val.labels).float().mean())
    return statistics.mean(losses[-20:]), acc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--t0", type=int, default=100)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--ramp", type=int, default=50)
    ns = ap.parse_args()
    out: dict[str, object] = {
        "benchmark": "dynamic_sgd",
        "base_lr": ns.lr,
        "batch": "16 -> 64 at step t0",
        "t0": ns.t0,
        "steps": ns.steps,
        "ramp_steps_T": ns.ramp,
    }
    for name, ramp in (("immediate_jump", 0), ("dynamic_sgd", ns.ramp)):
        res = [run(s, ramp, ns.lr, ns.t0, ns.steps) for s in range(ns.seeds)]
        out[name] = {
            "final_loss_per_seed": [round(r[0], 4) for r in res],
            "final_loss_mean": round(statistics.mean(r[0] for r in res), 4),
            "val_accuracy_mean": round(statistics.mean(r[1] for r in res), 4),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

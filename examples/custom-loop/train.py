"""Your own training loop under etj: a plain PyTorch script (model, data, loss and optimizer are its own).

Run it elastically on a laptop (2 agents; one leaves at step 10, one joins at step 20):

    etj-train local --nodes 2 --schedule 10:-1,20:+1 --epochs 3 --global-batch-size 64 \
        --micro-batch-size 16 --script examples/custom-loop/train.py --hidden 64

or on Kubernetes with ``spec.trainer.args: ["--script", "/workspace/train.py", "--hidden", "64"]`` in an
image that holds this file. Everything etj guarantees (fixed global batch, exactly-once sampling, Dynamic
SGD, checkpoints, in-place resizes, progress) comes from ``etj_trainer.elastic``; see docs/trainer.md,
"Bring your own training loop".
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, default_collate

from etj_trainer import elastic


class Blobs(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Four Gaussian clusters in 16 dimensions: a map-style dataset like any other."""

    def __init__(self, n: int = 2048, dim: int = 16, classes: int = 4, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        centers = torch.randn(classes, dim, generator=g) * 2.0
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.x = centers[self.y] + torch.randn(n, dim, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def make_model(dim: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=64)
    args = ap.parse_args()

    train_set = Blobs()
    # The config (batch sizes, epochs, LR, checkpoint dirs...) comes from the ETJ_* environment the operator
    # or `etj-train local` sets; these defaults apply where it is unset (e.g. `python train.py` alone).
    with elastic.Job(dataset_size=len(train_set), global_batch_size=64, micro_batch_size=16, lr=0.05) as job:
        model = job.setup_model(make_model(16, args.hidden, 4))
        cfg = job.config
        job.setup_optimizer(elastic.DynamicSGD(model.parameters(), lr=cfg.lr, ramp_steps=cfg.dsgd_ramp_steps))
        for step in job.steps():
            for micro in step.micro_batches():  # may be empty at an epoch's tail: run it anyway
                x, y = (
                    default_collate([train_set[int(i)] for i in micro.ids])
                    if len(micro.ids)
                    else (torch.empty(0, 16), torch.empty(0, dtype=torch.int64))
                )
                loss = F.cross_entropy(model(x.to(job.device)), y.to(job.device), reduction="sum")
                step.backward(loss)  # the micro-batch's SUM: etj weights it for the global batch
            step.optimizer_step()
        accuracy = None
        if not job.stopped_early and job.world.rank == 0:
            model.eval()
            with torch.no_grad():
                pred = model(train_set.x.to(job.device)).argmax(1).cpu()
            accuracy = float((pred == train_set.y).float().mean())
        job.finish(accuracy=accuracy)


if __name__ == "__main__":
    main()

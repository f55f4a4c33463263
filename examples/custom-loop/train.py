"""Your own training loop under etj: a plain PyTorch script (model, data, loss and optimizer are its own).

Run it elastically on a laptop (2 agents; one leaves at step 10, one joins at step 20):

    etj-train local --nodes 2 --schedule 10:-1,20:+1 --epochs 3 --global-batch-size 64 \
        --micro-batch-size 16 --script examples/custom-loop/train.py --hidden 64

or on Kubernetes with ``spec.trainer.args: ["--script", "/workspace/train.py", "--hidden", "64"]`` in an
image that holds this file. Everything etj guarantees (fixed global batch, exactly-once sampling, Dynamic
SGD, checkpoints, in-place resizes, progress) comes from ``etj_trainer.elastic``: the loss is PyTorch's
default mean, the data a standard DataLoader; see docs/trainer.md, "Bring your own training loop".
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

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
    ap.add_argument("--loader-workers", type=int, default=1)
    args = ap.parse_args()

    train_set = Blobs()
    # Config precedence: the ETJ_* environment (the operator, etj-train flags) over these keywords (used
    # where it is silent, e.g. `python train.py` alone) over TrainConfig's defaults; a keyword the
    # environment overrides is warned about.
    with elastic.Job(dataset_size=len(train_set), global_batch_size=64, micro_batch_size=16, lr=0.05) as job:
        model = job.setup_model(make_model(16, args.hidden, 4))
        job.setup_dynamic_sgd(model.parameters())  # lr, ramp, momentum... from the config
        # A torch DataLoader per membership: it prefetches exactly this rank's next micro-batches.
        loader = job.loader(train_set, num_workers=args.loader_workers)
        for step in job.steps():
            for x, y in step.batches(loader):  # an empty share is an empty batch: run it anyway
                step.backward(F.cross_entropy(model(x.to(job.device)), y.to(job.device)))  # a mean: fine
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

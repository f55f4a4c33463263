"""A loop-API script that records, at every step, what torch elastic's environment says next to what the
world is (tests/trainer/test_world_env.py runs it through a join, a leave and a kill)."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from etj_trainer import elastic

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def main(out: str) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(512, 4, generator=g), torch.randint(0, 3, (512,), generator=g)
    with elastic.Job(dataset_size=512, global_batch_size=24, micro_batch_size=8, lr=0.05) as job:
        model = job.setup_model(torch.nn.Linear(4, 3))
        job.setup_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
        for step in job.steps():
            for micro in step.micro_batches():
                ids = torch.from_numpy(micro.ids)
                step.backward(F.cross_entropy(model(x[ids]), y[ids]))
            if not dist.is_initialized():  # a step lost to a dead peer, between two worlds
                step.optimizer_step()
                continue
            row = {
                "pid": os.getpid(),
                "step": job.steps_done,
                "rank": dist.get_rank(),
                "world": dist.get_world_size(),
                "env": {k: os.environ.get(k) for k in KEYS},
            }
            with open(f"{out}.{os.getpid()}", "a") as f:  # one file per process: no interleaving
                f.write(json.dumps(row) + "\n")
            step.optimizer_step()


if __name__ == "__main__":
    main(sys.argv[1])

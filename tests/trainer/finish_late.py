"""A script (``ETJ_SCRIPT``) whose work after its last step -- an evaluation, say -- outlasts a joiner's
arrival: after the loop each rank that trained waits until its own agent has refused the join (its line in
this node's log, ``FINISH_LATE_LOGS/<worker id>.log``), a stop signal came instead, or 300 s passed (a
bound, for a joiner's start on a loaded machine); then it finishes.
tests/trainer/test_fsdp.py drives it with a node that starts at the last step."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from etj_trainer import elastic
from etj_trainer.core.world import installed

REFUSED = "a node waits to join, but the training is done: no restart"


def main() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)
    with elastic.Job(dataset_size=64, global_batch_size=16, micro_batch_size=8, lr=0.1) as job:
        torch.manual_seed(0)
        model = job.setup_model(torch.nn.Linear(4, 3), shard=(torch.nn.Linear,))
        job.setup_optimizer(torch.optim.SGD(model.parameters(), lr=job.config.lr))
        trained = False  # a world restored at the last step (restarted) has nothing to wait for
        for step in job.steps():
            trained = True
            for micro in step.micro_batches():
                ids = torch.from_numpy(micro.ids)
                step.backward(F.cross_entropy(model(x[ids]), y[ids], reduction="sum"))
            step.optimizer_step()
        log = Path(os.environ["FINISH_LATE_LOGS"]) / f"{os.environ['ETJ_WORKER_ID']}.log"
        stop = installed()
        deadline = time.monotonic() + 300
        while trained and time.monotonic() < deadline and not job.stopped_early:
            if (stop is not None and stop.code) or (
                log.exists() and REFUSED in log.read_text(errors="replace")
            ):
                break
            time.sleep(0.1)


if __name__ == "__main__":
    main()

"""etj's training loop vs a plain DDP loop: same model, data, batch and process count; one run, one ratio.

Both arms train torchvision's ResNet-18 (10 classes) on the same in-memory 64x64 images
(``synthetic-tensor``), global batch 64 over 2 gloo processes (32 each, one micro-batch), SGD with
momentum, fp32, one torch thread per process. The ``ddp`` arm is the textbook loop (a
``DistributedSampler`` order, ``images[idx]``, mean loss, ``backward``, ``step``). The ``etj`` arm is the real
trainer (``etj_trainer.trainer.train``) with its node-local copy on (``/dev/shm``, default snapshot interval)
and everything a step does in production: the elastic sampler, the schedule and Dynamic SGD bookkeeping,
the commit all-reduce carrying stop codes, the step-start undo record, the background snapshot when due.

The machine is shared, so the arms are interleaved (A B B A A B ...) in fresh process pairs and each run's
steady-state time per step (after ``--warmup`` steps) is one sample; the ratio is of the medians. Both
arms time the same point of the step (just before the commit), so a step's time is the gap between
consecutive marks. The snapshot's own cost is measured apart (copy on the training thread, encode+write on
the writer thread) and amortised over the interval, because a short run may see none.

    .venv/bin/python bench/step_overhead.py --rounds 4 --steps 30 --out bench/results/step_overhead.json
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

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

WORLD = 2
IMAGE = 64
DATASET = 1024
GLOBAL_BATCH = 64
LR, MOMENTUM = 0.1, 0.9


def _ddp_arm(rank: int, steps: int) -> list[float]:
    import torchvision
    from torch.utils.data.distributed import DistributedSampler

    from etj_trainer.data import synthetic_images

    images, labels = synthetic_images(DATASET, IMAGE)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    dataset = torch.utils.data.TensorDataset(labels)  # only its length is used
    sampler: DistributedSampler[Any] = DistributedSampler(dataset, num_replicas=WORLD, rank=rank, seed=0)
    per_rank = GLOBAL_BATCH // WORLD
    marks: list[float] = []
    epoch = 0
    while len(marks) < steps:
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        for start in range(0, len(order) - per_rank + 1, per_rank):
            idx = order[start : start + per_rank]
            opt.zero_grad()
            loss = F.cross_entropy(ddp(images[idx]), labels[idx])
            loss.backward()
            marks.append(time.monotonic())
            opt.step()
            if len(marks) == steps:
                break
        epoch += 1
    return marks


def _marking_flag() -> Any:
    """A StopFlag that records when each step reaches its commit (the stop code is read once a step)."""
    from etj_trainer.regroup import StopCode
    from etj_trainer.trainer import StopFlag

    class Marking(StopFlag):
        def __init__(self) -> None:
            self.times: list[float] = []
            super().__init__()

        @property
        def code(self) -> StopCode:
            self.times.append(time.monotonic())
            return StopCode.RUN

        @code.setter
        def code(self, value: StopCode) -> None:  # StopFlag.__init__ assigns it
            pass

    return Marking()


def _etj_arm(rank: int, steps: int, local_dir: str) -> list[float]:
    from etj_trainer.config import TrainConfig
    from etj_trainer.trainer import train

    cfg = TrainConfig(
        data=f"synthetic-tensor:{DATASET}",
        model="resnet18",
        image_size=IMAGE,
        global_batch_size=GLOBAL_BATCH,
        micro_batch_size=GLOBAL_BATCH // WORLD,
        epochs=1000,
        max_steps=steps,
        lr=LR,
        momentum=MOMENTUM,
        weight_decay=0.0,
        checkpoint_dir=None,
        local_checkpoint_dir=Path(local_dir),
        deterministic=False,
    )
    flag = _marking_flag()
    train(cfg, flag)
    return list(flag.times)


def _rank_main(rank: int, arm: str, steps: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ["LOCAL_RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        marks = _ddp_arm(rank, steps) if arm == "ddp" else _etj_arm(rank, steps, str(Path(out_dir, "shm")))
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(marks))
    finally:
        dist.destroy_process_group()


def run_arm(arm: str, steps: int, warmup: int) -> float:
    """Seconds per step of one fresh 2-process run, steady state (rank 0's marks after the warm-up)."""
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        mp.spawn(_rank_main, args=(arm, steps, str(Path(tmp, "init")), tmp), nprocs=WORLD, join=True)
        marks = json.loads(Path(tmp, "rank0.json").read_text())
    assert len(marks) == steps, (arm, len(marks))
    return (marks[-1] - marks[warmup]) / (steps - 1 - warmup)


def snapshot_cost(interval_s: float) -> dict[str, float]:
    """The background snapshot of ResNet-18's state (weights + momentum): its copy on the training thread,
    its encode + write on the writer thread, and both amortised over the interval."""
    import torchvision

    from etj_trainer.checkpoint import CheckpointStore, StateWriter

    torch.set_num_threads(1)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    F.cross_entropy(model(torch.randn(2, 3, IMAGE, IMAGE)), torch.tensor([0, 1])).backward()
    opt.step()  # momentum buffers exist
    copies, writes = [], []
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        writer = StateWriter(CheckpointStore(None, Path(tmp)), interval_s)
        for step in range(3):
            t0 = time.monotonic()
            writer.background(
                lambda: {"model": model.state_dict(), "optimizer": opt.state_dict()}, step, False, True
            )
            t1 = time.monotonic()
            writer.wait()
            copies.append(t1 - t0)
            writes.append(time.monotonic() - t1)
    copy_s, write_s = statistics.median(copies), statistics.median(writes)
    state_mb = sum(p.numel() * 4 * 2 for p in model.parameters()) / 1e6
    return {
        "state_mb": round(state_mb, 1),
        "copy_s": round(copy_s, 4),
        "encode_write_s": round(write_s, 4),
        "interval_s": interval_s,
        "amortised_fraction": round((copy_s + write_s) / interval_s, 5),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="runs per arm, interleaved")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args(argv)
    from etj_trainer.config import TrainConfig

    runs: dict[str, list[float]] = {"ddp": [], "etj": []}
    order: list[str] = []
    for r in range(ns.rounds):
        for arm in ("ddp", "etj") if r % 2 == 0 else ("etj", "ddp"):
            runs[arm].append(round(run_arm(arm, ns.steps, ns.warmup), 4))
            order.append(arm)
            print(f"round {r} {arm}: {runs[arm][-1]:.4f} s/step", file=sys.stderr, flush=True)
    ddp, etj = statistics.median(runs["ddp"]), statistics.median(runs["etj"])
    snap = snapshot_cost(TrainConfig.local_snapshot_interval_s)
    result = {
        "bench": "step_overhead",
        "model": "resnet18",
        "image_size": IMAGE,
        "world": WORLD,
        "backend": "gloo",
        "global_batch": GLOBAL_BATCH,
        "steps_per_run": ns.steps,
        "warmup_steps": ns.warmup,
        "order": order,
        "seconds_per_step": runs,
        "median_s_per_step": {"ddp": round(ddp, 4), "etj": round(etj, 4)},
        "ratio_etj_over_ddp": round(etj / ddp, 4),
        "snapshot": snap,
        "ratio_with_amortised_snapshot": round(etj / ddp + snap["amortised_fraction"], 4),
        "goal": "<= 1.03",
        "host": {"cpus": os.cpu_count(), "loadavg": os.getloadavg()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if ns.out:
        ns.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

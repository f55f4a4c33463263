"""etj's training loop vs a plain DDP loop: same model, data, batch and process count; one run, one ratio.

Both arms train torchvision's ResNet-18 (10 classes) on the same in-memory 64x64 images
(``synthetic-tensor``), global batch 64 over 2 gloo processes (32 each, one micro-batch), SGD with
momentum, fp32, one torch thread per process. The ``ddp`` arm is the textbook loop (a
``DistributedSampler`` order, ``images[idx]``, mean loss, ``backward``, ``step``). The ``etj`` arm is the real
trainer (``etj_trainer.classifier.trainer.train``) with its node-local copy on (``/dev/shm``, default
snapshot interval)
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
import contextlib
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

    from etj_trainer.data.sources import synthetic_images

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
    from etj_trainer.classifier.trainer import StopFlag
    from etj_trainer.core.stopping import StopCode

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
    from etj_trainer.classifier.trainer import train
    from etj_trainer.config import TrainConfig

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


def _commit_arm(rank: int, steps: int) -> list[float]:
    """The commit all-reduce alone (loss + one stop code per rank, float64), as etj's step runs it."""
    stats = torch.zeros(1 + WORLD, dtype=torch.float64)
    marks = []
    dist.barrier()
    for _ in range(steps):
        dist.all_reduce(stats)
        marks.append(time.monotonic())
    return marks


def _rank_main(rank: int, arm: str, steps: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ["LOCAL_RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        # stdout is the bench's JSON: the trainer's own lines ("ready at step", ETJ_RESULT) go to stderr
        with contextlib.redirect_stdout(sys.stderr):
            if arm == "ddp":
                marks = _ddp_arm(rank, steps)
            elif arm == "commit":
                marks = _commit_arm(rank, steps)
            else:
                marks = _etj_arm(rank, steps, str(Path(out_dir, "shm")))
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(marks))
    finally:
        dist.destroy_process_group()


def run_marks(arm: str, steps: int) -> list[float]:
    """Rank 0's marks (one a step) of one fresh 2-process run."""
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        mp.spawn(_rank_main, args=(arm, steps, str(Path(tmp, "init")), tmp), nprocs=WORLD, join=True)
        marks: list[float] = json.loads(Path(tmp, "rank0.json").read_text())
    assert len(marks) == steps, (arm, len(marks))
    return marks


def run_arm(arm: str, steps: int, warmup: int) -> float:
    """Seconds per step of one fresh 2-process run, steady state (rank 0's marks after the warm-up)."""
    marks = run_marks(arm, steps)
    return (marks[-1] - marks[warmup]) / (steps - 1 - warmup)


def _median_s(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def tax_breakdown(ddp_s_per_step: float) -> dict[str, Any]:
    """What etj's step does that the plain loop does not, each part timed alone (median of many, so the
    machine's noise hardly moves it) as seconds and as a fraction of the plain step: where the tax goes.

    ``zero_grad_memset``: what zeroing every gradient in place cost per step before issue 24 (a plain loop
    sets them to None; so does etj now). ``commit_allreduce``: the step's commit in a 2-process world.
    ``undo_capture``: the step-start record of buffers and generators. ``sampler``: the step's indices,
    its share and the schedule's position.
    """
    import torchvision

    from etj_trainer.batching.sampler import ElasticSampler
    from etj_trainer.core.rng import StepUndo

    torch.set_num_threads(1)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    F.cross_entropy(model(torch.randn(2, 3, IMAGE, IMAGE)), torch.tensor([0, 1])).backward()
    sampler = ElasticSampler(DATASET, 0)

    def indices() -> None:
        gidx = sampler.next_global_batch(GLOBAL_BATCH)
        ElasticSampler.rank_slice(gidx, WORLD, 0)
        sampler.commit(len(gidx))

    parts = {
        "zero_grad_memset": _median_s(lambda: opt.zero_grad(set_to_none=False), 50),
        "undo_capture": _median_s(lambda: StepUndo.capture(model), 200),
        "sampler": _median_s(indices, 200),
        "commit_allreduce": statistics.median(_gaps(run_marks("commit", 400), 50)),
    }
    return {k: {"s": round(v, 6), "of_ddp_step": round(v / ddp_s_per_step, 5)} for k, v in parts.items()}


def _gaps(marks: list[float], skip: int) -> list[float]:
    return [b - a for a, b in zip(marks[skip:], marks[skip + 1 :], strict=False)]


def snapshot_cost(interval_s: float) -> dict[str, float]:
    """The background snapshot of ResNet-18's state (weights + momentum): its copy on the training thread,
    its encode + write on the writer thread, and both amortised over the interval."""
    import torchvision

    from etj_trainer.checkpoint.store import CheckpointStore, StateWriter

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
    tax = tax_breakdown(ddp)
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
        "tax_breakdown": tax,
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

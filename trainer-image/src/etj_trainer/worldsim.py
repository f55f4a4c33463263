"""Run the real trainer in N local processes (gloo over loopback) without an elastic agent.

Used by the equivalence test and benchmarks to run "segments" at different world sizes that hand over
through checkpoints, exactly like a resize does, but deterministically and without rendezvous timing.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from etj_trainer.config import TrainConfig


def _rank_main(rank: int, world: int, init_file: str, cfg: TrainConfig, out_dir: str) -> None:
    from etj_trainer.trainer import train

    os.environ["LOCAL_RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        result = train(cfg)
        Path(out_dir, f"rank{rank}.done").write_text(f"{result.step} {result.loss}\n")
    finally:
        dist.destroy_process_group()


def run_world(cfg: TrainConfig, world_size: int) -> None:
    """Train with ``world_size`` ranks until ``cfg.max_steps``/``cfg.epochs``; raises if any rank fails."""
    with tempfile.TemporaryDirectory() as tmp:
        init_file = str(Path(tmp) / "init")
        mp.spawn(_rank_main, args=(world_size, init_file, replace(cfg), tmp), nprocs=world_size, join=True)
        missing = [r for r in range(world_size) if not Path(tmp, f"rank{r}.done").exists()]
        if missing:
            raise RuntimeError(f"ranks {missing} did not finish")

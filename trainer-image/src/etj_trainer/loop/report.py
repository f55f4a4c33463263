"""What a Job tells the operator: rank 0's progress reports and the resize records its checkpoints carry.

Split out of job.py (the loop and its state) as one concern: the bookkeeping across memberships of
where the world was (``prev_world``), where it restarted or re-formed (``restored_step``) and what the
operator last heard (``last_reported_step``), from which the first step at a new size writes its resize
record (pause, steps lost), and the progress document (etj_contract.progress) built from the job's state.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from etj_contract.progress import ProgressDoc, ResizeRecord, TrainerResize
from etj_trainer.batching.dynamic_sgd import DynamicSGD
from etj_trainer.batching.sampler import ElasticSampler
from etj_trainer.config import TrainConfig
from etj_trainer.core.progress import ProgressReporter, get_json
from etj_trainer.core.world import World
from etj_trainer.loop.step import Membership, lr_of


class Reported(Protocol):
    """What a report reads of the job (loop/job.py's ``Job``): its state, never its internals."""

    @property
    def config(self) -> TrainConfig: ...
    @property
    def sampler(self) -> ElasticSampler: ...
    @property
    def world(self) -> World: ...
    @property
    def membership(self) -> Membership | None: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer | None: ...
    @property
    def step(self) -> int: ...
    @property
    def meta(self) -> dict[str, Any]: ...  # what the checkpoints carry: samples seen, resizes, LR
    @property
    def loss(self) -> float: ...
    @property
    def rate(self) -> float: ...  # samples a second


@dataclass
class Report:
    """Rank 0's reporter and the pending resize record (every rank keeps the record: any may be rank 0
    after the next resize)."""

    reporter: ProgressReporter
    prev_world: int | None  # the world size before the current membership (None: a fresh start)
    restored_step: int  # the step this membership started from
    resize_pending: bool  # the next committed step writes a resize record
    last_reported_step: object = None  # what the operator last heard (steps lost in a restart)

    @classmethod
    def start(cls, url: str, world: World, meta: dict[str, Any], step: int, joiner: bool) -> Report:
        prev = int(meta["world_size"]) if "world_size" in meta else None
        report = cls(
            ProgressReporter(url if world.rank == 0 and not joiner else ""),
            prev,
            step,
            prev is not None and prev != world.size,
        )
        if world.rank == 0 and prev is not None and url:
            report.last_reported_step = (get_json(url) or {}).get("step")
        return report

    def resized_in_process(self, old_size: int, world: World, step: int, url: str) -> None:
        self.prev_world, self.resize_pending = old_size, True
        self.restored_step, self.last_reported_step = step, None
        if world.rank == 0 and not self.reporter.url:  # a new rank 0 starts reporting
            self.reporter = ProgressReporter(url)

    def record_resize(self, meta: dict[str, Any], world: World, step: int) -> None:
        """The first step at a new world size: the resize entry (pause = last step at old size -> now)."""
        self.resize_pending = False
        last = self.last_reported_step
        lost = max(0, last - self.restored_step) if isinstance(last, int) else 0
        grew = world.size > (self.prev_world or 0)
        meta["resizes"] = [
            *meta["resizes"],
            {
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "from": self.prev_world,
                "to": world.size,
                "reason": str(TrainerResize.SCALE_UP if grew else TrainerResize.SCALE_DOWN),
                "pauseSeconds": round(time.time() - float(meta.get("last_step_time", time.time())), 3),
                "stepsLost": lost,
            },
        ]
        print(f"etj: resize {self.prev_world}->{world.size} done at step {step}", flush=True)

    def report(self, job: Reported, stop_now: bool) -> None:
        """Rank 0, at a step boundary (forced when the world stops or just resized)."""
        first_after_resize = len(job.meta["resizes"]) > 0 and job.step == self.restored_step + 1
        self.reporter.report(progress(job), force=stop_now or first_after_resize)


def progress(job: Reported) -> dict[str, Any]:
    """The job's progress document (etj_contract.progress) as JSON."""
    m = job.membership
    assert m is not None
    doc = ProgressDoc(
        epoch=job.sampler.epoch,
        step=job.step,
        samples_seen=job.meta["samples_seen"],
        samples_total=job.sampler.dataset_size * job.config.epochs,
        samples_per_second=round(job.rate, 2),
        loss=job.loss if math.isfinite(job.loss) else None,
        world_size=job.world.size,
        per_rank_batch=m.plan.per_rank_batch,
        per_worker_batch=m.plan.per_worker_batch,
        accumulation_steps=m.plan.accumulation_steps,
        lr_multiplier=job.optimizer.lr_multiplier if isinstance(job.optimizer, DynamicSGD) else 1.0,
        lr=float(job.meta.get("lr", lr_of(job.optimizer))),  # the LR the last step trained with
        last_checkpoint=job.meta.get("last_checkpoint"),
        resizes=tuple(r for r in map(ResizeRecord.from_json, job.meta["resizes"]) if r is not None),
    )
    return doc.to_json()

"""What a Job tells the operator: rank 0's progress reports and the resize records its checkpoints carry.

Split out of job.py (the loop and its state) as one concern: the bookkeeping across memberships of
where the world was (``prev_world``), where it restarted or re-formed (``restored_step``) and what the
operator last heard (``last_reported_step``), from which the first step at a new size writes its resize
record (pause, steps lost), and the progress document (etj_contract.progress) built from the loop's state.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

from etj_contract.progress import ProgressDoc, ResizeRecord, StatePath, TrainerResize
from etj_trainer.batching.dynamic_sgd import DynamicSGD
from etj_trainer.checkpoint.store import StateWriter
from etj_trainer.config import TrainConfig
from etj_trainer.core.progress import ProgressReporter, get_json
from etj_trainer.core.world import World
from etj_trainer.loop._state import TrainState
from etj_trainer.loop.step import Membership, lr_of


class Reported(Protocol):
    """What a report reads of the loop (loop/_engine.py's ``Engine``): its state, never its internals."""

    @property
    def config(self) -> TrainConfig: ...
    @property
    def world(self) -> World: ...
    @property
    def membership(self) -> Membership | None: ...
    @property
    def state(self) -> TrainState: ...  # the sampler, the steps done, meta, the optimizer, the pace
    @property
    def writer(self) -> StateWriter: ...  # its shared writes: the newest failure while they fail


@dataclass
class Report:
    """Rank 0's reporter and the pending resize record (every rank keeps the record: any may be rank 0
    after the next resize)."""

    reporter: ProgressReporter
    prev_world: int | None  # the world size before the current membership (None: a fresh start)
    restored_step: int  # the step this membership started from
    resize_pending: bool  # the next committed step writes a resize record
    last_reported_step: object = None  # what the operator last heard (steps lost in a restart)
    path: StatePath = StatePath.RESTART  # how the state crossed the pending resize

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

    def resized_in_process(
        self, old_size: int, world: World, step: int, url: str, path: StatePath = StatePath.IN_PLACE
    ) -> None:
        self.prev_world, self.resize_pending, self.path = old_size, True, path
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
                "statePath": str(self.path),
            },
        ]
        print(f"etj: resize {self.prev_world}->{world.size} done at step {step} ({self.path})", flush=True)

    def report(self, job: Reported, stop_now: bool) -> None:
        """Rank 0, at a step boundary (forced when the world stops or just resized)."""
        state = job.state
        first_after_resize = len(state.meta["resizes"]) > 0 and state.steps_done == self.restored_step + 1
        self.reporter.report(progress(job), force=stop_now or first_after_resize)


def progress(job: Reported) -> dict[str, Any]:
    """The job's progress document (etj_contract.progress) as JSON."""
    m, state = job.membership, job.state
    assert m is not None
    meta, opt, loss = state.meta, state.optimizer, state.pace.loss
    doc = ProgressDoc(
        epoch=state.sampler.epoch,
        step=state.steps_done,
        samples_seen=meta["samples_seen"],
        samples_total=state.sampler.dataset_size * job.config.epochs,
        samples_per_second=round(state.pace.rate, 2),
        loss=loss if math.isfinite(loss) else None,
        world_size=job.world.size,
        per_rank_batch=m.plan.per_rank_batch,
        per_worker_batch=m.plan.per_worker_batch,
        accumulation_steps=m.plan.accumulation_steps,
        lr_multiplier=opt.lr_multiplier if isinstance(opt, DynamicSGD) else 1.0,
        lr=float(meta.get("lr", lr_of(opt))),  # the LR the last step trained with
        last_checkpoint=meta.get("last_checkpoint"),
        checkpoint_error=job.writer.shared_error,
        failed_writes=job.writer.failed_writes or None,
        resizes=tuple(r for r in map(ResizeRecord.from_json, meta["resizes"]) if r is not None),
    )
    return doc.to_json()

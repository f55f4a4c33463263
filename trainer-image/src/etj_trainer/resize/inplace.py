"""A running Job's in-process resizes: a graceful leave, an in-place join, and in-place crash recovery.

The protocols live in regroup.py (leave), join.py (join) and recover.py (crash); this module is the Job's
side of them, split out of loop/job.py so the loop API reads as a loop and this reads as the resize paths:

* ``InPlace.enter`` at the start of every membership: this rank's heartbeat beats under the membership's
  id (recover.Heartbeat: survivors of a crash tell a slow peer from a dead one), and rank 0 opens the
  join door (join.Door) when in-place resizes are on;
* ``InPlace.code``: rank 0's stop code when it has nothing else to say (ADMIT while a joiner waits);
* ``InPlace.lost_or_raise``: a step whose collective failed -- a ``recover.Lost`` when the survivors can
  redo it in place, else the error re-raised (torch elastic restarts the world);
* ``InPlace.regroup``: the world changes between two steps -- survivors of a leave or of a crash re-form
  among themselves, old ranks admit joiners, or a joiner enters with its ticket -- and every rank then
  holds the newest committed step (``sync_state``: tensor by tensor from the lowest rank holding it; a
  sharded state's own ``Sync``, loop/_reshard.py: resharded onto the new mesh, after a leave too);
* ``InPlace.close``: the door shuts when no world of this job runs on (finished, or restarting through the
  rendezvous); survivors going on in place keep admitting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import nn

from etj_trainer.config import TrainConfig
from etj_trainer.core import stopping
from etj_trainer.core.world import World
from etj_trainer.resize import bounds, join, recover, regroup
from etj_trainer.resize.state_sync import broadcast_state, newest_step


class HeldState(Protocol):
    """The state a rank holds (loop/_state.py's ``TrainState``): the one thing a resize sends and sets."""

    @property
    def steps_done(self) -> int: ...  # the last committed step
    @property
    def module(self) -> nn.Module | None: ...

    def state_dict(self, world_size: int) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...


class ResizingJob(Protocol):
    """What the resize paths read of the loop (loop/_engine.py's ``Engine``): who it is and the state it
    holds; a narrow view, so this layer does not import the loop above it."""

    @property
    def world(self) -> World: ...
    @property
    def config(self) -> TrainConfig: ...
    @property
    def incarnation(self) -> float: ...  # the current membership's id
    @property
    def state(self) -> HeldState: ...


Resize = regroup.Regroup | recover.Lost | join.Ticket  # what a world changes in process for
# After a re-form, every rank of the new world takes the newest state: (job, new world, behind: this rank
# holds no state yet, a joiner). ``sync_state`` for a replicated state; loop/_reshard.py's for a sharded one.
Sync = Callable[[ResizingJob, World, bool], None]


@dataclass
class InPlace:
    """This rank's part in the in-process resizes of its job (see the module docstring)."""

    door: join.Door | None = None  # rank 0: admits joiners at a step boundary
    watch: recover.Heartbeat | None = None  # this rank's heartbeat (in-place crash recovery)
    last_failed_step: int | None = None  # the committed step at the last in-place crash recovery
    states_agree: bool = False  # every rank of the new membership holds the same state (in-process resize)
    crash_in_place: bool = True  # False (a sharded state): a crash takes the restart path

    def enter(
        self, world: World, incarnation: float, allowed: bool = True, crash_in_place: bool = True
    ) -> None:
        """A membership starts: beat under its id; rank 0 opens the join door (once per process).
        ``allowed`` False (HSDP): no heartbeat and no door, so a crash and a joiner take the restart path;
        ``crash_in_place`` False (FSDP: a dead rank's shards are gone): only a crash does."""
        self.crash_in_place = crash_in_place
        if self.watch is None:
            enabled = allowed and world.dist_on and regroup.enabled_from_env()
            self.watch = recover.watch(enabled, incarnation, world.rank)
        else:
            self.watch.enter(f"{incarnation:.6f}", world.rank)
        if world.rank == 0 and self.watch is not None and self.door is None:
            self.door = join.Door.open()

    def code(self) -> stopping.StopCode:
        return join.code(self.door)

    def lost_or_raise(self, exc: BaseException, step: int, since_step_s: float) -> recover.Lost:
        enabled = self.watch is not None and self.crash_in_place
        return recover.lost_or_raise(exc, enabled, self.last_failed_step, step, since_step_s)

    def regroup(self, job: ResizingJob, to: Resize, sync: Sync | None = None) -> tuple[int, World] | None:
        """Re-form the world for ``to``; returns (the old size, the new world), or None when nothing
        changed (the joiners withdrew, or there was no room). Raises the step's error when a crash cannot
        be recovered in place (left out, or fewer survivors than the minimum)."""
        w, cfg = job.world, job.config
        sync = sync or sync_state
        membership = f"{job.incarnation:.6f}"
        old_size = w.size
        if isinstance(to, join.Ticket):  # this rank joins: its first group, then the state from rank 0
            regroup.reform(to.key, to.rank, to.size)
            old_size = to.old_size
            sync(job, World.current(), True)
        elif isinstance(to, regroup.Regroup) and to.admit:  # old ranks keep their numbers; joiners after
            # the job's maximum as the operator last set it: `kubectl scale` after this world started
            max_ranks = bounds.max_workers(cfg.progress_url, cfg.max_workers) * w.local_size
            adm = join.admission(self.door, membership, job.state.steps_done, w.rank, w.size, max_ranks)
            if not adm.joiners:
                return None
            regroup.reform(adm.key, w.rank, adm.new_size)
            sync(job, World.current(), False)
        elif isinstance(to, recover.Lost):
            recover.recover_in_place(to, membership, w.rank, w.size, cfg.min_workers * w.local_size)
            self.last_failed_step = job.state.steps_done
            sync(job, World.current(), False)
        else:
            regroup.reform(f"{membership}/{job.state.steps_done}", to.new_rank(w.rank), len(to.survivors))
            if sync is not sync_state:  # a replicated state is already everywhere after a leave
                sync(job, World.current(), False)
        self.states_agree = True
        return old_size, World.current()

    def close(self, shut: bool) -> None:
        if self.watch is not None:
            self.watch.close()
        if self.door is not None:
            self.door.close(shut=shut)


def sync_state(job: ResizingJob, w: World, behind: bool = False) -> None:
    """After an in-place re-form: every rank takes the newest committed step, tensor by tensor from the
    lowest rank holding it (a no-op when all agree, as they do unless a peer died inside the commit).
    ``behind``: this rank holds no step yet (a joiner)."""
    held = job.state
    best, src, steps = newest_step(-1 if behind else held.steps_done)
    if all(s == best for s in steps):
        return
    assert held.module is not None
    live = held.module.state_dict()

    def target(path: tuple[str, ...], _shape: Any, _dtype: Any) -> Any:
        # the model's tensors are received in place; the rest (optimizer state...) as new tensors
        return live.get(path[1]) if path[:1] == ("model",) and len(path) == 2 else None

    # the sender's meta carries its world's size as it was before this re-form, as a checkpoint would
    mine = held.state_dict(job.world.size) if w.rank == src else None
    state = broadcast_state(mine, src, w.rank, target, w.device)
    if w.rank != src:
        held.load_state(state)
    print(f"etj: state of step {best} from rank {src} (steps were {steps})", flush=True)

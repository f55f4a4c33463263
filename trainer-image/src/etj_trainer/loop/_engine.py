"""The engine under ``Job`` (loop/job.py, the public façade): the loop itself, its step boundary, the
memberships, the checkpoints and the failures.

``Engine.steps`` yields one ``Step`` per global step and runs ``Engine.boundary`` between two of them: the
one place that reads, in order, what happens after a step (accounting, resize record, stop decision,
checkpoint, report, regroup). The trained state is a ``TrainState`` (loop/_state.py) the steps apply
their commits to; steps, reports and resizes read the engine through small protocols (``Collectives``,
``Forwarding``, ``Reported``, ``ResizingJob``), never the ``Job``.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from etj_contract.progress import StatePath
from etj_trainer.batching.dynamic_sgd import DynamicSGD
from etj_trainer.batching.plan import ResizePolicy, plan_step
from etj_trainer.batching.sampler import ElasticSampler
from etj_trainer.checkpoint.store import CheckpointStore, StateWriter
from etj_trainer.config import TrainConfig
from etj_trainer.core import devices
from etj_trainer.core.progress import ProgressReporter
from etj_trainer.core.sample_log import SampleLog
from etj_trainer.core.stopping import mark_training_done
from etj_trainer.core.world import StopFlag, World, incarnation, installed
from etj_trainer.loop._reshard import Resharder
from etj_trainer.loop._sharding import ShardedCheckpoints
from etj_trainer.loop._state import TrainState
from etj_trainer.loop.loader import Loader
from etj_trainer.loop.report import Report, progress
from etj_trainer.loop.step import ElasticModule, Membership, Step, StepContext, still_training
from etj_trainer.resize import group_sockets, join, regroup
from etj_trainer.resize.inplace import InPlace, Resize
from etj_trainer.resize.state_sync import agree_on_checkpoint

log = logging.getLogger(__name__)
HSDP_RESTARTS = "parallelism HSDP: its shard groups resize through the restart path"


class Next(enum.Enum):
    """What ``Engine.boundary`` decided for the next step."""

    GO_ON = "the same membership"
    NEW_MEMBERSHIP = "the world re-formed in process (or tried to): a new DDP wrapper, plan and id"
    STOP = "this rank's loop ends here (a restart, or it leaves)"


class Engine:
    """The loop under ``Job``; see the module docstring."""

    def __init__(self, config: TrainConfig, dataset_size: int, stop: StopFlag | None) -> None:
        self.t_start = time.monotonic()
        self.config = cfg = config
        self.state = TrainState(ElasticSampler(dataset_size, cfg.seed))
        self.schedule = cfg.schedule()
        # A joiner forms its first group when the running world admits it (join.py); group_sockets: so a
        # survivor of a crash can shut the failed group's sockets (recover.close_failed_group).
        # First of all, this rank's own GPU (a script started by torchrun has no etj worker to bind it).
        devices.bind_this_rank()
        if "WORLD_SIZE" in os.environ and not dist.is_initialized() and not join.joining():
            group_sockets.init_first()
        self.world = World.current()
        self.stop = stop or installed() or StopFlag().install()
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank, before any restore
        self.ckpts = CheckpointStore.for_config(cfg)
        self.writer = StateWriter(self.ckpts, cfg.local_snapshot_interval_s)
        # FSDP/HSDP: the state is sharded; its checkpoints are DCP's, written by every rank (_sharding.py)
        self.sharded = ShardedCheckpoints(cfg) if cfg.sharded else None
        self.resharder: Resharder | None = None  # FSDP's in-place resizes (_reshard.py): set by setup_model
        self.model: ElasticModule | None = None  # the wrapper of state.module that training calls
        self.loaders: list[Loader[Any]] = []  # closed with the job (their streams, DataLoader workers)
        self.membership: Membership | None = None
        self.report = Report(ProgressReporter(""), None, 0, False)  # started by steps()
        self.incarnation = 0.0  # the current membership's (world.incarnation)
        self.inplace = InPlace()  # this rank's part in in-process leaves, joins and crash recoveries
        self.stopped_early = False  # stopped by a SIGTERM somewhere in the world
        self.survivors_go_on = False  # this rank leaves and the others re-form the world without it
        self.finished = False
        self._current: Step | None = None
        self._failure_handled = False

    # ---- what steps and modules read (Collectives, Forwarding) ------------------------------------------

    @property
    def ddp(self) -> nn.Module | None:
        return self.membership.ddp if self.membership is not None else None

    @property
    def step_lost(self) -> bool:
        """The step in progress failed because a peer died: it is redone once the world re-forms."""
        return self._current is not None and self._current.lost is not None

    def stop_code(self) -> int:
        """This rank's code in a step's commit all-reduce: its own stop request, else what the in-process
        resizes have to say (rank 0: ADMIT while a joiner waits)."""
        return int(self.stop.code or self.inplace.code())

    # ---- the loop ------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return still_training(self.config, self.state.sampler.epoch, self.state.steps_done)

    def steps(self) -> Iterator[Step]:
        """Restore (or be admitted), then one ``Step`` per global step, each followed by the boundary."""
        if self.model is None or self.state.optimizer is None:
            raise RuntimeError("call setup_model() and setup_optimizer() before steps()")
        self._start()
        if self.stopped_early:  # a joiner never admitted: the restart path
            return
        ctx = self._begin_membership()
        while self.running:
            step = self._current = Step(ctx)
            yield step
            after = self.boundary(step)
            if after is Next.STOP:
                return
            if after is Next.NEW_MEMBERSHIP:
                ctx = self._begin_membership()
        # The last step is trained (or there was none left to train): this node's agent restarts nothing
        # for a node that waits to join now (elastic_agent.py), whatever the script does before finish().
        mark_training_done()

    def boundary(self, step: Step) -> Next:
        """Between two steps, in order: a lost step is undone and the world re-forms; else the step's
        commit is checked, the first step at a new size writes its resize record, the stop codes decide who
        stops and who regroups, the state is saved (just in time, or in the background when due), rank 0
        reports, and the world regroups when someone leaves or joins."""
        # Lost: a peer died before the commit. The survivors undo the step and redo it in a new membership.
        if step.lost is not None:
            step.roll_back()
            return self._regroup(step.lost)
        # Commit: step.optimizer_step() ran it (the all-reduce, then TrainState.apply); it must have.
        if not step.committed:
            raise RuntimeError("call step.optimizer_step() once in every step")
        # Record: the first committed step at a new world size.
        w, cfg, meta = self.world, self.config, self.state.meta
        if self.report.resize_pending:
            self.report.record_resize(meta, w, self.state.steps_done)
        meta["last_step_time"] = time.time()
        # Stop decision: any rank's code stops this membership; the survivors may go on in process.
        stop_now = any(step.codes)
        regroup_to = self._decide(step.codes) if stop_now else None
        # Save: just in time when this rank stops, else in the background when an interval is due.
        self._save_at_boundary(stop_now, leaving=stop_now and regroup_to is None)
        # Report: rank 0, after every step (the operator's progress), then the writes' failure budget.
        if w.rank == 0:
            # forced at a stop and after the last step: a script may work on long before its finish()
            self.report.report(self, stop_now or not self.running)
            self.writer.check_failures(cfg.checkpoint_max_failed_writes)  # after the report that says why
        # Regroup: in process among the survivors (and joiners), or stop (the restart path).
        if not stop_now:
            return Next.GO_ON
        if regroup_to is None:
            self.stopped_early = True
            return Next.STOP
        return self._regroup(regroup_to)

    def _decide(self, codes: list[int]) -> regroup.Regroup | None:
        """Who stops after this step; returns where this rank regroups to (None: it stops)."""
        w, cfg = self.world, self.config
        decision = regroup.decide(
            codes,
            cfg.min_ranks,
            w.dist_on and regroup.enabled_from_env() and not cfg.hsdp,
            procs_per_node=w.local_size,
            disabled=HSDP_RESTARTS if cfg.hsdp else None,
        )
        self.survivors_go_on = decision.in_process
        if w.rank == 0:
            print(f"etj: after step {self.state.steps_done}: {decision.describe()}", flush=True)
        return decision if decision.in_process and w.rank in decision.survivors else None

    def _save_at_boundary(self, stop_now: bool, leaving: bool) -> None:
        # Just in time (synchronously) when this rank stops; survivors of an in-process resize keep their
        # state in memory, so they skip it and go on at once. Otherwise in the background: the shared copy
        # on its interval, the node-local one every local_snapshot_interval_s.
        w, cfg, step = self.world, self.config, self.state.steps_done
        if self.resharder is not None and stop_now and self.survivors_go_on:
            self.resharder.hand_over(w.size)  # every rank, the leaving ones too; nothing is written
        elif self.sharded is not None:
            # Every rank takes part (DCP is a collective) and synchronously: a background thread's
            # collectives would interleave with the steps'. No node-local copy: a node holds its shards only.
            shared_due = cfg.checkpoint_interval_steps > 0 and step % cfg.checkpoint_interval_steps == 0
            if stop_now or shared_due:
                self.sharded.save(self.state, w, self.writer, must=stop_now)
        elif leaving:
            self._save(shared=True)
        elif not stop_now:
            shared_due = cfg.checkpoint_interval_steps > 0 and step % cfg.checkpoint_interval_steps == 0
            shared, local = shared_due and w.rank == 0, w.local_rank == 0 and self.writer.local_due()
            if shared or local:
                self.writer.background(self.state_dict, step, shared=shared, local=w.local_rank == 0)
        if self.writer.durable is not None:  # only a write confirmed done (a background one may be running)
            self.state.meta["last_checkpoint"] = self.writer.durable

    def finish(self, **metrics: Any) -> None:
        """Final checkpoint and report (after a stop only closing), then the world's last barrier."""
        if self.finished:
            return
        self.finished = True
        w = self.world
        self._close_loaders()
        self.writer.wait()
        if not self.stopped_early and self.membership is not None:
            # A world restored from the final checkpoint of a world that finished (a restart that came
            # too late to be refused): the result was emitted there; the report is repeated, not the line.
            emitted = bool(self.state.meta.get("finished"))
            self.state.meta["finished"] = True
            if not emitted:
                self._save(shared=True)
            if w.rank == 0:
                payload = progress(self)
                payload.update(finished=True, **metrics)
                # Synchronous and retried: the operator marks the job Succeeded from this report.
                self.report.reporter.finish(payload)
                done, loss = self.state.steps_done, self.state.pace.loss
                result = {"step": done, "loss": loss, "worldSize": w.size, **metrics}
                if not emitted:
                    print("ETJ_RESULT " + json.dumps(result), flush=True)
        if self.membership is not None:
            self.report.reporter.close()
        self.inplace.close(shut=not self.survivors_go_on)  # survivors going on in place keep admitting
        if w.dist_on and not self.survivors_go_on and dist.is_initialized():
            dist.barrier()  # the survivors of an in-process resize have left this group already

    # ---- failures ------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Around every collective of a step. A peer that died fails it: when the survivors can redo the
        step in place (recover.py) the error is swallowed and the step marked lost (its remaining calls do
        nothing, ``steps()`` re-forms the world and yields the step again); otherwise the last committed
        step's local copy is written and the error goes on (torch elastic restarts the world)."""
        try:
            yield
        except Exception as e:
            step = self._current
            if step is None or step.committed or step.lost is not None:
                self.on_failure()
                raise
            try:
                since = time.monotonic() - self.state.pace.t_last_commit
                step.lost = self.inplace.lost_or_raise(e, self.state.steps_done, since)
            except Exception:
                self.on_failure()
                raise

    def on_failure(self) -> None:
        """A step failed (a peer crashed mid-collective, or this rank is being stopped): roll back what
        the step changed and write the node-local copy, so this node restarts from the last commit."""
        if self._failure_handled or self.state.in_commit:
            return
        self._failure_handled = True
        self._close_loaders()
        if self._current is not None and not self._current.committed:
            self._current.roll_back()
        if self.sharded is not None:
            # a sharded copy takes every rank, and a peer just failed: the restart resumes from the newest
            # checkpoint (at most checkpoint_interval_steps old)
            return
        if self.world.local_rank != 0 or self.membership is None:
            return
        try:
            step = self.state.steps_done
            self.writer.now(self.state_dict(), step, shared=False, local=True)
            print(f"etj: a step failed; wrote the local copy of step {step}", flush=True)
        except Exception as e:  # the failure being raised is the one to report
            log.warning("could not write the local copy after a failed step: %s", e)

    def _close_loaders(self) -> None:
        for loader in self.loaders:
            loader.close()

    # ---- state ---------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return self.state.state_dict(self.world.size)

    def _save(self, shared: bool) -> None:
        # Every rank holds the same state after a step; rank 0 writes the shared copy, each node's local
        # rank 0 its node-local copy (which is what survivors restore from).
        w = self.world
        if self.sharded is not None:
            self.sharded.save(self.state, w, self.writer, must=True)
            return
        if w.local_rank != 0 and w.rank != 0:
            return
        local = w.local_rank == 0
        self.writer.now(self.state_dict(), self.state.steps_done, shared=shared and w.rank == 0, local=local)

    def _restore(self) -> int | None:
        """Load the world's newest checkpoint (every rank offers its own); returns the rank it came from."""
        if self.sharded is not None:  # one shared directory, resharded onto this world
            return None if self.sharded.restore(self.state, self.world) is None else 0
        state, src = agree_on_checkpoint(self.ckpts, self.world.rank, self.world.size)
        if state is None:
            return None
        self.state.load_state(state)
        return src

    # ---- start, membership, regroup ------------------------------------------------------------------------

    def _start(self) -> None:
        """Restore the world's newest checkpoint (every rank offers its own), or, a joiner, be admitted."""
        w = self.world
        t_restore = time.monotonic()
        joiner = join.joining()  # warm now (model, data); the state comes from a peer once admitted
        src = None if joiner else self._restore()
        if joiner:
            print(
                f"etj: joiner warm in {time.monotonic() - self.t_start:.2f} s; asking to be admitted",
                flush=True,
            )
        elif w.rank == 0:
            # Where a (re)start spends its time: part of every restart-based resize pause.
            print(
                f"etj: rank 0 of {w.size} ready at step {self.state.steps_done} "
                f"in {time.monotonic() - self.t_start:.2f} s "
                f"(restore {time.monotonic() - t_restore:.2f} s"
                + (f" from rank {src})" if src is not None else ", nothing to restore)"),
                flush=True,
            )
        meta, done = self.state.meta, self.state.steps_done
        self.report = Report.start(self.config.progress_url, w, meta, done, joiner)
        if joiner:
            ticket = join.ask()
            if ticket is None:  # never admitted: the restart path (our agent joins the rendezvous)
                print("etj: not admitted in place; restarting through the rendezvous", flush=True)
                self.stopped_early = True
                return
            self._regroup(ticket)

    def _begin_membership(self) -> StepContext:
        """A new membership of the world: its DDP wrapper, batch plan and id; returns what its steps read."""
        w, cfg = self.world, self.config
        assert self.model is not None
        ddp = None
        if w.dist_on and self.config.sharded:
            ddp = self.model.module  # sharded in place by setup_model: FSDP2 has no wrapper
        elif w.dist_on:
            ddp = nn.parallel.DistributedDataParallel(
                self.model.module,
                device_ids=[w.local_rank] if w.device.type == "cuda" else None,
                # after an in-process resize every rank holds the same state already (the joiners got it
                # from rank 0): DDP's own broadcast of the whole model would only repeat that transfer
                init_sync=not self.inplace.states_agree,
            )
        self.inplace.states_agree = False
        policy = ResizePolicy(cfg.resize_policy)
        plan = plan_step(
            policy, cfg.global_batch_size, cfg.micro_batch_size, w.size, cfg.min_ranks, cfg.procs_per_worker
        )
        if policy == ResizePolicy.DYNAMIC_SGD:
            assert isinstance(self.state.optimizer, DynamicSGD)
            # ramps from the multiplier in force to this world's
            self.state.optimizer.set_target(plan.lr_target)
        inc = self.incarnation = incarnation(w.dist_on)
        # heartbeat under this membership's id; rank 0 opens the join door (not under HSDP); a crash of a
        # sharded state takes the restart path (the dead rank's shards are gone)
        self.inplace.enter(w, inc, allowed=not cfg.hsdp, crash_in_place=not cfg.sharded)
        samples_log = SampleLog(cfg.sample_log_dir, w.rank, inc) if cfg.sample_log_dir else None
        self.model.train()
        m = self.membership = Membership(w, plan, inc, cfg, self.state, ddp, samples_log)
        return StepContext(self.state, m, cfg, self.schedule, self)

    def _regroup(self, to: Resize) -> Next:
        """The world changes between two steps, in process (inplace.py): same state, next step."""
        t0 = time.monotonic()
        if self.membership is not None:
            self.membership.ddp = None  # the old group's wrapper goes with the group
        changed = self.inplace.regroup(self, to, self.resharder.sync if self.resharder is not None else None)
        if changed is None:  # the joiners withdrew, or there was no room: the same world goes on
            if self.resharder is not None:
                self.resharder.held = None  # the hand-over gathered for them is not kept
            return Next.NEW_MEMBERSHIP
        old_size, self.world = changed
        step = self.state.steps_done
        print(
            f"etj: resizing {old_size}->{self.world.size} in process at step {step} "
            f"(world re-formed, state agreed in {time.monotonic() - t0:.2f} s)",
            flush=True,
        )
        path = StatePath.IN_PLACE_RESHARDED if self.resharder is not None else StatePath.IN_PLACE
        self.report.resized_in_process(old_size, self.world, step, self.config.progress_url, path)
        self.survivors_go_on = False  # every rank of the old group that goes on is in the new one
        return Next.NEW_MEMBERSHIP

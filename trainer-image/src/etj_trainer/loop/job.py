"""The loop API's ``Job``: the world, the config, the registered state and the loop's bookkeeping.

The public face and reference of the API is ``etj_trainer.elastic`` (its docstring says what etj
guarantees a loop written on it); scripts import from there, not from here. ``Job``'s parts share its
state and read in order as one loop: registering state, the loop, failures, state, and the internals of
a membership (start, commit, boundary, regroup).

Long because: ``Job``'s parts share its state and read in order as one loop; what could be split by
concern already is (step.py, report.py, resize/inplace.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from etj_trainer.batching.dynamic_sgd import DynamicSGD
from etj_trainer.batching.plan import ResizePolicy, plan_step
from etj_trainer.batching.sampler import ElasticSampler
from etj_trainer.checkpoint.store import CheckpointStore, StateWriter
from etj_trainer.config import TrainConfig, config_for_job
from etj_trainer.core import devices
from etj_trainer.core.progress import ProgressReporter
from etj_trainer.core.rng import capture_rng, restore_rng
from etj_trainer.core.sample_log import SampleLog
from etj_trainer.core.world import StopFlag, World, incarnation, installed
from etj_trainer.data.stream import Micro
from etj_trainer.loop.loader import Loader, make_loader
from etj_trainer.loop.report import Report, progress
from etj_trainer.loop.step import ElasticModule, Membership, Step, still_training
from etj_trainer.resize import group_sockets, join, regroup
from etj_trainer.resize.inplace import InPlace, Resize
from etj_trainer.resize.state_sync import agree_on_checkpoint

log = logging.getLogger(__name__)
B = TypeVar("B")


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], /) -> Any: ...


_last_job: Job | None = None  # the last Job of this process: etj-train worker picks its exit code from it


def last_job() -> Job | None:
    return _last_job


class Job:
    """The world, the config, the registered state and the loop's bookkeeping; see the module docstring.

    The config, in one precedence order: ``config`` (a ``TrainConfig``, used as given; nothing else is
    read), else the ``ETJ_*`` environment the operator or ``etj-train`` sets, over ``defaults`` (config
    fields as keywords, e.g. ``global_batch_size=256, lr=0.1`` in a script that also runs outside etj),
    over ``TrainConfig``'s defaults. A keyword the environment overrides with another value is warned
    about (``ConfigOverridden``), on rank 0.
    """

    def __init__(
        self,
        dataset_size: int,
        config: TrainConfig | None = None,
        *,
        stop: StopFlag | None = None,
        **defaults: Any,
    ) -> None:
        global _last_job
        self.t_start = time.monotonic()
        self.config = cfg = config_for_job(config, defaults)
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
        self.sampler = ElasticSampler(dataset_size, cfg.seed)
        self.ckpts = CheckpointStore.for_config(cfg)
        self.writer = StateWriter(self.ckpts, cfg.local_snapshot_interval_s)
        self.schedule = cfg.schedule()
        self.step = 0
        self.meta: dict[str, Any] = {"resizes": [], "samples_seen": 0}
        self.model: ElasticModule | None = None
        self.ddp: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler: torch.amp.GradScaler | None = None
        self.extra: dict[str, Stateful] = {}
        self.loaders: list[Loader[Any]] = []  # closed with the job (their streams, DataLoader workers)
        self.membership: Membership | None = None
        self.report = Report(ProgressReporter(""), None, 0, False)  # started by steps()
        self.incarnation = 0.0  # the current membership's (world.incarnation)
        self.inplace = InPlace()  # this rank's part in in-process leaves, joins and crash recoveries
        self.stopped_early = False  # stopped by a SIGTERM somewhere in the world
        self.survivors_go_on = False  # this rank leaves and the others re-form the world without it
        self.loss = math.nan
        self.rate = 0.0
        self.finished = False
        self._committed = True  # the state in memory is the last committed step
        self._current: Step | None = None
        self._failure_handled = False
        self.samples_log: SampleLog | None = None
        self.t_last_commit = time.monotonic()
        self._codes: list[int] = []
        _last_job = self

    # ---- registering state ---------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.world.device

    @property
    def step_lost(self) -> bool:
        """The step in progress failed because a peer died: it is redone once the world re-forms."""
        return self._current is not None and self._current.lost is not None

    def stop_code(self) -> int:
        """This rank's code in a step's commit all-reduce: its own stop request, else what the in-process
        resizes have to say (rank 0: ADMIT while a joiner waits)."""
        return int(self.stop.code or self.inplace.code())

    def setup_model(self, module: nn.Module) -> ElasticModule:
        """Move ``module`` to the job's device; returns the module to train with (and checkpoint)."""
        module = module.to(self.device)
        if self.config.sync_batchnorm and self.world.dist_on:
            module = nn.SyncBatchNorm.convert_sync_batchnorm(module)
        self.model = ElasticModule(module, self)
        return self.model

    def setup_optimizer(
        self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None = None
    ) -> torch.optim.Optimizer:
        """Register the optimizer (and an fp16 GradScaler, which ``Step`` then applies)."""
        if ResizePolicy(self.config.resize_policy) == ResizePolicy.DYNAMIC_SGD and not isinstance(
            optimizer, DynamicSGD
        ):
            raise TypeError("resizePolicy DynamicSGD needs an etj_trainer.elastic.DynamicSGD optimizer")
        self.optimizer, self.scaler = optimizer, scaler
        return optimizer

    def setup_dynamic_sgd(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        scaler: torch.amp.GradScaler | None = None,
    ) -> DynamicSGD:
        """A ``DynamicSGD`` from the config (``lr``, ``dsgd_ramp_steps``, ``momentum``, ``weight_decay``,
        ``nesterov``; parameter groups may set their own), registered as the optimizer. Under either
        resize policy: with FixedGlobalBatch its multiplier stays 1, and the config's LR schedule acts."""
        cfg = self.config
        opt = DynamicSGD(
            params,
            lr=cfg.lr,
            ramp_steps=cfg.dsgd_ramp_steps,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            nesterov=cfg.nesterov,
        )
        self.setup_optimizer(opt, scaler)
        return opt

    def loader(
        self,
        dataset: Dataset[Any] | None = None,
        *,
        stream: Callable[[Iterator[Micro]], Iterable[B]] | None = None,
        empty: Callable[[], B] | None = None,
        **dataloader_args: Any,
    ) -> Loader[Any]:
        """A loader of this rank's micro-batches that follows membership changes (loop/loader.py); read it
        with ``step.batches(loader)``. Either a map-style ``dataset`` (through a ``torch.utils.data.
        DataLoader``: ``num_workers``, ``collate_fn``, ``pin_memory``... in ``dataloader_args``), or your
        own ``stream`` (``Micro``s in, one batch each out, in order) with ``empty()`` for an empty share.
        Closed with the job."""
        made = make_loader(dataset, stream, empty, dataloader_args)
        self.loaders.append(made)
        return made

    def register(self, name: str, obj: Stateful) -> None:
        """Checkpoint ``obj`` (anything with ``state_dict``/``load_state_dict``: an LR scheduler, an EMA)."""
        if name in ("model", "optimizer", "scaler", "sampler", "step", "rng", "meta"):
            raise ValueError(f"{name!r} is taken by etj's own state")
        self.extra[name] = obj

    # ---- the loop --------------------------------------------------------------------------------------

    def steps(self) -> Iterator[Step]:
        """Restore, then yield one ``Step`` per global step until the epochs/max steps are done or the world
        stops (``stopped_early``); a graceful leave re-forms the world between two steps."""
        if self.model is None or self.optimizer is None:
            raise RuntimeError("call setup_model() and setup_optimizer() before steps()")
        self._start()
        while not self.stopped_early:  # one pass per membership (a joiner never admitted stops at once)
            m = self.membership = self._begin_membership()
            resize: Resize | None = None
            while self.running:
                step = self._current = Step(self, m)
                yield step
                if step.lost is not None:  # a peer died: the survivors redo this step in a new membership
                    step.roll_back()
                    resize = step.lost
                    break
                if not step.committed:
                    raise RuntimeError("call step.optimizer_step() once in every step")
                resize, stop_now = self.boundary()
                if stop_now:
                    self.stopped_early = resize is None
                    break
            if resize is None:
                return
            self._regroup(resize)

    @property
    def running(self) -> bool:
        return still_training(self.config, self.sampler.epoch, self.step)

    def finish(self, **metrics: Any) -> None:
        """Final checkpoint and the final report (with ``metrics``, e.g. ``accuracy``); then the world's
        last barrier. After a stop (``stopped_early``) it only closes the job. Called by ``with`` too."""
        if self.finished:
            return
        self.finished = True
        w = self.world
        self._close_loaders()
        self.writer.wait()
        if not self.stopped_early and self.membership is not None:
            self._save(shared=True)
            if w.rank == 0:
                payload = progress(self)
                payload.update(finished=True, **metrics)
                # Synchronous and retried: the operator marks the job Succeeded from this report.
                self.report.reporter.finish(payload)
                result = {"step": self.step, "loss": self.loss, "worldSize": w.size, **metrics}
                print("ETJ_RESULT " + json.dumps(result), flush=True)
        if self.membership is not None:
            self.report.reporter.close()
        self.inplace.close(shut=not self.survivors_go_on)  # survivors going on in place keep admitting
        if w.dist_on and not self.survivors_go_on and dist.is_initialized():
            dist.barrier()  # the survivors of an in-process resize have left this group already

    def __enter__(self) -> Job:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            self.on_failure()
        else:
            self.finish()

    # ---- failures ----------------------------------------------------------------------------------------

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
                step.lost = self.inplace.lost_or_raise(e, self.step, time.monotonic() - self.t_last_commit)
            except Exception:
                self.on_failure()
                raise

    def on_failure(self) -> None:
        """A step failed (a peer crashed mid-collective, or this rank is being stopped): roll back what
        the step changed and write the node-local copy, so this node restarts from the last commit."""
        if self._failure_handled or not self._committed:
            return
        self._failure_handled = True
        self._close_loaders()
        if self._current is not None and not self._current.committed:
            self._current.roll_back()
        if self.world.local_rank != 0 or self.membership is None:
            return
        try:
            self.writer.now(self.state_dict(), self.step, shared=False, local=True)
            print(f"etj: a step failed; wrote the local copy of step {self.step}", flush=True)
        except Exception as e:  # the failure being raised is the one to report
            log.warning("could not write the local copy after a failed step: %s", e)

    def _close_loaders(self) -> None:
        for loader in self.loaders:
            loader.close()

    # ---- state ---------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds (references to the live tensors: copy before training goes on)."""
        assert self.model is not None and self.optimizer is not None
        state: dict[str, Any] = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state_dict(),
            "step": self.step,
            "rng": capture_rng(),
            "meta": {**self.meta, "world_size": self.world.size},
        }
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        state.update({k: v.state_dict() for k, v in self.extra.items()})
        return state

    def _restore(self) -> int | None:
        """Load the world's newest checkpoint (every rank offers its own); returns the rank it came from."""
        state, src = agree_on_checkpoint(self.ckpts, self.world.rank, self.world.size)
        if state is None:
            return None
        self.load_state(state)
        return src

    def load_state(self, state: dict[str, Any]) -> None:
        """Put a checkpoint's (or a peer's) state into the registered objects."""
        assert self.model is not None and self.optimizer is not None
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        for k, v in self.extra.items():
            if k in state:
                v.load_state_dict(state[k])
        self.sampler.load_state_dict(state["sampler"])
        restore_rng(state["rng"])
        self.step, self.meta = int(state["step"]), dict(state["meta"])

    def _save(self, shared: bool) -> None:
        # Every rank holds the same state after a step; rank 0 writes the shared copy, each node's local
        # rank 0 its node-local copy (which is what survivors restore from).
        w = self.world
        if w.local_rank != 0 and w.rank != 0:
            return
        self.writer.now(self.state_dict(), self.step, shared=shared and w.rank == 0, local=w.local_rank == 0)

    # ---- internals: start, membership, commit, boundary, regroup, progress ----------------------------

    def _start(self) -> None:
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
                f"etj: rank 0 of {w.size} ready at step {self.step} "
                f"in {time.monotonic() - self.t_start:.2f} s "
                f"(restore {time.monotonic() - t_restore:.2f} s"
                + (f" from rank {src})" if src is not None else ", nothing to restore)"),
                flush=True,
            )
        self.report = Report.start(self.config.progress_url, w, self.meta, self.step, joiner)
        if joiner:
            ticket = join.ask()
            if ticket is None:  # never admitted: the restart path (our agent joins the rendezvous)
                print("etj: not admitted in place; restarting through the rendezvous", flush=True)
                self.stopped_early = True
                return
            self._regroup(ticket)

    def _begin_membership(self) -> Membership:
        w, cfg = self.world, self.config
        assert self.model is not None
        self.ddp = None
        if w.dist_on:
            self.ddp = nn.parallel.DistributedDataParallel(
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
            assert isinstance(self.optimizer, DynamicSGD)
            self.optimizer.set_target(plan.lr_target)  # ramps from the multiplier in force to this world's
        inc = self.incarnation = incarnation(w.dist_on)
        self.inplace.enter(w, inc)  # heartbeat under this membership's id; rank 0 opens the join door
        self.samples_log = SampleLog(cfg.sample_log_dir, w.rank, inc) if cfg.sample_log_dir else None
        self.model.train()
        return Membership(world=w, plan=plan, incarnation=inc, job=self)

    def commit_step(self, step: Step, loss: float, codes: list[int]) -> None:
        """After the commit all-reduce: only local work, which no peer's failure can interrupt."""
        assert self.optimizer is not None
        self._committed = False
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips the step (and lowers the scale) on inf/nan gradients
            self.scaler.update()
        else:
            self.optimizer.step()
        self.sampler.commit(len(step.indices))
        self.step += 1
        self.meta["samples_seen"] = int(self.meta["samples_seen"]) + len(step.indices)
        self.meta["lr"] = step.lr
        self._committed = step.committed = True
        self.loss, self._codes = loss, codes
        now = time.monotonic()
        inst = len(step.indices) / max(now - self.t_last_commit, 1e-9)
        self.rate = 0.8 * self.rate + 0.2 * inst if self.rate else inst
        self.t_last_commit = now

    def boundary(self) -> tuple[regroup.Regroup | None, bool]:
        """The step boundary: resize record, who stops, checkpoints, progress. Returns (where the
        survivors regroup to, whether this membership ends here)."""
        w, cfg = self.world, self.config
        if self.report.resize_pending:
            self.report.record_resize(self.meta, w, self.step)
        self.meta["last_step_time"] = time.time()
        stop_now = any(self._codes)
        regroup_to = None
        if stop_now:
            decision = regroup.decide(
                self._codes,
                cfg.min_ranks,
                w.dist_on and regroup.enabled_from_env(),
                procs_per_node=w.local_size,
            )
            self.survivors_go_on = decision.in_process
            if w.rank == 0:
                print(f"etj: after step {self.step}: {decision.describe()}", flush=True)
            if decision.in_process and w.rank in decision.survivors:
                regroup_to = decision
        shared_due = cfg.checkpoint_interval_steps > 0 and self.step % cfg.checkpoint_interval_steps == 0
        # Just in time (synchronously) when this rank stops; survivors of an in-process resize keep their
        # state in memory, so they skip it and go on at once. Otherwise in the background: the shared copy
        # on its interval, the node-local one every local_snapshot_interval_s.
        jit = stop_now and regroup_to is None
        if jit:
            self._save(shared=True)
        elif not stop_now:
            shared, local = shared_due and w.rank == 0, w.local_rank == 0 and self.writer.local_due()
            if shared or local:
                self.writer.background(self.state_dict, self.step, shared=shared, local=w.local_rank == 0)
        if shared_due or jit:
            self.meta["last_checkpoint"] = {
                "step": self.step,
                "path": str(cfg.checkpoint_dir),
                "time": time.time(),
            }
        if w.rank == 0:
            self.report.report(self, stop_now)
        return regroup_to, stop_now

    def _regroup(self, to: Resize) -> None:
        """The world changes between two steps, in process (inplace.py): same state, next step."""
        t0 = time.monotonic()
        self.ddp = None  # the old group's wrapper goes with the group
        changed = self.inplace.regroup(self, to)
        if changed is None:
            return  # the joiners withdrew, or there was no room: the same world goes on
        old_size, self.world = changed
        print(
            f"etj: resizing {old_size}->{self.world.size} in process at step {self.step} "
            f"(world re-formed, state agreed in {time.monotonic() - t0:.2f} s)",
            flush=True,
        )
        self.report.resized_in_process(old_size, self.world, self.step, self.config.progress_url)
        self.survivors_go_on = False  # every rank of the old group that goes on is in the new one

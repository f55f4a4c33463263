"""The training loop (one process per rank, started by torch elastic or directly).

Per step: the elastic sampler gives the step's global indices; the LR schedule is evaluated at the samples
seen (schedule.py) and composed with the Dynamic SGD multiplier; this rank takes its share, runs it in
micro-batches (gradient accumulation under ``no_sync``, autocast/GradScaler per ``precision``), scales its
summed loss so DDP's average is the global mean gradient (see batching.py); then one small all-reduce
carries the loss and a "stop" code per rank -- the step's commit point -- and only then does the optimizer
step. The code is how a SIGTERM on any rank becomes a clean stop of *every* rank at the same step boundary:
the state is checkpointed (shared copy: just in time; local copy: every step), the rank that got the signal
exits 0 and the others exit ``EXIT_RESIZE`` so their agents re-rendezvous at once -- or, for a graceful
leave, the survivors re-form the world in process (regroup.py). Rank 0's code also admits waiting joiners
in process (join.py), and a step that fails because a peer died is redone in process by the survivors
(recover.py): before the commit point nothing in memory has changed.

Parts: ``World`` (who we are in this membership), ``State`` (what a step changes and a checkpoint holds),
``Loop`` (rate, loss, reporting, the pending resize entry); ``_build``/``_restore`` (start),
``_run_membership`` (the steps of one membership), ``_train_step`` (one step), ``_after_step`` (resize
log, checkpoint, progress), ``_regroup`` (in-process resize: leave, join, crash), ``_sync_state`` (the
newest committed step from a peer, tensor by tensor), ``_finish`` (final checkpoint, validation, the final
report).

Why one module over ~400 lines: these parts share ``World``/``State``/``Loop`` and are read in order as
one loop; each function is short (the longest under 60 lines). The natural next cut is the public
training-loop API of issue 14 (a user's script driving the same parts), which will take the parts out of
here rather than split them by size now.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from etj_contract.progress import ProgressDoc, ResizeRecord, TrainerResize
from etj_trainer import bounds, join, recipe, recover, regroup
from etj_trainer.batching import BatchPlan, ResizePolicy, micro_batch_sizes, plan_step
from etj_trainer.checkpoint import CheckpointStore
from etj_trainer.config import TrainConfig
from etj_trainer.data import Augmenter, BatchSource, Micro, open_source
from etj_trainer.dynamic_sgd import DynamicSGD
from etj_trainer.models import build_model
from etj_trainer.progress import ProgressReporter, get_json
from etj_trainer.sample_log import SampleLog
from etj_trainer.sampler import ElasticSampler
from etj_trainer.schedule import LrSchedule, lr_factor, position
from etj_trainer.state_sync import (
    agree_on_checkpoint,
    broadcast_state,
    capture_rng,
    newest_step,
    restore_rng,
)

log = logging.getLogger(__name__)

EXIT_RESIZE = 75  # EX_TEMPFAIL: "stopped for a membership change, restart me"


@dataclass
class TrainResult:
    step: int
    epoch: int
    stopped_early: bool  # stopped by a SIGTERM somewhere in the world
    accuracy: float | None
    loss: float
    world_size: int
    params: dict[str, torch.Tensor] = field(default_factory=dict)


class StopFlag:
    """Set by SIGTERM; acted on at the next step boundary (never mid-step).

    ``code`` says why (see regroup.py): the pod is leaving, or our agent is restarting us because a node
    joins -- the agent writes that into ETJ_AGENT_STATE_FILE before it signals.
    """

    def __init__(self) -> None:
        self.requested = False
        self.code = regroup.StopCode.RUN

    def request(self, code: regroup.StopCode = regroup.StopCode.LEAVING) -> None:
        self.requested = True
        self.code = code

    def install(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            restarting = regroup.agent_is_restarting()
            self.request(regroup.StopCode.RESTARTING if restarting else regroup.StopCode.LEAVING)

        signal.signal(signal.SIGTERM, handler)


def micro_batch_stream(
    sampler: ElasticSampler,
    global_batch: int,
    micro: int,
    world: int,
    rank: int,
    epochs: int,
    max_steps: int,
    step: int,
) -> Iterator[Micro]:
    """The exact sequence of non-empty micro-batches this rank will train on (for prefetching loaders)."""
    sim = ElasticSampler(sampler.dataset_size, sampler.seed, sampler.shuffle)
    sim.load_state_dict(sampler.state_dict())
    while sim.epoch < epochs and (max_steps <= 0 or step < max_steps):
        gidx = sim.next_global_batch(global_batch)
        mine = ElasticSampler.rank_slice(gidx, world, rank)
        start = 0
        for n in micro_batch_sizes(len(mine), micro):
            yield Micro(sim.epoch, mine[start : start + n])
            start += n
        sim.commit(len(gidx))
        step += 1


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64}[name]


def evaluate(model: nn.Module, source: BatchSource, micro: int, device: torch.device) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        stream = (
            np.arange(i, min(i + micro, source.num_samples)) for i in range(0, source.num_samples, micro)
        )
        for x, y in source.batches(stream):
            correct += int((model(recipe.to_device(x, device)).argmax(1) == y.to(device)).sum())
    model.train()
    return correct / source.num_samples


@dataclass
class World:
    """This process's place in the current membership of the world."""

    dist_on: bool
    rank: int
    size: int
    local_rank: int
    local_size: int
    device: torch.device

    @classmethod
    def current(cls) -> World:
        dist_on = dist.is_available() and dist.is_initialized()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return cls(
            dist_on=dist_on,
            rank=dist.get_rank() if dist_on else 0,
            size=dist.get_world_size() if dist_on else 1,
            local_rank=local_rank,
            local_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            device=torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu"),
        )


@dataclass
class State:
    """What a step changes and a checkpoint holds, plus the fixed things that act on it."""

    model: nn.Module
    opt: DynamicSGD
    scaler: torch.amp.GradScaler | None
    sampler: ElasticSampler
    ckpts: CheckpointStore
    schedule: LrSchedule
    step: int = 0
    meta: dict[str, Any] = field(default_factory=lambda: {"resizes": [], "samples_seen": 0})

    def running(self, cfg: TrainConfig) -> bool:
        return self.sampler.epoch < cfg.epochs and (cfg.max_steps <= 0 or self.step < cfg.max_steps)


@dataclass
class Loop:
    """Bookkeeping across steps and memberships: reporting, the rate, the pending resize entry."""

    reporter: ProgressReporter
    inc: float
    restored_step: int
    prev_world: int | None
    last_reported_step: object = None
    resize_pending: bool = False
    plan: BatchPlan | None = None
    rate: float = 0.0
    loss: float = math.nan
    t_last: float = field(default_factory=time.monotonic)
    stopped_early: bool = False  # stopped by a SIGTERM somewhere in the world
    survivors_go_on: bool = False  # this rank leaves and the others re-form the world without it
    door: join.Door | None = None  # rank 0: admits joiners at a step boundary
    watch: recover.Heartbeat | None = None  # this rank's heartbeat (in-place crash recovery)
    last_failed_step: int | None = None  # the committed step at the last in-place crash recovery
    states_agree: bool = False  # every rank of the new membership holds the same state (in-process resize)


def train(cfg: TrainConfig, stop: StopFlag | None = None) -> TrainResult:
    """Run (or resume) training in the current process group; see the module docstring."""
    t_start = time.monotonic()
    w = World.current()
    stop = stop or StopFlag()
    dtype = _dtype(cfg.dtype)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank, before any restore
    augment = Augmenter(cfg.augment, cfg.seed, cfg.min_crop_scale)
    train_src = open_source(
        cfg.data,
        "train",
        cfg.image_size,
        dtype,
        cfg.dali_threads,
        augment=augment,
        max_batch=cfg.micro_batch_size,
    )
    t_data = time.monotonic()
    st = _build(cfg, w, train_src.num_samples, dtype)
    t_restore = time.monotonic()
    joiner = join.joining()  # warm now (model, data); the state comes from a peer once admitted
    src = None if joiner else _restore(st, w)
    if joiner:
        print(f"etj: joiner warm in {time.monotonic() - t_start:.2f} s; asking to be admitted", flush=True)
    elif w.rank == 0:
        # Where a (re)start spends its time: part of every restart-based resize pause.
        print(
            f"etj: rank 0 of {w.size} ready at step {st.step} in {time.monotonic() - t_start:.2f} s "
            f"(data {t_data - t_start:.2f} s, restore {time.monotonic() - t_restore:.2f} s"
            + (f" from rank {src})" if src is not None else ", nothing to restore)"),
            flush=True,
        )
    prev_world = int(st.meta["world_size"]) if "world_size" in st.meta else None
    loop = Loop(
        reporter=ProgressReporter(cfg.progress_url if w.rank == 0 and not joiner else ""),
        inc=_incarnation(w.dist_on),
        restored_step=st.step,
        prev_world=prev_world,
        resize_pending=prev_world is not None and prev_world != w.size,
    )
    if w.rank == 0 and prev_world is not None and cfg.progress_url:
        loop.last_reported_step = (get_json(cfg.progress_url) or {}).get("step")
    loop.watch = recover.watch(w.dist_on and regroup.enabled_from_env(), loop.inc, w.rank)
    loop.door = join.Door.open() if loop.watch is not None and w.rank == 0 else None
    if joiner:
        ticket = join.ask()
        if ticket is None:  # never admitted: the restart path (our agent joins the rendezvous)
            print("etj: not admitted in place; restarting through the rendezvous", flush=True)
            return TrainResult(st.step, st.sampler.epoch, True, None, math.nan, 0)
        w = _regroup(cfg, st, w, loop, ticket)
    while True:  # one pass per membership of the world; a graceful leave starts the next pass in-process
        regroup_to = _run_membership(cfg, st, w, loop, train_src, stop)
        if regroup_to is None:
            break
        w = _regroup(cfg, st, w, loop, regroup_to)
    return _finish(cfg, st, w, loop, train_src, dtype)


def _build(cfg: TrainConfig, w: World, dataset_size: int, dtype: torch.dtype) -> State:
    model = build_model(cfg.model, cfg.num_classes).to(device=w.device, dtype=dtype)
    model = model.to(memory_format=recipe.memory_format(w.device))
    if cfg.sync_batchnorm and w.dist_on:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    opt = DynamicSGD(
        recipe.param_groups(model, cfg.weight_decay, cfg.no_wd_norm_bias),
        lr=cfg.lr,
        ramp_steps=cfg.dsgd_ramp_steps,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
    )
    return State(
        model=model,
        opt=opt,
        scaler=recipe.grad_scaler(recipe.Precision(cfg.precision), w.device),
        sampler=ElasticSampler(dataset_size, cfg.seed),
        ckpts=CheckpointStore.for_config(cfg),
        schedule=cfg.schedule(),
    )


def _restore(st: State, w: World) -> int | None:
    """Load the world's newest checkpoint (every rank offers its own); returns the rank it came from."""
    state, src = agree_on_checkpoint(st.ckpts, w.rank, w.size)
    if state is None:
        return None
    _load(st, state)
    return src


def _sync_state(st: State, w: World, behind: bool = False) -> None:
    """After an in-place re-form: every rank takes the newest committed step, tensor by tensor from the
    lowest rank holding it (a no-op when all agree, as they do unless a peer died inside the commit)."""
    best, src, steps = newest_step(-1 if behind else st.step)
    if all(s == best for s in steps):
        return
    live = st.model.state_dict()
    state = broadcast_state(
        _state_dict(st, w) if w.rank == src else None,
        src,
        w.rank,
        lambda path, _shape, _dtype: live.get(path[1]) if path[:1] == ("model",) and len(path) == 2 else None,
        w.device,
    )
    if w.rank != src:
        _load(st, state)
    print(f"etj: state of step {best} from rank {src} (steps were {steps})", flush=True)


def _load(st: State, state: dict[str, Any]) -> None:
    st.model.load_state_dict(state["model"])
    st.opt.load_state_dict(state["optimizer"])
    if st.scaler is not None and "scaler" in state:
        st.scaler.load_state_dict(state["scaler"])
    st.sampler.load_state_dict(state["sampler"])
    restore_rng(state["rng"])
    st.step, st.meta = int(state["step"]), dict(state["meta"])


def _run_membership(
    cfg: TrainConfig, st: State, w: World, loop: Loop, train_src: BatchSource, stop: StopFlag
) -> regroup.Regroup | recover.Lost | None:
    """The steps of one membership; returns where to regroup to when survivors of a leave (or of a crashed
    peer) go on."""
    ddp: nn.Module = st.model
    if w.dist_on:
        ddp = nn.parallel.DistributedDataParallel(
            st.model,
            device_ids=[w.local_rank] if w.device.type == "cuda" else None,
            # after an in-process resize every rank holds the same state already (the joiners got it from
            # rank 0): DDP's own broadcast of the whole model would only repeat that transfer
            init_sync=not loop.states_agree,
        )
        loop.states_agree = False
    policy = ResizePolicy(cfg.resize_policy)
    plan = loop.plan = plan_step(
        policy, cfg.global_batch_size, cfg.micro_batch_size, w.size, cfg.min_ranks, cfg.procs_per_worker
    )
    if policy == ResizePolicy.DYNAMIC_SGD:
        st.opt.set_target(plan.lr_target)  # ramps from the multiplier in force (restored) to this world's
    samples_log = SampleLog(cfg.sample_log_dir, w.rank, loop.inc) if cfg.sample_log_dir else None
    loader = train_src.batches(
        micro_batch_stream(
            st.sampler,
            plan.global_batch,
            cfg.micro_batch_size,
            w.size,
            w.rank,
            cfg.epochs,
            cfg.max_steps,
            st.step,
        )
    )
    regroup_to: regroup.Regroup | None = None
    ddp.train()
    while st.running(cfg):
        try:
            codes = _train_step(
                cfg, st, w, ddp, plan, loader, train_src.sample_shape, stop, samples_log, loop
            )
        except Exception as e:  # a peer died mid-step: recover in place, or re-raise (torch elastic restarts)
            _close(loader)
            since = time.monotonic() - loop.t_last
            return recover.lost_or_raise(e, loop.watch is not None, loop.last_failed_step, st.step, since)
        regroup_to, stop_now = _after_step(cfg, st, w, loop, codes)
        if stop_now:
            loop.stopped_early = regroup_to is None
            break
    _close(loader)
    return regroup_to


def _train_step(
    cfg: TrainConfig,
    st: State,
    w: World,
    ddp: nn.Module,
    plan: BatchPlan,
    loader: Iterator[tuple[torch.Tensor, torch.Tensor]],
    sample_shape: tuple[int, ...],
    stop: StopFlag,
    samples_log: SampleLog | None,
    loop: Loop,
) -> list[int]:
    """One global step (this rank's share + the closing all-reduce); returns every rank's stop code."""
    n_data = st.sampler.dataset_size
    gidx = st.sampler.next_global_batch(plan.global_batch)
    mine = ElasticSampler.rank_slice(gidx, w.size, w.rank)
    before = position(st.sampler.epoch, st.sampler.state.consumed, n_data)
    # The schedule follows the samples seen, so a resize (any new world size) leaves it where it was.
    st.opt.set_schedule_factor(lr_factor(st.schedule, before, before + len(gidx) / n_data))
    lr = st.opt.lr
    loss_sum = _accumulate(
        cfg,
        st,
        w,
        ddp,
        loader,
        micro_batch_sizes(len(mine), cfg.micro_batch_size),
        scale=w.size / len(gidx),
        sample_shape=sample_shape,
    )
    if cfg.min_step_seconds > 0:
        time.sleep(max(0.0, cfg.min_step_seconds - (time.monotonic() - loop.t_last)))
    if samples_log:
        # Logged before the all-reduce that commits the step: a rank killed right after that collective
        # used to leave a committed step without its record (found by bench/chaos.py). A record of a step
        # that never commits is harmless: the redo logs it again under a newer incarnation, and the
        # checker keeps the newest.
        samples_log.write(st.sampler.epoch, st.step + 1, w.size, mine, lr=lr)
    # The commit: the loss and one stop-code slot per rank; after it every rank knows who stops. Before the
    # optimizer step, so a collective that fails (a peer died) leaves the last committed step in memory.
    stats = torch.zeros(1 + w.size, dtype=torch.float64)
    stats[0] = loss_sum
    stats[1 + w.rank] = float(stop.code or join.code(loop.door))
    if w.dist_on:
        dist.all_reduce(stats)
    if st.scaler is not None:
        st.scaler.step(st.opt)  # skips the step (and lowers the scale) on inf/nan gradients
        st.scaler.update()
    else:
        st.opt.step()
    st.sampler.commit(len(gidx))
    st.step += 1
    st.meta["samples_seen"] = int(st.meta["samples_seen"]) + len(gidx)
    st.meta["lr"] = lr
    loop.loss = float(stats[0]) / len(gidx)
    now = time.monotonic()
    inst = len(gidx) / max(now - loop.t_last, 1e-9)
    loop.rate = 0.8 * loop.rate + 0.2 * inst if loop.rate else inst
    loop.t_last = now
    return [int(c) for c in stats[1:].round().tolist()]


def _accumulate(
    cfg: TrainConfig,
    st: State,
    w: World,
    ddp: nn.Module,
    loader: Iterator[tuple[torch.Tensor, torch.Tensor]],
    sizes: list[int],
    scale: float,
    sample_shape: tuple[int, ...],
) -> torch.Tensor:
    """Forward/backward this rank's micro-batches (DDP syncs on the last); returns the summed loss."""
    st.opt.zero_grad(set_to_none=False)
    loss_sum = torch.zeros((), dtype=torch.float64)
    forward = recipe.autocast(recipe.Precision(cfg.precision), w.device)
    # A rank with no samples this step (tail of an epoch) still joins DDP's one all-reduce with an empty
    # batch, contributing zero gradient.
    chunks = sizes or [0]
    for i, n in enumerate(chunks):
        if n == 0:
            x = torch.empty((0, *sample_shape), dtype=_dtype(cfg.dtype))
            y = torch.empty((0,), dtype=torch.int64)
        else:
            x, y = next(loader)
            assert len(y) == n, "loader out of step with the sampler"
        last = i == len(chunks) - 1 or not w.dist_on
        sync = contextlib.nullcontext() if last else ddp.no_sync()  # type: ignore[operator]
        with sync:
            with forward():
                out = ddp(recipe.to_device(x, w.device))
            loss = F.cross_entropy(
                out.float() if out.dtype in (torch.float16, torch.bfloat16) else out,
                y.to(w.device),
                reduction="sum",
                label_smoothing=cfg.label_smoothing,
            )
            scaled = loss * scale
            (st.scaler.scale(scaled) if st.scaler is not None else scaled).backward()
        loss_sum += loss.detach().double().cpu()
    return loss_sum


def _after_step(
    cfg: TrainConfig, st: State, w: World, loop: Loop, codes: list[int]
) -> tuple[regroup.Regroup | None, bool]:
    """Resize log, checkpoint (local every step; shared on interval or just in time), progress."""
    if loop.resize_pending:
        _record_resize(st, w, loop)
    st.meta["last_step_time"] = time.time()
    stop_now = any(codes)
    regroup_to = None
    if stop_now:
        decision = regroup.decide(
            codes, cfg.min_ranks, w.dist_on and regroup.enabled_from_env(), procs_per_node=w.local_size
        )
        loop.survivors_go_on = decision.in_process
        if w.rank == 0:
            print(f"etj: after step {st.step}: {decision.describe()}", flush=True)
        if decision.in_process and w.rank in decision.survivors:
            regroup_to = decision
    shared_due = cfg.checkpoint_interval_steps > 0 and st.step % cfg.checkpoint_interval_steps == 0
    # Just-in-time shared copy when this rank stops; survivors of an in-process resize keep their state in
    # memory (and the every-step local copy), so they skip it and go on at once.
    jit = stop_now and regroup_to is None
    _save(st, w, shared=shared_due or jit)
    if shared_due or jit:
        st.meta["last_checkpoint"] = {"step": st.step, "path": str(cfg.checkpoint_dir), "time": time.time()}
    if w.rank == 0:
        loop.reporter.report(
            _progress(st, w, loop),
            force=stop_now or (len(st.meta["resizes"]) > 0 and st.step == loop.restored_step + 1),
        )
    return regroup_to, stop_now


def _record_resize(st: State, w: World, loop: Loop) -> None:
    """The first step at a new world size: the resize entry (pause = last step at old size -> now)."""
    loop.resize_pending = False
    last = loop.last_reported_step
    lost = max(0, last - loop.restored_step) if isinstance(last, int) else 0
    st.meta["resizes"] = [
        *st.meta["resizes"],
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "from": loop.prev_world,
            "to": w.size,
            "reason": str(
                TrainerResize.SCALE_UP if w.size > (loop.prev_world or 0) else TrainerResize.SCALE_DOWN
            ),
            "pauseSeconds": round(time.time() - float(st.meta.get("last_step_time", time.time())), 3),
            "stepsLost": lost,
        },
    ]
    print(f"etj: resize {loop.prev_world}->{w.size} done at step {st.step}", flush=True)


def _regroup(
    cfg: TrainConfig, st: State, w: World, loop: Loop, to: regroup.Regroup | recover.Lost | join.Ticket
) -> World:
    """The world changes in process: survivors of a graceful leave or of a crashed peer re-form among
    themselves, or old ranks admit joiners (a joiner comes here with its ticket); every rank then holds the
    newest committed step and goes on with the next step."""
    old_size, t0 = w.size, time.monotonic()
    if isinstance(to, join.Ticket):  # this rank joins: its first group, then the state from rank 0
        regroup.reform(to.key, to.rank, to.size)
        old_size = to.old_size
        _sync_state(st, World.current(), behind=True)
    elif isinstance(to, regroup.Regroup) and to.admit:  # old ranks keep their numbers; joiners come after
        # the job's maximum as the operator last set it: `kubectl scale` after this world started (bounds.py)
        door_store = loop.door.store if loop.door is not None else None
        max_ranks = bounds.max_workers(door_store, cfg.max_workers) * w.local_size
        membership = f"{loop.inc:.6f}"
        adm = join.admission(loop.door, membership, st.step, w.rank, w.size, max_ranks)
        if not adm.joiners:
            return w  # they withdrew, or no room: nothing changes
        regroup.reform(adm.key, w.rank, adm.new_size)
        _sync_state(st, World.current())
    elif isinstance(to, recover.Lost):
        recover.recover_in_place(to, f"{loop.inc:.6f}", w.rank, w.size, cfg.min_workers * w.local_size)
        loop.last_failed_step = st.step
        _sync_state(st, World.current())
    else:
        regroup.reform(f"{loop.inc:.6f}/{st.step}", to.new_rank(w.rank), len(to.survivors))
    new = World.current()
    print(
        f"etj: resizing {old_size}->{new.size} in process at step {st.step} "
        f"(world re-formed, state agreed in {time.monotonic() - t0:.2f} s)",
        flush=True,
    )
    loop.prev_world, loop.resize_pending, loop.restored_step, loop.last_reported_step = (
        old_size,
        True,
        st.step,
        None,
    )
    loop.inc = _incarnation(True)
    loop.survivors_go_on = False  # every rank of the old group that goes on is in the new one
    loop.states_agree = True
    if loop.watch is None:
        loop.watch = recover.watch(regroup.enabled_from_env(), loop.inc, new.rank)  # a joiner's first world
    else:
        loop.watch.enter(f"{loop.inc:.6f}", new.rank)
    if new.rank == 0 and loop.watch is not None and loop.door is None:
        loop.door = join.Door.open()
    if new.rank == 0 and not loop.reporter.url:
        loop.reporter = ProgressReporter(cfg.progress_url)
    return new


def _finish(
    cfg: TrainConfig, st: State, w: World, loop: Loop, train_src: BatchSource, dtype: torch.dtype
) -> TrainResult:
    """Final checkpoint, validation (rank 0) and the final report; then the world's last barrier."""
    accuracy = None
    if not loop.stopped_early:
        _save(st, w, shared=True)
        if cfg.val_data and w.rank == 0:
            val_src = open_source(
                cfg.val_data,
                "val",
                cfg.image_size,
                dtype,
                cfg.dali_threads,
                max_batch=cfg.micro_batch_size,
                val_resize=cfg.val_resize,
            )
            accuracy = evaluate(st.model, val_src, cfg.micro_batch_size, w.device)
            val_src.close()
        if w.rank == 0:
            payload = _progress(st, w, loop)
            payload.update(finished=True, accuracy=accuracy)
            # Synchronous and retried: the operator marks the job Succeeded from this report.
            loop.reporter.finish(payload)
            result = {"step": st.step, "loss": loop.loss, "accuracy": accuracy, "worldSize": w.size}
            print("ETJ_RESULT " + json.dumps(result), flush=True)
    loop.reporter.close()
    if loop.watch is not None:
        loop.watch.close()
    if loop.door is not None:
        loop.door.close(shut=not loop.survivors_go_on)  # survivors going on in place keep admitting
    train_src.close()
    if w.dist_on and not loop.survivors_go_on:
        dist.barrier()  # the survivors of an in-process resize have left this group already
    return TrainResult(
        step=st.step,
        epoch=st.sampler.epoch,
        stopped_early=loop.stopped_early,
        accuracy=accuracy,
        loss=loop.loss,
        world_size=w.size,
        params={k: v.detach().clone() for k, v in st.model.state_dict().items()},
    )


def _incarnation(dist_on: bool) -> float:
    """A world-wide id of this membership (rank 0's clock): tags sample-log lines and regroup keys."""
    inc = [time.time()]
    if dist_on:
        dist.broadcast_object_list(inc, src=0)
    return float(inc[0])


def _close(loader: Iterator[Any]) -> None:
    close = getattr(loader, "close", None)
    if close is not None:
        close()  # a generator: runs its finally (DALI pipelines are released)


def _save(st: State, w: World, shared: bool) -> None:
    # Every rank holds the same state after a step; rank 0 writes the shared copy, each node's local rank 0
    # its node-local copy (which is what survivors restore from).
    if w.local_rank != 0 and w.rank != 0:
        return
    st.ckpts.save(_state_dict(st, w), st.step, shared=shared and w.rank == 0, local=w.local_rank == 0)


def _state_dict(st: State, w: World) -> dict[str, Any]:
    """What a checkpoint holds (references to the live tensors: copy before training goes on)."""
    state = {
        "model": st.model.state_dict(),
        "optimizer": st.opt.state_dict(),
        "sampler": st.sampler.state_dict(),
        "step": st.step,
        "rng": capture_rng(),
        "meta": {**st.meta, "world_size": w.size},
    }
    if st.scaler is not None:
        state["scaler"] = st.scaler.state_dict()
    return state


def _progress(st: State, w: World, loop: Loop) -> dict[str, Any]:
    plan = loop.plan
    assert plan is not None
    doc = ProgressDoc(
        epoch=st.sampler.epoch,
        step=st.step,
        samples_seen=st.meta["samples_seen"],
        samples_per_second=round(loop.rate, 2),
        loss=loop.loss if math.isfinite(loop.loss) else None,
        world_size=w.size,
        per_rank_batch=plan.per_rank_batch,
        per_worker_batch=plan.per_worker_batch,
        accumulation_steps=plan.accumulation_steps,
        lr_multiplier=st.opt.lr_multiplier,
        lr=float(st.meta.get("lr", st.opt.lr)),  # the LR the last step trained with
        last_checkpoint=st.meta.get("last_checkpoint"),
        resizes=tuple(r for r in map(ResizeRecord.from_json, st.meta["resizes"]) if r is not None),
    )
    return doc.to_json()

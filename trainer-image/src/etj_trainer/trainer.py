"""The training loop (one process per rank, started by torch elastic or directly).

Per step: the elastic sampler gives the step's global indices; this rank takes its share, runs it in
micro-batches (gradient accumulation under ``no_sync``), scales its summed loss so DDP's average is the
global mean gradient (see batching.py), steps the optimizer, and then one small all-reduce carries the loss
and a "stop" flag. The flag is how a SIGTERM on any rank becomes a clean stop of *every* rank at the same
step boundary: the state is checkpointed (shared copy: just in time; local copy: every step), the rank
that got the signal exits 0 and the others exit ``EXIT_RESIZE`` so their agents re-rendezvous at once.
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

from etj_contract.progress import ProgressDoc, ResizeRecord
from etj_trainer import regroup
from etj_trainer.batching import ResizePolicy, micro_batch_sizes, plan_step
from etj_trainer.checkpoint import CheckpointStore
from etj_trainer.config import TrainConfig
from etj_trainer.data import BatchSource, open_source
from etj_trainer.dynamic_sgd import DynamicSGD
from etj_trainer.models import build_model
from etj_trainer.progress import ProgressReporter, get_json
from etj_trainer.sample_log import SampleLog
from etj_trainer.sampler import ElasticSampler
from etj_trainer.state_sync import agree_on_checkpoint, capture_rng, restore_rng

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
) -> Iterator[np.ndarray]:
    """The exact sequence of non-empty micro-batches this rank will train on (for prefetching loaders)."""
    sim = ElasticSampler(sampler.dataset_size, sampler.seed, sampler.shuffle)
    sim.load_state_dict(sampler.state_dict())
    while sim.epoch < epochs and (max_steps <= 0 or step < max_steps):
        gidx = sim.next_global_batch(global_batch)
        mine = ElasticSampler.rank_slice(gidx, world, rank)
        start = 0
        for n in micro_batch_sizes(len(mine), micro):
            yield mine[start : start + n]
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
            correct += int((model(x.to(device)).argmax(1) == y.to(device)).sum())
    model.train()
    return correct / source.num_samples


def train(cfg: TrainConfig, stop: StopFlag | None = None) -> TrainResult:
    """Run (or resume) training in the current process group; see the module docstring."""
    t_start = time.monotonic()
    dist_on = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if dist_on else 0
    world = dist.get_world_size() if dist_on else 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    stop = stop or StopFlag()
    dtype = _dtype(cfg.dtype)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank, before any restore

    train_src = open_source(cfg.data, "train", cfg.image_size, dtype, cfg.dali_threads)
    t_data = time.monotonic()
    model = build_model(cfg.model, cfg.num_classes).to(device=device, dtype=dtype)
    if cfg.sync_batchnorm and dist_on:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    opt = DynamicSGD(
        model.parameters(),
        lr=cfg.lr,
        ramp_steps=cfg.dsgd_ramp_steps,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
    )
    sampler = ElasticSampler(train_src.num_samples, cfg.seed)
    ckpts = CheckpointStore(cfg.checkpoint_dir, cfg.local_checkpoint_dir)

    t_restore = time.monotonic()
    state, src = agree_on_checkpoint(ckpts, rank, world)
    step = 0
    meta: dict[str, Any] = {"resizes": [], "samples_seen": 0}
    prev_world: int | None = None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sampler.load_state_dict(state["sampler"])
        restore_rng(state["rng"])
        step, meta = int(state["step"]), dict(state["meta"])
        prev_world = int(meta["world_size"])
    restored_step = step
    if rank == 0:
        # Where a (re)start spends its time: part of every restart-based resize pause.
        print(
            f"etj: rank 0 of {world} ready at step {step} in {time.monotonic() - t_start:.2f} s "
            f"(data {t_data - t_start:.2f} s, restore {time.monotonic() - t_restore:.2f} s"
            + (f" from rank {src})" if state is not None else ", nothing to restore)"),
            flush=True,
        )
    inc = _incarnation(dist_on)
    last_reported_step = None
    if rank == 0 and prev_world is not None and cfg.progress_url:
        last_reported_step = (get_json(cfg.progress_url) or {}).get("step")
    resize_pending = prev_world is not None and prev_world != world
    stopped_early, loss_val = False, float("nan")
    can_regroup = dist_on and regroup.enabled_from_env()
    survivors_go_on = False  # set when this rank leaves and the others re-form the world without it
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    reporter = ProgressReporter(cfg.progress_url if rank == 0 else "")
    policy = ResizePolicy(cfg.resize_policy)
    t_last = time.monotonic()
    rate = 0.0
    while True:  # one pass per membership of the world; a graceful leave starts the next pass in-process
        ddp: nn.Module = model
        if dist_on:
            ddp = nn.parallel.DistributedDataParallel(
                model, device_ids=[local_rank] if device.type == "cuda" else None
            )
        plan = plan_step(policy, cfg.global_batch_size, cfg.micro_batch_size, world, cfg.min_workers)
        if policy == ResizePolicy.DYNAMIC_SGD:
            opt.set_target(plan.lr_target)  # ramps from the multiplier in force (restored) to this world's
        samples_log = SampleLog(cfg.sample_log_dir, rank, inc) if cfg.sample_log_dir else None
        loader = train_src.batches(
            micro_batch_stream(
                sampler, plan.global_batch, cfg.micro_batch_size, world, rank, cfg.epochs, cfg.max_steps, step
            )
        )
        regroup_to: regroup.Regroup | None = None
        ddp.train()
        while sampler.epoch < cfg.epochs and (cfg.max_steps <= 0 or step < cfg.max_steps):
            gidx = sampler.next_global_batch(plan.global_batch)
            mine = ElasticSampler.rank_slice(gidx, world, rank)
            sizes = micro_batch_sizes(len(mine), cfg.micro_batch_size)
            scale = world / len(gidx)
            opt.zero_grad(set_to_none=False)
            loss_sum = torch.zeros((), dtype=torch.float64)
            # A rank with no samples this step (tail of an epoch) still joins DDP's one all-reduce with an
            # empty batch, contributing zero gradient.
            chunks = sizes or [0]
            for i, n in enumerate(chunks):
                if n == 0:
                    x = torch.empty((0, *train_src.sample_shape), dtype=dtype)
                    y = torch.empty((0,), dtype=torch.int64)
                else:
                    x, y = next(loader)
                    assert len(y) == n, "loader out of step with the sampler"
                sync = contextlib.nullcontext() if (i == len(chunks) - 1 or not dist_on) else ddp.no_sync()  # type: ignore[operator]
                with sync:
                    loss = F.cross_entropy(ddp(x.to(device)), y.to(device), reduction="sum")
                    (loss * scale).backward()
                loss_sum += loss.detach().double().cpu()
            opt.step()
            if cfg.min_step_seconds > 0:
                time.sleep(max(0.0, cfg.min_step_seconds - (time.monotonic() - t_last)))
            if samples_log:
                # Logged before the all-reduce that commits the step: a rank killed right after that
                # collective used to leave a committed step without its record (found by bench/chaos.py). A
                # record of a step that never commits is harmless: the redo logs it again under a newer
                # incarnation, and the checker keeps the newest.
                samples_log.write(sampler.epoch, step + 1, world, mine)
            # The loss and one stop-code slot per rank: after this all-reduce every rank knows who stops.
            stats = torch.zeros(1 + world, dtype=torch.float64)
            stats[0] = loss_sum
            stats[1 + rank] = float(stop.code)
            if dist_on:
                dist.all_reduce(stats)
            sampler.commit(len(gidx))
            step += 1
            meta["samples_seen"] = int(meta["samples_seen"]) + len(gidx)
            loss_val = float(stats[0]) / len(gidx)
            now = time.monotonic()
            rate = (
                0.8 * rate + 0.2 * (len(gidx) / max(now - t_last, 1e-9))
                if rate
                else len(gidx) / max(now - t_last, 1e-9)
            )
            t_last = now
            if resize_pending:
                resize_pending = False
                lost = (
                    max(0, int(last_reported_step) - restored_step)
                    if isinstance(last_reported_step, int)
                    else 0
                )
                meta["resizes"] = [
                    *meta["resizes"],
                    {
                        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "from": prev_world,
                        "to": world,
                        "reason": "scale-up" if world > (prev_world or 0) else "scale-down",
                        "pauseSeconds": round(
                            time.time() - float(meta.get("last_step_time", time.time())), 3
                        ),
                        "stepsLost": lost,
                    },
                ]
                print(f"etj: resize {prev_world}->{world} done at step {step}", flush=True)
            meta["last_step_time"] = time.time()
            codes = [int(c) for c in stats[1:].round().tolist()]
            stop_now = any(codes)
            if stop_now:
                decision = regroup.decide(codes, cfg.min_workers * local_world, can_regroup)
                survivors_go_on = decision.in_process
                if decision.in_process and rank in decision.survivors:
                    regroup_to = decision
            shared_due = cfg.checkpoint_interval_steps > 0 and step % cfg.checkpoint_interval_steps == 0
            # Just-in-time shared copy when this rank stops; survivors of an in-process resize keep their
            # state in memory (and the every-step local copy), so they skip it and go on at once.
            jit = stop_now and regroup_to is None
            _save(ckpts, model, opt, sampler, step, meta, world, rank, local_rank, shared=shared_due or jit)
            if shared_due or jit:
                meta["last_checkpoint"] = {"step": step, "path": str(cfg.checkpoint_dir), "time": time.time()}
            if rank == 0:
                reporter.report(
                    _progress(sampler, step, meta, rate, loss_val, world, plan, opt),
                    force=stop_now or (len(meta["resizes"]) > 0 and step == restored_step + 1),
                )
            if stop_now:
                stopped_early = regroup_to is None
                break
        _close(loader)
        if regroup_to is None:
            break
        # Survivors of a graceful leave: a new process group among themselves, same state, next step.
        del ddp  # its reducer hooks go with it; the next pass wraps the model again
        regroup.reform(f"{inc:.6f}/{step}", regroup_to.new_rank(rank), len(regroup_to.survivors))
        prev_world, world, rank = world, dist.get_world_size(), dist.get_rank()
        print(f"etj: resizing {prev_world}->{world} in process at step {step}", flush=True)
        resize_pending, restored_step, last_reported_step = True, step, None
        inc = _incarnation(True)
        if rank == 0 and not reporter.url:
            reporter = ProgressReporter(cfg.progress_url)

    done = not stopped_early
    accuracy = None
    if done:
        _save(ckpts, model, opt, sampler, step, meta, world, rank, local_rank, shared=True)
        if cfg.val_data and rank == 0:
            val_src = open_source(cfg.val_data, "val", cfg.image_size, dtype, cfg.dali_threads)
            accuracy = evaluate(model, val_src, cfg.micro_batch_size, device)
            val_src.close()
        if rank == 0:
            payload = _progress(sampler, step, meta, rate, loss_val, world, plan, opt)
            payload.update(finished=True, accuracy=accuracy)
            # Synchronous and retried: the operator marks the job Succeeded from this report.
            reporter.finish(payload)
            print(
                "ETJ_RESULT "
                + json.dumps({"step": step, "loss": loss_val, "accuracy": accuracy, "worldSize": world}),
                flush=True,
            )
    reporter.close()
    train_src.close()
    if dist_on and not survivors_go_on:
        dist.barrier()  # the survivors of an in-process resize have left this group already
    return TrainResult(
        step=step,
        epoch=sampler.epoch,
        stopped_early=stopped_early,
        accuracy=accuracy,
        loss=loss_val,
        world_size=world,
        params={k: v.detach().clone() for k, v in model.state_dict().items()},
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


def _save(
    ckpts: CheckpointStore,
    model: nn.Module,
    opt: DynamicSGD,
    sampler: ElasticSampler,
    step: int,
    meta: dict[str, Any],
    world: int,
    rank: int,
    local_rank: int,
    shared: bool,
) -> None:
    # Every rank holds the same state after a step; rank 0 writes the shared copy, each node's local rank 0
    # its node-local copy (which is what survivors restore from).
    if local_rank != 0 and rank != 0:
        return
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "sampler": sampler.state_dict(),
        "step": step,
        "rng": capture_rng(),
        "meta": {**meta, "world_size": world},
    }
    ckpts.save(state, step, shared=shared and rank == 0, local=local_rank == 0)


def _progress(
    sampler: ElasticSampler,
    step: int,
    meta: dict[str, Any],
    rate: float,
    loss: float,
    world: int,
    plan: Any,
    opt: DynamicSGD,
) -> dict[str, Any]:
    doc = ProgressDoc(
        epoch=sampler.epoch,
        step=step,
        samples_seen=meta["samples_seen"],
        samples_per_second=round(rate, 2),
        loss=loss if math.isfinite(loss) else None,
        world_size=world,
        per_worker_batch=plan.per_worker_batch,
        accumulation_steps=plan.accumulation_steps,
        lr_multiplier=opt.lr_multiplier,
        last_checkpoint=meta.get("last_checkpoint"),
        resizes=tuple(r for r in map(ResizeRecord.from_json, meta["resizes"]) if r is not None),
    )
    return doc.to_json()

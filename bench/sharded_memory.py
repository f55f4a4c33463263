"""Sharded (FSDP) against DDP on one model, one run each (issue 41 item 5). Prints JSON, writes it to --out.

1. ``memory``: per-rank bytes of parameters + gradients + optimizer state (AdamW: two moments per
   parameter, as examples/sharded-lm trains) after one training step, FSDP against DDP, at 2, 3 and 4
   ranks (gloo, CPU, float32). The model: examples/sharded-lm's ByteGPT at ``--dim 256 --layers 4``
   (about 3.3 M parameters), each Block a sharded unit (the example's policy). Local tensor bytes: a
   DTensor counts its ``to_local()`` shard. DDP's gradient buckets (a second copy of the gradients while
   they are reduced) are not counted: the DDP column is a floor.
2. ``pause``: bench/resize_pause.py's etj arm (3 nodes; a leave 3->2, a kill 2->1, a join 1->2) on the
   same few-million-parameter model for both strategies (``wide_mlp`` below: 2.7 M parameters on the
   digits, which the trainer's classifier path can train): DDP resizes in place; FSDP reshards a leave
   and a join in place (loop/_reshard.py: the shards gathered before the change, resharded in memory)
   and restarts the world on a kill (from the newest DCP checkpoint, resharded; checkpoints every 20
   steps).
3. ``checkpoint``: the FSDP state (model + AdamW) written with DCP at 4 ranks, then loaded resharded at 2
   and at 3 (etj's checkpoint/sharded.py save and load, as a restart does); seconds, the slowest rank.

``--gpu-check``: bench/gpu_check.sh's sharded check: an FSDP step and a DCP save/load round trip that must
give back the same state, on CUDA with NCCL (a world of min(2, GPUs) ranks: one GPU cannot host two NCCL
ranks), or with ``--smoke`` on CPU with gloo at 2 ranks and toy sizes.

    .venv/bin/python bench/sharded_memory.py --out bench/results/sharded_memory.json
    .venv/bin/python bench/sharded_memory.py --gpu-check [--smoke] --out OUT.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "sharded-lm" / "train.py"
SIZES = (4, 2, 3)  # 4 first: its world writes the checkpoint the others load
GPT = {"seq_len": 128, "dim": 256, "layers": 4, "heads": 4}
SMOKE_GPT = {"seq_len": 16, "dim": 32, "layers": 2, "heads": 2}
BATCH = 8  # sequences per rank in the measured step


def wide_mlp(num_classes: int = 10, in_features: int = 3 * 8 * 8, width: int = 1536) -> nn.Module:
    """The pause arms' model (``ETJ_MODEL=bench.sharded_memory:wide_mlp``): 2.7 M parameters on digits."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_features, width),
        nn.Tanh(),
        nn.Linear(width, width),
        nn.Tanh(),
        nn.Linear(width, num_classes),
    )


# ---- the pure parts ----------------------------------------------------------------------------------------


def local_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes this rank holds: a DTensor's local shard, a plain tensor whole; None (no gradient) is 0."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Parameters, gradients and optimizer state (every tensor in its per-parameter state) of this rank."""
    params = list(model.parameters())
    return {
        "params": local_bytes(params),
        "grads": local_bytes(p.grad for p in params),
        "optimizer": local_bytes(_moments(opt)),
    }


def _moments(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def memory_table(per_size: dict[int, dict[str, dict[str, int]]]) -> list[dict[str, Any]]:
    """One row per world size: each strategy's bytes (rank 0's, the largest shard) and FSDP / DDP."""
    rows = []
    for size in sorted(per_size):
        ddp, fsdp = per_size[size]["DDP"], per_size[size]["FSDP"]
        ddp_total, fsdp_total = sum(ddp.values()), sum(fsdp.values())
        rows.append(
            {
                "ranks": size,
                "ddp_mib": round(ddp_total / 2**20, 2),
                "fsdp_mib": round(fsdp_total / 2**20, 2),
                "fsdp_over_ddp": round(fsdp_total / ddp_total, 3),
                "ideal": round(1 / size, 3),
                "ddp": ddp,
                "fsdp": fsdp,
            }
        )
    return rows


def pause_ratios(ddp: dict[str, Any], fsdp: dict[str, Any]) -> dict[str, float | str]:
    """FSDP's pause over DDP's for each event both measured (the baseline from the same run)."""
    out: dict[str, float | str] = {}
    for k, base in ddp.items():
        if k.endswith("_path"):  # how the state crossed the resize: a name, not a time
            continue
        v = fsdp.get(k)
        if isinstance(base, (int, float)) and isinstance(v, (int, float)) and base > 0:
            out[k] = round(v / base, 1)
        else:
            out[k] = f"not comparable ({base!r} vs {v!r})"
    return out


# ---- worlds of processes -----------------------------------------------------------------------------------


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sharded_lm_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gpt(shape: dict[str, int], device: torch.device) -> tuple[nn.Module, type[nn.Module]]:
    ex = _example()
    torch.manual_seed(0)
    return ex.ByteGPT(**shape).to(device), ex.Block


def _step(model: nn.Module, seq_len: int, device: torch.device) -> torch.optim.Optimizer:
    """One AdamW step on random bytes (the same on every rank: the numbers do not depend on the data)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 257, (BATCH, seq_len + 1), generator=g).to(device)
    logits = model(x[:, :-1])
    F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten()).backward()
    opt.step()
    return opt


def _sharded(shape: dict[str, int]) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    from etj_trainer.core.world import World

    # FSDP2 as Job.setup_model(net, shard=(Block,)) applies it (loop/_sharding.py): each block, then the
    # root, over every rank. Called directly: the bench measures torch's sharding, not a Job's loop.
    world = World.current()
    net, block = _gpt(shape, world.device)
    for sub in reversed(list(net.modules())):
        if isinstance(sub, block):
            fully_shard(sub)
    fully_shard(net)  # in place: ``net`` is the sharded module
    return net, _step(net, shape["seq_len"], world.device)


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return round(float(t), 3)


def _timed_save(model: nn.Module, opt: torch.optim.Optimizer, ckpt: Path) -> float:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from etj_trainer.checkpoint import sharded

    model_sd, optim_sd = get_state_dict(model, opt)
    dist.barrier()
    t0 = time.perf_counter()
    sharded.save(ckpt, 1, {"model": model_sd, "optimizer": optim_sd}, {"meta": {}}, dist.get_rank(), keep=1)
    return _slowest(time.perf_counter() - t0)


def _timed_load(model: nn.Module, opt: torch.optim.Optimizer, ckpt: Path) -> float:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from etj_trainer.checkpoint import sharded

    model_sd, optim_sd = get_state_dict(model, opt)
    dist.barrier()
    t0 = time.perf_counter()
    sharded.load(ckpt / sharded.directory_name(1), {"model": model_sd, "optimizer": optim_sd})
    set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)
    return _slowest(time.perf_counter() - t0)


def _full(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_sd, optim_sd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    return {"model": model_sd, "optimizer": optim_sd["state"]}


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return bool(torch.equal(a.cpu(), b.cpu()))
    return bool(a == b)


def _rank_main(rank: int, size: int, init: str, out: str, job: str, shape: dict[str, int]) -> None:
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size))
    cuda = job == "gpu-check" and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if cuda else "gloo", init_method=f"file://{init}", rank=rank, world_size=size
    )
    result: dict[str, Any] = {}
    try:
        ckpt = Path(out) / "ckpt"
        if job == "memory":
            device = torch.device("cpu")
            net, _ = _gpt(shape, device)
            ddp = nn.parallel.DistributedDataParallel(net)
            result["DDP"] = state_bytes(ddp.module, _step(ddp, shape["seq_len"], device))
            result["params"] = sum(p.numel() for p in ddp.module.parameters())
            del ddp, net
            model, opt = _sharded(shape)
            result["FSDP"] = state_bytes(model, opt)
            if size == 4:
                result["write_s"] = _timed_save(model, opt, ckpt)
            elif (ckpt / "dcp-000000001").is_dir():
                result["load_s"] = _timed_load(model, opt, ckpt)
        else:  # gpu-check: a step, then a save and a load into a fresh model give back the same state
            model, opt = _sharded(shape)
            before = _full(model, opt)
            result["write_s"] = _timed_save(model, opt, ckpt)
            fresh, fresh_opt = _sharded(shape)
            with torch.no_grad():  # unlike the saved state in every tensor, so that the load must restore it
                for t in [*fresh.parameters(), *_moments(fresh_opt)]:
                    t.mul_(0)
            result["load_s"] = _timed_load(fresh, fresh_opt, ckpt)
            result["equal"] = _equal(before, _full(fresh, fresh_opt))
            result["device"] = torch.cuda.get_device_name(rank) if cuda else "cpu"
            result["backend"] = dist.get_backend()
        if rank == 0:
            Path(out, f"{job}-{size}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown under gloo's threads (as tests/trainer/test_fsdp.py's ranks)


def run_world(size: int, job: str, out: Path, shape: dict[str, int]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        procs = [
            ctx.Process(target=_rank_main, args=(r, size, init, str(out), job, shape)) for r in range(size)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=900)
    codes = [p.exitcode for p in procs]
    if codes != [0] * size:
        raise RuntimeError(f"{job} at {size} ranks: exit codes {codes}")
    result: dict[str, Any] = json.loads((out / f"{job}-{size}.json").read_text())
    return result


# ---- the three measurements --------------------------------------------------------------------------------


def measure_memory_and_checkpoint(work: Path) -> dict[str, Any]:
    worlds = {size: run_world(size, "memory", work, GPT) for size in SIZES}
    for size, r in worlds.items():
        print(f"memory at {size} ranks: {r}", file=sys.stderr, flush=True)
    return {
        "model": f"examples/sharded-lm ByteGPT {GPT}, {worlds[2]['params']:,} parameters, float32",
        "optimizer": "AdamW (exp_avg and exp_avg_sq per parameter, a step counter)",
        "memory": memory_table({s: {k: r[k] for k in ("DDP", "FSDP")} for s, r in worlds.items()}),
        "checkpoint": {
            "written_at": 4,
            "write_s": worlds[4]["write_s"],
            "load_s": {str(s): worlds[s]["load_s"] for s in (2, 3)},
            "bytes": sum(f.stat().st_size for f in (work / "ckpt").rglob("*") if f.is_file()),
        },
    }


def measure_pauses(work: Path, event_timeout: float) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from bench.resize_pause import measure

    common = {"ETJ_MODEL": "bench.sharded_memory:wide_mlp", "ETJ_CHECKPOINT_INTERVAL_STEPS": "20"}
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    runs = {}
    for name, parallelism in (("DDP", "DDP"), ("FSDP", "FSDP")):
        extra = {**common, "ETJ_PARALLELISM": parallelism, "PYTHONPATH": python_path}
        runs[name] = measure("etj", work / parallelism, event_timeout, extra_env=extra)
        print(f"pause, {name}: {runs[name]}", file=sys.stderr, flush=True)
    return {
        "model": f"wide_mlp: {sum(p.numel() for p in wide_mlp().parameters()):,} parameters on the digits, "
        "the trainer's classifier path (its SGD with momentum), global batch 32, float32",
        "runs": runs,
        "fsdp_over_ddp": pause_ratios(runs["DDP"], runs["FSDP"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--skip-pause", action="store_true")
    ap.add_argument("--event-timeout", type=float, default=150)
    ap.add_argument("--gpu-check", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="with --gpu-check: CPU, gloo, toy sizes")
    ns = ap.parse_args()
    out: dict[str, Any] = {
        "benchmark": "sharded_memory",
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if ns.gpu_check:
            gpus = torch.cuda.device_count() if not ns.smoke else 0
            if not ns.smoke and gpus == 0:
                sys.exit("no CUDA device: run with --smoke")
            size = min(2, gpus) if gpus else 2
            out["gpu_check"] = {
                "ranks": size,
                **run_world(size, "gpu-check", work, SMOKE_GPT if ns.smoke else GPT),
            }
        else:
            out.update(measure_memory_and_checkpoint(work / "worlds"))
            if not ns.skip_pause:
                out["pause"] = measure_pauses(work / "pause", ns.event_timeout)
    text = json.dumps(out, indent=2)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

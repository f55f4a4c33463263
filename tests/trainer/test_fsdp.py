"""A sharded job (issue 41 item 1): FSDP2 and HSDP through the loop API, DCP checkpoints that load at any
world size, the restricted metadata unpickler, and parallelism from the spec to the trainer.

Worlds of gloo processes on CPU in float64 (a few runs each, shared through module fixtures: a process
start costs seconds on 2 busy cores): every run trains the same tiny MLP (its Linear layers sharded units
of their own) on the same 49 samples in global steps of 16 over 2 epochs, so each epoch ends in a step of
one sample and some ranks' shares are empty. Equal means within the DDP proofs' tolerance, 1e-9 relative.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from etj_contract.progress import StatePath
from etj_operator.api.models import TrainingSpec
from etj_operator.decide.objects.pod_env import recipe_env
from etj_testbed import worldsim
from etj_trainer import cli, elastic
from etj_trainer.agent.local_launcher import parse_schedule, run_local
from etj_trainer.checkpoint import sharded
from etj_trainer.checkpoint.store import CheckpointNotDurable, encode, load_latest
from etj_trainer.classifier.models import tiny_mlp
from etj_trainer.config import Parallelism, TrainConfig
from etj_trainer.core.sample_log import consumed_per_epoch
from etj_trainer.core.stopping import StopCode, training_done

N, GLOBAL, EPOCHS = 49, 16, 2
STEPS = 2 * 4  # 49 samples in steps of 16: 3 full steps and one of 1, per epoch
LEAVE_AT = 3  # the step whose stop code says "leaving" in the restart-path run
CLIP = 0.1  # every run clips its gradients to this norm (step.clip_gradients works on DTensors too)


class Points(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(N, 4, generator=g, dtype=torch.float64)
        self.y = torch.randint(0, 3, (N,), generator=g)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _cfg(ckpt: Path | None, parallelism: str = "DDP", micro: int = 3, **kw: Any) -> TrainConfig:
    kw = {"checkpoint_interval_steps": 0, **kw}
    return TrainConfig(
        global_batch_size=GLOBAL, micro_batch_size=micro, epochs=EPOCHS, seed=1, lr=0.1, momentum=0.9,
        weight_decay=1e-3, dtype="float64", checkpoint_dir=ckpt, local_checkpoint_dir=None,
        parallelism=Parallelism(parallelism), **kw,
    )  # fmt: skip


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    ).double()


class _Leave(elastic.StopFlag):
    """This rank's stop code says "leaving" from step ``at`` on (a spot notice, as worldsim's)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self._at, self._reads = at, 0

    @property
    def code(self) -> StopCode:
        self._reads += 1
        return StopCode.LEAVING if self._reads >= self._at else StopCode.RUN

    @code.setter
    def code(self, value: StopCode) -> None:
        pass


def _train(
    cfg: TrainConfig,
    out: Path,
    name: str,
    stop: elastic.StopFlag | None = None,
    mp: MixedPrecisionPolicy | None = None,
) -> elastic.Job:
    """The loop: ids through the sampler, a summed loss; then every rank dumps the full state (rank 0
    writes it) and, for a sharded run, what accumulation did to the sharded gradients."""
    data = Points()
    job = elastic.Job(N, cfg, stop=stop or elastic.StopFlag())
    model = job.setup_model(_net(), shard=(torch.nn.Linear,), mixed_precision=mp)
    opt = job.setup_dynamic_sgd(model.parameters())
    synced: list[bool] = []  # per micro-batch: did its backward leave reduced (sharded) gradients
    norms: list[float] = []  # each step's gradient norm before clipping
    out_dtype: torch.dtype | None = None  # the forward's (a mixed-precision policy's param_dtype)
    first: list[int] = []  # the first step this run trained (a restored run starts after its checkpoint)
    for step in job.steps():
        first = first or [step.number]
        for micro in step.micro_batches():
            ids = torch.from_numpy(micro.ids)
            out_dtype = (logits := model(data.x[ids])).dtype
            step.backward(F.cross_entropy(logits, data.y[ids], reduction="sum"))
            synced.append(all(p.grad is not None for p in model.parameters()))
        norms.append(float(step.clip_gradients(CLIP)))  # active: the norms are above it (a sharded norm
        step.optimizer_step()  # is a reduction over the ranks' shards)
    _dump(job, model.module, opt, out / f"{name}.pt", synced, first, norms, out_dtype)
    job.finish()
    return job


def _dump(
    job: elastic.Job,
    module: torch.nn.Module,
    opt: torch.optim.Optimizer,
    path: Path,
    synced: list[bool],
    first: list[int],
    norms: list[float],
    out_dtype: torch.dtype | None = None,
) -> None:
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    params = get_model_state_dict(module, options=full)  # a collective: every rank
    optim = get_optimizer_state_dict(module, opt, options=full)
    shards = [p.to_local().numel() for p in module.parameters() if isinstance(p, DTensor)]
    meshes = {tuple(p.device_mesh.shape) for p in module.parameters() if isinstance(p, DTensor)}
    if job.world.rank == 0:
        torch.save(
            {
                "params": params,
                "optim": optim,
                "iteration": getattr(opt, "iteration", None),
                "step": job.steps_done,
                "stopped_early": job.stopped_early,
                "synced": synced,
                "first": first[0] if first else None,
                "norms": norms,
                "out_dtype": out_dtype,
                "shards": shards,
                "meshes": meshes,
                "world": job.world.size,
            },
            path,
        )


# ---- worlds of processes ----------------------------------------------------------------------------------


def _rank_main(rank: int, size: int, init: str, out: str, scenario: str) -> None:
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size))
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=size)
    try:
        SCENARIOS[scenario](rank, size, Path(out))
        Path(out, f"{scenario}.rank{rank}.done").touch()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as worldsim's ranks: no interpreter teardown (torch 2.14 keeps gloo threads past it)


def run_world(size: int, scenario: str, out: Path) -> None:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            ctx.Process(target=_rank_main, args=(r, size, os.path.join(tmp, "init"), str(out), scenario))
            for r in range(size)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=600)
    codes = [p.exitcode for p in procs]
    done = [Path(out, f"{scenario}.rank{r}.done").exists() for r in range(size)]
    assert codes == [0] * size and all(done), f"{scenario}: exit codes {codes}, done {done}"


def _two_ranks(rank: int, size: int, out: Path) -> None:
    _train(_cfg(None, "DDP"), out, "ddp2")
    _train(_cfg(out / "fsdp2", "FSDP"), out, "fsdp2")  # micro-batches of 3: accumulation
    _train(_cfg(None, "FSDP", micro=GLOBAL), out, "fsdp2_whole")  # one micro-batch per share
    # mixed precision: float32 parameters in the forward and backward, float64 reduction and weights
    mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float64)
    _train(_cfg(None, "FSDP"), out, "fsdp2_mp", mp=mp)
    # the restart path of a sharded resize: rank 1 leaves at LEAVE_AT and 1 survivor is below the minimum
    # of 2, so the world must stop and checkpoint; each rank a node of its own, so that rank 0 survives (a
    # node's ranks leave together). (No agent or store here: the in-place paths, which would meet on the
    # store, are tested with real agents below.)
    os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    leave = _Leave(LEAVE_AT) if rank == 1 else None
    _train(_cfg(out / "left", "FSDP", min_workers=2), out, "left", stop=leave)


def _three_ranks(rank: int, size: int, out: Path) -> None:
    # the 2-rank run's final checkpoint, loaded (no step left to train) at 3 ranks
    _train(_cfg(out / "fsdp2_at3", "FSDP"), out, "load_at3")
    # the world that restarts after the leave: 3 ranks resume from the 2-rank checkpoint of LEAVE_AT
    _train(_cfg(out / "left_at3", "FSDP"), out, "resumed_at3")


def _one_rank(rank: int, size: int, out: Path) -> None:
    _train(_cfg(out / "fsdp2_at1", "FSDP"), out, "load_at1")


def _four_ranks(rank: int, size: int, out: Path) -> None:
    _train(_cfg(None, "DDP"), out, "ddp4")
    _train(_cfg(None, "HSDP", shard_group_size=2), out, "hsdp4")
    # HSDP keeps the restart path: in-place resizes on (an agent's state file and a store named, which
    # the in-place paths would meet on: nothing listens there), rank 3 leaves, and every rank stops
    # with a checkpoint; each rank a node of its own (a node's ranks leave together)
    os.environ.update(ETJ_AGENT_STATE_FILE=str(out / "agent4.state"), ETJ_RDZV_ENDPOINT="127.0.0.1:1")
    os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    leave = _Leave(LEAVE_AT) if rank == 3 else None
    _train(_cfg(out / "hsdp_left", "HSDP", shard_group_size=2), out, "hsdp_left", stop=leave)


SCENARIOS: dict[str, Callable[[int, int, Path], None]] = {
    "two": _two_ranks,
    "three": _three_ranks,
    "one": _one_rank,
    "four": _four_ranks,
}


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], dict[str, Any]]]:
    """Runs each world once, on first use; returns a run's dump by name."""
    out = tmp_path_factory.mktemp("fsdp")
    ran: set[str] = set()
    needs = {"ddp2": "two", "fsdp2": "two", "fsdp2_whole": "two", "fsdp2_mp": "two", "left": "two",
             "load_at3": "three",
             "resumed_at3": "three", "load_at1": "one", "ddp4": "four", "hsdp4": "four",
             "hsdp_left": "four"}  # fmt: skip

    def run(name: str) -> dict[str, Any]:
        world = needs[name]
        if world == "two" and world not in ran:
            run_world(2, "two", out)
        elif world in ("three", "one") and world not in ran:
            run("fsdp2")  # their checkpoints are the 2-rank world's
            for src, dst in (("fsdp2", f"fsdp2_at{3 if world == 'three' else 1}"), ("left", "left_at3")):
                if not (out / dst).exists():
                    shutil.copytree(out / src, out / dst)
            run_world(3 if world == "three" else 1, world, out)
        elif world == "four" and world not in ran:
            run_world(4, "four", out)
        ran.add(world)
        dumped: dict[str, Any] = torch.load(out / f"{name}.pt", weights_only=False)
        dumped["dir"] = out
        return dumped

    yield run


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float = 1e-9) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=0)


def _optim_equal(a: dict[str, Any], b: dict[str, Any], rtol: float = 0.0) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        _close(a["state"][k], b["state"][k], rtol)


# ---- (1) FSDP equals DDP; (6) accumulation equals none ----------------------------------------------------


def test_two_rank_fsdp_equals_two_rank_ddp(worlds: Callable[[str], dict[str, Any]]) -> None:
    """Same global batch, same micro-batches: the FSDP run's full parameters and momentum equal DDP's --
    and it was sharded (each rank held a part of every Linear's tensors)."""
    ddp, fsdp = worlds("ddp2"), worlds("fsdp2")
    assert ddp["step"] == fsdp["step"] == STEPS
    _close(fsdp["params"], ddp["params"])
    _optim_equal(fsdp["optim"], ddp["optim"], rtol=1e-9)
    torch.testing.assert_close(fsdp["norms"], ddp["norms"], rtol=1e-9, atol=0)  # the whole model's norm
    assert min(ddp["norms"]) > CLIP  # so every step clipped
    full = sum(t.numel() for t in fsdp["params"].values())
    assert fsdp["shards"] and sum(fsdp["shards"]) < full  # rank 0's shards: about half of the model
    assert fsdp["meshes"] == {(2,)} and not ddp["shards"]


def test_accumulation_under_fsdp_equals_one_micro_batch_and_reduces_once(
    worlds: Callable[[str], dict[str, Any]],
) -> None:
    """Shares of up to 8 in micro-batches of 3 end where one micro-batch per share does; and only the
    last micro-batch's backward reduced the gradients (set_requires_gradient_sync): before it the sharded
    parameters had no gradient."""
    accumulated, whole = worlds("fsdp2"), worlds("fsdp2_whole")
    _close(accumulated["params"], whole["params"])
    _optim_equal(accumulated["optim"], whole["optim"], rtol=1e-9)
    assert set(whole["synced"]) == {True}
    synced = accumulated["synced"]
    # rank 0's share of a full step is 8 samples: micro-batches of 3, 3, 2 -> synced only in the third
    assert synced[:3] == [False, False, True]
    assert synced.count(True) == STEPS  # once a step


def test_a_mixed_precision_policy_reaches_fsdp(worlds: Callable[[str], dict[str, Any]]) -> None:
    """setup_model(mixed_precision=...): the forward ran in float32 (the unsharded parameters' dtype),
    the weights stayed float64 and end near DDP's -- not equal to them, which the float64 runs are."""
    mixed, ddp = worlds("fsdp2_mp"), worlds("ddp2")
    assert (mixed["out_dtype"], ddp["out_dtype"]) == (torch.float32, torch.float64)
    assert {t.dtype for t in mixed["params"].values()} == {torch.float64}
    _close(mixed["params"], ddp["params"], rtol=1e-4)
    with pytest.raises(AssertionError):
        _close(mixed["params"], ddp["params"])


# ---- (2) a DCP checkpoint written at 2 ranks loads at 3 and at 1 ------------------------------------------


@pytest.mark.parametrize("at", [3, 1])
def test_a_checkpoint_written_at_two_ranks_loads_at_another_size(
    worlds: Callable[[str], dict[str, Any]], at: int
) -> None:
    written, loaded = worlds("fsdp2"), worlds(f"load_at{at}")
    assert (loaded["world"], loaded["step"], loaded["first"]) == (at, STEPS, None)  # nothing left to train
    assert sorted(p.name for p in (written["dir"] / "fsdp2").iterdir()) == [f"dcp-{STEPS:09d}"]
    _close(loaded["params"], written["params"], rtol=0)
    _optim_equal(loaded["optim"], written["optim"])
    assert loaded["iteration"] == written["iteration"] == STEPS  # DynamicSGD's own state came along


def test_a_leave_below_the_minimum_under_fsdp_takes_the_restart_path_and_resumes_at_another_size(
    worlds: Callable[[str], dict[str, Any]],
) -> None:
    """Rank 1 leaves at step 3 and one survivor is below the minimum of 2: the sharded world does not
    re-form in place -- every rank stops after that step with a checkpoint -- and a world of 3 resumes
    from it, resharded, and ends equal to the uninterrupted DDP run."""
    left, resumed, ddp = worlds("left"), worlds("resumed_at3"), worlds("ddp2")
    assert (left["step"], left["stopped_early"]) == (LEAVE_AT, True)
    assert sorted(p.name for p in (left["dir"] / "left").iterdir()) == [f"dcp-{LEAVE_AT:09d}"]
    assert (left["first"], resumed["first"]) == (1, LEAVE_AT + 1)  # the 3 ranks went on from the checkpoint
    assert (resumed["step"], resumed["world"], resumed["stopped_early"]) == (STEPS, 3, False)
    _close(resumed["params"], ddp["params"])


def test_a_leave_under_hsdp_takes_the_restart_path(worlds: Callable[[str], dict[str, Any]]) -> None:
    """HSDP's mesh is whole shard groups: with in-place resizes on, rank 3 of a 2 x 2 world leaves at step
    3 and the world does not re-form in place (which would meet on the store) -- every rank stops after
    that step with the sharded checkpoint, which a restart resumes from."""
    left = worlds("hsdp_left")
    assert (left["step"], left["stopped_early"]) == (LEAVE_AT, True)
    assert sorted(p.name for p in (left["dir"] / "hsdp_left").iterdir()) == [f"dcp-{LEAVE_AT:09d}"]


# ---- (3) HSDP 2 x 2 equals DDP ----------------------------------------------------------------------------


def test_hsdp_two_by_two_equals_ddp(worlds: Callable[[str], dict[str, Any]]) -> None:
    hsdp, ddp4, ddp2 = worlds("hsdp4"), worlds("ddp4"), worlds("ddp2")
    _close(hsdp["params"], ddp4["params"])
    _optim_equal(hsdp["optim"], ddp4["optim"], rtol=1e-9)
    _close(hsdp["params"], ddp2["params"])  # and the fixed global batch: 4 ranks end where 2 do
    full = sum(t.numel() for t in hsdp["params"].values())
    assert hsdp["meshes"] == {(2, 2)}  # replicate x shard, not one dimension of 4
    assert sum(hsdp["shards"]) < full  # sharded within a group of 2: about half


# ---- (4) the metadata is data, never code -----------------------------------------------------------------


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))  # unpickling it creates the marker file


def _checkpoint(tmp: Path) -> Path:
    """A real one-process sharded checkpoint (no process group: DCP's no_dist)."""
    tensors = {"model": {"w": torch.arange(6.0)}, "optimizer": {"param_groups": [{"lr": 0.1}]}}
    return sharded.save(tmp, 7, tensors, {"step": 7}, rank=0, keep=3)


def test_the_metadata_unpickler_refuses_a_pickled_payload(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path)
    template: dict[str, Any] = {"model": {"w": torch.zeros(6)}, "optimizer": {"param_groups": [{"lr": 0.0}]}}
    assert sharded.load(path, template) == {"step": 7}  # the real metadata goes through the allow-list
    assert template["model"]["w"].tolist() == list(range(6))
    assert template["optimizer"]["param_groups"][0]["lr"] == 0.1
    marker = tmp_path / "ran"
    (path / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(sharded.MetadataRefused, match="which is not DCP metadata"):
        sharded.load(path, template)
    with pytest.raises(sharded.MetadataRefused, match="which is not DCP metadata"):
        sharded.SafeReader(path).read_metadata()
    assert not marker.exists()
    # the control: torch's own reader runs it, which is what the allow-list is for
    FileSystemReader(path).read_metadata()
    assert marker.exists()


def test_a_pickled_value_in_the_shards_is_refused_too(tmp_path: Path) -> None:
    """DCP stores non-tensor values with torch.save and its default planner loads them with
    weights_only=False; SafePlanner loads them as weights only."""
    marker = tmp_path / "ran"
    dcp.save({"evil": _Payload(marker)}, storage_writer=dcp.FileSystemWriter(tmp_path / "c"), no_dist=True)
    (tmp_path / "c" / sharded.STATE_FILE).write_bytes(encode({}))
    with pytest.raises(sharded.ShardedCheckpointFailed, match=r"Unsupported global: GLOBAL io\.open"):
        sharded.load(tmp_path / "c", {"evil": None})
    assert not marker.exists()


def test_only_complete_checkpoints_are_listed(tmp_path: Path) -> None:
    _checkpoint(tmp_path)
    (tmp_path / ".dcp-000000009.tmp").mkdir()  # a write in progress
    (tmp_path / "dcp-000000008").mkdir()  # torn: no metadata
    assert [s for s, _ in sharded.list_sharded(tmp_path)] == [7]


# ---- (5) parallelism from the spec to the trainer ---------------------------------------------------------


def _through_the_contract(training: dict[str, Any]) -> TrainConfig:
    spec = TrainingSpec.model_validate({"globalBatchSize": 64, "microBatchSize": 16, **training})
    return TrainConfig.from_env({k.name: str(v) for k, v in recipe_env(spec).items()})


@pytest.mark.parametrize(
    ("training", "expected"),
    [
        ({}, (Parallelism.DDP, 0)),
        ({"parallelism": "FSDP"}, (Parallelism.FSDP, 0)),
        ({"parallelism": "HSDP", "shardGroupSize": 2}, (Parallelism.HSDP, 2)),
        ({"parallelism": "HSDP"}, (Parallelism.HSDP, 0)),  # a pod's ranks (shard_group)
    ],
    ids=["default", "FSDP", "HSDP", "HSDP by pod"],
)
def test_parallelism_travels_from_the_spec_to_the_trainer(
    training: dict[str, Any], expected: tuple[Parallelism, int]
) -> None:
    cfg = _through_the_contract(training)
    assert (cfg.parallelism, cfg.shard_group_size) == expected
    assert cfg.sharded == (expected[0] != Parallelism.DDP)


@pytest.mark.parametrize(
    "training",
    [{"parallelism": "FSDP", "shardGroupSize": 2}, {"parallelism": "ZeRO"}],
    ids=["a group without HSDP", "unknown"],
)
def test_the_spec_refuses_a_parallelism_it_cannot_run(training: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"parallelism|shardGroupSize"):
        TrainingSpec.model_validate({"globalBatchSize": 64, "microBatchSize": 16, **training})


def test_the_flags_and_the_config_take_it_too(tmp_path: Path) -> None:
    ap = argparse.ArgumentParser()
    cli._add_train_flags(ap)
    ns = ap.parse_args(["--parallelism", "HSDP", "--shard-group-size", "4"])
    cfg = TrainConfig.from_env(cli._train_env(ns))
    assert (cfg.parallelism, cfg.shard_group_size) == (Parallelism.HSDP, 4)
    assert TrainConfig(parallelism=Parallelism.HSDP, procs_per_worker=4).shard_group == 4  # unset: a pod
    with pytest.raises(ValueError, match=r"shard_group_size=2 is for parallelism='HSDP', not 'FSDP'"):
        TrainConfig(parallelism=Parallelism.FSDP, shard_group_size=2)
    with pytest.raises(ValueError, match="checkpoint_uri"):
        TrainConfig(parallelism=Parallelism.FSDP, checkpoint_uri="s3://bucket/run")
    with pytest.raises(ValueError, match=r"parallelism='ZeRO' is not one of DDP, FSDP, HSDP"):
        TrainConfig(parallelism="ZeRO")  # type: ignore[arg-type]


def test_hsdp_refuses_a_world_that_is_not_whole_shard_groups() -> None:
    """Before any mesh or group is made: 3 ranks cannot be groups of 2 (the error names the fix)."""
    from etj_trainer.core.world import World
    from etj_trainer.loop._sharding import mesh_for

    world = World(dist_on=True, rank=0, size=3, local_rank=0, local_size=1, device=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"multiple of it, not 3 \(set replicas in whole shard groups\)"):
        mesh_for(TrainConfig(parallelism=Parallelism.HSDP, shard_group_size=2), world)


# ---- end to end: etj-train local, leaves, joins and kills through the restart path -------------------------

E2E_SAMPLES = 1438  # the digits: 45 steps of 32 an epoch, 2 epochs
E2E_STEP_S = 0.8


def _e2e_env(tmp: Path, tiny_job_env: Callable[..., dict[str, str]], **kw: str) -> dict[str, str]:
    """The tiny digits job as FSDP, its DCP checkpoints in ``tmp/ckpt``. Paced at 0.8 s a step, so a join
    scheduled at step 30 or earlier has 48 s or more to start before the job ends: at 0.3 s (18 s) a
    joiner's start on a loaded machine missed the end in a clean-clone run, and the run finished without
    the join."""
    env: dict[str, str] = tiny_job_env(
        tmp, ETJ_EPOCHS="2", ETJ_MIN_STEP_SECONDS=str(E2E_STEP_S), ETJ_PARALLELISM="FSDP", **kw
    )
    return {**env, "ETJ_CHECKPOINT_DIR": str(tmp / "ckpt")}


def _final_weights(ckpt: Path) -> tuple[int, dict[str, torch.Tensor]]:
    """The newest checkpoint's step and full model, loaded whole in this process (a DDP file or DCP)."""
    found = sharded.list_sharded(ckpt)
    ddp = load_latest(ckpt) if not found else None
    if ddp is not None:
        return ddp.step, dict(ddp.state["model"])
    (step, path), *_ = found
    model = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in tiny_mlp(10).state_dict().items()}
    sharded.load(path, {"model": model})
    return step, model


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict[str, str], str], tuple[int, Any]]:
    """A fixed 2-rank run of an end-to-end job's config (once per parallelism): its final weights."""
    out, done = tmp_path_factory.mktemp("fixed"), {}

    def run(env: dict[str, str], parallelism: str) -> tuple[int, Any]:
        if parallelism not in done:
            cfg = replace(
                TrainConfig.from_env({**env, "ETJ_PARALLELISM": parallelism, "ETJ_MIN_STEP_SECONDS": "0"}),
                checkpoint_dir=out / parallelism,
                local_checkpoint_dir=None,
                sample_log_dir=None,
                checkpoint_interval_steps=0,
            )
            worldsim.run_world(cfg, 2)
            done[parallelism] = _final_weights(out / parallelism)
        return done[parallelism]

    return run


IN_PLACE, RESTART = str(StatePath.IN_PLACE_RESHARDED), str(StatePath.RESTART)


def _elastic_run(
    tmp_path: Path, env: dict[str, str], schedule: str, resizes: list[tuple[int, int, str]]
) -> tuple[str, dict[str, torch.Tensor]]:
    """``etj-train local`` with 2 agents under ``schedule``: it finishes through the expected resizes
    (from, to, the path the state took: resharded in memory in place, or a restart of the world from
    the newest DCP checkpoint, resharded), every sample of each epoch once; returns the workers' logs
    and the final weights."""
    result = run_local(2, parse_schedule(schedule), env, tmp_path / "logs", timeout_s=600, wait_whole=True)
    assert result.get("finished") is True, result
    got = [(r["from"], r["to"], r.get("statePath")) for r in result["resizes"]]  # type: ignore[attr-defined]
    assert got == resizes, result
    logs = "".join(f.read_text(errors="replace") for f in (tmp_path / "logs").glob("worker-*.log"))
    assert logs.count("ETJ_RESULT ") == 1
    per_epoch = consumed_per_epoch(tmp_path / "samples")
    assert sorted(per_epoch) == [0, 1]
    assert all(sorted(ids) == list(range(E2E_SAMPLES)) for ids in per_epoch.values())
    step, weights = _final_weights(tmp_path / "ckpt")
    assert step == 2 * 45
    return logs, weights


@pytest.mark.slow
def test_a_sharded_job_resizes_in_place_exactly_once_and_equal(
    tmp_path: Path,
    tiny_job_env: Callable[..., dict[str, str]],
    fixed_run: Callable[[dict[str, str], str], tuple[int, Any]],
) -> None:
    """Issue 41 item 2, two agents, FSDP: a node leaves at step 15 and one joins at step 30. Both resizes
    happen in process (2 -> 1 -> 2): the leaving rank's shards are handed over before it goes, the joiner
    gets the state from rank 0, and the survivors reshard in memory -- one world start, no checkpoint
    written or read; the records say InPlaceResharded. Every sample once per epoch, and the final
    weights equal a fixed 2-rank DDP run within 1e-9."""
    env = _e2e_env(tmp_path, tiny_job_env)
    logs, weights = _elastic_run(tmp_path, env, "15:-1,30:+1", [(2, 1, IN_PLACE), (1, 2, IN_PLACE)])
    assert "resizing 2->1 in process" in logs and "resizing 1->2 in process" in logs
    assert logs.count("ready at step") == 1  # the first world's start only: nothing restarted
    assert "resharded onto" not in logs  # no checkpoint was loaded
    _close(weights, fixed_run(env, "DDP")[1])


@pytest.mark.slow
@pytest.mark.parametrize(
    "schedule",
    ["8:-1,12:+1,50:!1", "8:!1,12:+1,50:-1"],
    ids=["leave-join-kill", "kill-join-leave"],
)
def test_a_sharded_job_through_a_leave_a_join_and_a_sigkill_ends_equal_to_fixed_runs(
    tmp_path: Path,
    tiny_job_env: Callable[..., dict[str, str]],
    fixed_run: Callable[[dict[str, str], str], tuple[int, Any]],
    schedule: str,
) -> None:
    """Issue 41 item 3, with real process kills: two agents, FSDP, checkpoints every 5 steps; a node
    leaves (SIGTERM: in place, resharded), one joins (in place), and a node is SIGKILLed with its workers
    (its shards are gone: the survivor's collective fails and the world restarts from the newest
    checkpoint, at most 5 steps back, resharded). Every sample once per epoch, one result, and the final
    weights equal a fixed FSDP run's and a fixed DDP run's within the DDP proofs' 1e-9."""
    env = _e2e_env(tmp_path, tiny_job_env, ETJ_CHECKPOINT_INTERVAL_STEPS="5")
    paths = {"-1": IN_PLACE, "+1": IN_PLACE, "!1": RESTART}
    expect = [
        (a, b, paths[e.split(":")[1]])
        for (a, b), e in zip([(2, 1), (1, 2), (2, 1)], schedule.split(","), strict=True)
    ]
    _, weights = _elastic_run(tmp_path, env, schedule, expect)
    _close(weights, fixed_run(env, "FSDP")[1])
    _close(weights, fixed_run(env, "DDP")[1])


@pytest.mark.slow
def test_a_node_that_arrives_as_the_last_step_ends_restarts_nothing(tmp_path: Path) -> None:
    """The restart path's end, with real agents: two nodes train a script that, after its last step,
    works on until its agent has refused a join (tests/trainer/finish_late.py); a third node starts at the
    last step and waits in the rendezvous. The world is not restarted (it used to be: the new world
    restored the final checkpoint, trained nothing and emitted a second result with a NaN loss), the job
    finishes once, with one result."""
    logs = tmp_path / "logs"
    env = {
        "ETJ_SCRIPT": json.dumps([str(Path(__file__).with_name("finish_late.py"))]),
        "ETJ_PARALLELISM": "FSDP",
        "ETJ_EPOCHS": "10",
        "ETJ_MAX_STEPS": "8",
        "ETJ_MIN_STEP_SECONDS": "0.2",
        "ETJ_MAX_WORKERS": "3",
        "ETJ_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "FINISH_LATE_LOGS": str(logs),
    }
    result = run_local(2, parse_schedule("8:+1"), env, logs, timeout_s=600)
    assert result.get("finished") is True and result["step"] == 8, result
    text = "".join(f.read_text(errors="replace") for f in sorted(logs.glob("worker-*.log")))
    assert text.count("training is done: no restart") == 2, text[-3000:]  # each node's agent, once
    assert text.count("ready at step") == 1, text[-3000:]  # one world: never restarted
    assert result["agentExitCodes"] == [0, 0, 0]  # the joiner too: the job it came to had finished
    assert "rendezvous is closed (it has finished): nothing to join" in text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ETJ_RESULT ")]
    assert math.isfinite(json.loads(line.removeprefix("ETJ_RESULT "))["loss"])


def _one_process(cfg: TrainConfig, stop: elastic.StopFlag | None = None) -> elastic.Job:
    data = Points()
    job = elastic.Job(N, cfg, stop=stop or elastic.StopFlag())
    model = job.setup_model(_net(), shard=(torch.nn.Linear,))
    job.setup_dynamic_sgd(model.parameters())
    for step in job.steps():
        for micro in step.micro_batches():
            ids = torch.from_numpy(micro.ids)
            step.backward(F.cross_entropy(model(data.x[ids]), data.y[ids], reduction="sum"))
        step.optimizer_step()
    return job


def test_a_failed_interval_write_is_counted_as_ddps_and_the_last_one_raises(tmp_path: Path) -> None:
    """One process (no group: nothing to shard over, DCP without collectives). A checkpoint directory
    that cannot be made: the interval writes fail, are counted (checkpoint.maxFailedWrites) and training
    goes on; the final write raises; with no failure allowed the job stops at the first."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    cfg = _cfg(
        blocked / "ckpt", "FSDP", max_steps=4, checkpoint_interval_steps=2, checkpoint_max_failed_writes=5
    )
    job = _one_process(cfg)
    assert job.steps_done == 4
    with pytest.raises(sharded.ShardedCheckpointFailed, match="could not prepare"):
        job.finish()
    cfg = _cfg(
        blocked / "ckpt", "FSDP", max_steps=4, checkpoint_interval_steps=2, checkpoint_max_failed_writes=0
    )
    with pytest.raises(CheckpointNotDurable, match="1 shared checkpoint writes failed in a row"):
        _one_process(cfg)


def test_one_process_resumes_from_its_sharded_checkpoint(tmp_path: Path) -> None:
    """``etj-train train --parallelism FSDP`` alone: the same DCP checkpoints, resumed where they stopped."""
    whole = _one_process(_cfg(tmp_path / "a", "FSDP", max_steps=4))
    whole.finish()
    first = _one_process(_cfg(tmp_path / "b", "FSDP", max_steps=2))
    first.finish()
    resumed = _one_process(_cfg(tmp_path / "b", "FSDP", max_steps=4))
    resumed.finish()
    assert resumed.steps_done == 4 and [s for s, _ in sharded.list_sharded(tmp_path / "b")] == [4, 2]
    a = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in _net().state_dict().items()}
    b = {k: v.clone() for k, v in a.items()}
    sharded.load(tmp_path / "a" / "dcp-000000004", {"model": a})
    sharded.load(tmp_path / "b" / "dcp-000000004", {"model": b})
    _close(a, b, rtol=0)


def _results(text: str) -> list[dict[str, Any]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("ETJ_RESULT ")]
    return [json.loads(ln.removeprefix("ETJ_RESULT ")) for ln in lines]


def test_a_world_restarted_after_the_last_step_emits_no_second_result(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restart path's end (one process, DCP): a world that finished, restarted from its final
    checkpoint (a join that came as the last step ended), trains nothing and emits no second result --
    before the fix it printed one with a NaN loss. A world stopped *at* the last step (a restart's SIGTERM
    in it) leaves the result to the next world, which reports the last step's loss, not NaN. And the loop
    marks the training done for the agent (core/stopping.py), which then restarts nothing for a joiner."""
    state_file = tmp_path / "agent.state"
    monkeypatch.setenv("ETJ_AGENT_STATE_FILE", str(state_file))
    _one_process(_cfg(tmp_path / "a", "FSDP", max_steps=4)).finish()
    assert training_done(str(state_file))
    (first,) = _results(capfd.readouterr().out)
    assert first["step"] == 4 and math.isfinite(first["loss"])
    _one_process(_cfg(tmp_path / "a", "FSDP", max_steps=4)).finish()  # restarted: nothing left to train
    assert _results(capfd.readouterr().out) == []
    # stopped at the last step, then restarted: one result, the last step's loss
    Path(f"{state_file}.done").unlink()
    stopped = _one_process(_cfg(tmp_path / "b", "FSDP", max_steps=4), stop=_Leave(4))
    stopped.finish()
    assert (stopped.steps_done, stopped.stopped_early) == (4, True) and not training_done(str(state_file))
    _one_process(_cfg(tmp_path / "b", "FSDP", max_steps=4)).finish()
    assert _results(capfd.readouterr().out) == [first]

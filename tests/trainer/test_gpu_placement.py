"""The GPU path's placement rules on a CPU machine (issue 24): the process group a GPU worker forms carries
the control traffic on a CPU backend through every in-place resize, and each process of a pod binds its own
GPU before its first group. ``accelerator_standin/sitecustomize.py`` plays the GPU node (its docstring
says how); the tables of ``devices.py`` are in tests/trainer/test_devices.py.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from etj_testbed.worldsim import run_world
from etj_trainer.agent.local_launcher import parse_schedule, run_local
from etj_trainer.config import TrainConfig
from etj_trainer.core.sample_log import consumed_per_epoch

STANDIN = Path(__file__).parent / "accelerator_standin"


def _standin_env(mode: str, log: Path, gpus: int) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(STANDIN), os.environ.get("PYTHONPATH", "")) if p)
    return {
        "PYTHONPATH": path,
        "ETJ_TEST_STANDIN": mode,
        "ETJ_TEST_STANDIN_LOG": str(log),
        "ETJ_TEST_GPUS": str(gpus),
    }


def _binds(log: Path) -> dict[int, list[tuple[int, str, str, bool]]]:
    """Each process's bind records, in order: (local rank, device chosen, set_device calls, group formed)."""
    per_pid: dict[int, list[tuple[int, str, str, bool]]] = defaultdict(list)
    for line in log.read_text().splitlines():
        pid, local_rank, device, rest = line.split(" ", 3)
        calls, formed = rest.rsplit(" ", 1)
        per_pid[int(pid)].append((int(local_rank), device, calls, formed == "1"))
    return per_pid


@pytest.mark.slow
def test_a_gpu_pod_of_two_binds_two_gpus_and_resizes_in_place_with_cpu_control_traffic(
    tmp_path: Path, tiny_job_env: Callable[..., dict[str, str]]
) -> None:
    """2 pods x 2 processes on simulated 2-GPU nodes, under the GPU node's two-backend group: a whole pod
    leaves in place, another joins in place, the job ends where one process ends, every sample once."""
    log = tmp_path / "binds.log"
    env = tiny_job_env(
        tmp_path, ETJ_EPOCHS="6", ETJ_MIN_STEP_SECONDS="0.15", **_standin_env("cpu+cuda", log, 2)
    )
    result = run_local(2, parse_schedule("12:-1,30:+1"), env, tmp_path / "logs", 600, procs_per_node=2)
    assert result.get("finished") is True, result
    assert [(r["from"], r["to"]) for r in result["resizes"]] == [(4, 2), (2, 4)]  # type: ignore[index]
    logs = "".join(f.read_text(errors="replace") for f in (tmp_path / "logs").glob("worker-*.log"))
    assert logs.count("ready at step") == 1, "a worker restarted"
    per_epoch = consumed_per_epoch(tmp_path / "samples")
    assert sorted(per_epoch) == list(range(6))
    assert all(sorted(ids) == list(range(1438)) for ids in per_epoch.values())
    # One GPU per rank: 6 worker processes (4 + the joining pod's 2); each bound its own local rank's GPU
    # first thing -- before any group formed -- and never another one.
    binds = _binds(log)
    workers = {pid: recs for pid, recs in binds.items() if recs}
    assert len(workers) == 6, binds
    assert sorted(recs[0][0] for recs in workers.values()) == [0, 0, 0, 1, 1, 1]
    for recs in workers.values():
        local_rank, device, calls, formed = recs[0]
        assert (device, calls, formed) == (f"cuda:{local_rank}", f"[{local_rank}]", False), recs
        assert {r[1] for r in recs} == {f"cuda:{local_rank}"}


@pytest.mark.slow
def test_a_crash_is_recovered_in_place_under_the_gpu_nodes_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_cfg: TrainConfig
) -> None:
    """worldsim's 3 ranks (spawned, so they load the stand-in): one leaves at step 8, one is SIGKILLed in
    step 16; the survivor re-forms the group twice (regroup.reform, recover.py) and finishes."""
    for k, v in _standin_env("cpu+cuda", tmp_path / "binds.log", gpus=3).items():
        monkeypatch.setenv(k, v)
    cfg = replace(tiny_cfg, epochs=1, local_checkpoint_dir=None)
    lines = run_world(cfg, 3, leave_at={2: 8}, kill_at={1: 16})
    assert lines[1] == "killed"
    step, _, world = lines[0].split()
    assert int(step) == 45 and world == "1"  # an epoch of 1438 samples at 32 a step, on the survivor alone


def test_the_control_arm_a_group_with_only_the_accelerator_backend_fails_the_first_step(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tiny_cfg: TrainConfig,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The stand-in is sharp: a group with the accelerator's backend alone (what ``nccl`` was before
    issue 24) cannot take the commit's CPU tensor, in a world of 1 too."""
    for k, v in _standin_env("device-only", tmp_path / "binds.log", gpus=1).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(RuntimeError, match=r"ranks \[0\] did not finish"):
        run_world(replace(tiny_cfg, max_steps=2, local_checkpoint_dir=None), 1)
    assert "No backend type associated with device type cpu" in capfd.readouterr().err

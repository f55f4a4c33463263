"""Every resize in place, end to end on loopback (etj-train store + worker agents, `etj-train local`).

What "in place" means here, read from the workers' own logs: rank 0 prints ``ready at step`` once per
process start of a world, so a job whose world changed without any worker restarting prints it exactly
once. On the restart path (today's code before issue 16) every resize prints it again. Each test also
checks the run against a fixed-size run of the same config (float64, <= 1e-9 relative) and that every
sample was trained on exactly once per epoch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from etj_testbed.worldsim import run_world
from etj_trainer.agent.local_launcher import parse_schedule, run_local
from etj_trainer.checkpoint.store import load_latest
from etj_trainer.config import TrainConfig
from etj_trainer.core.sample_log import consumed_per_epoch

TinyJobEnv = Callable[..., dict[str, str]]


def _worker_logs(logs: Path) -> str:
    return "".join(f.read_text(errors="replace") for f in sorted(logs.glob("worker-*.log")))


def _assert_resized_in_place(result: dict[str, object], logs: Path, resizes: list[tuple[int, int]]) -> str:
    assert result.get("finished") is True, result
    assert [(r["from"], r["to"]) for r in result["resizes"]] == resizes  # type: ignore[attr-defined]
    text = _worker_logs(logs)
    assert text.count("ready at step") == 1, "a worker restarted"
    return text


def _assert_matches_a_fixed_run(env: dict[str, str], tmp: Path) -> None:
    fixed = replace(
        TrainConfig.from_env(env),
        checkpoint_dir=tmp / "fixed",
        local_checkpoint_dir=None,
        sample_log_dir=tmp / "fixed-samples",
    )
    run_world(fixed, 2)
    a, b = load_latest(tmp / "fixed"), load_latest(tmp / "ckpt")
    assert a is not None and b is not None and a.step == b.step
    pa, pb = dict(a.state["model"]), dict(b.state["model"])
    num = max(float((pa[k] - pb[k]).abs().max()) for k in pa)
    den = max(float(pa[k].abs().max()) for k in pa)
    assert num / den <= 1e-9, f"max relative difference {num / den:.3e}"
    per_epoch = consumed_per_epoch(tmp / "samples")
    assert sorted(per_epoch) == [0, 1, 2]
    for ids in per_epoch.values():
        assert sorted(ids) == list(range(1438))  # every training sample exactly once per epoch


@pytest.mark.slow
def test_a_hard_kill_is_recovered_in_place(tmp_path: Path, tiny_job_env: TinyJobEnv) -> None:
    env = tiny_job_env(tmp_path, ETJ_CHECKPOINT_DIR=str(tmp_path / "ckpt"), ETJ_MAX_WORKERS="3")
    result = run_local(3, parse_schedule("20:!1"), env, tmp_path / "logs", timeout_s=600)
    # the first world waited for all three agents, the kill shrank it once, in the survivors' processes
    logs = _assert_resized_in_place(result, tmp_path / "logs", [(3, 2)])
    assert "-> in place (1 of 3 ranks lost)" in logs
    assert result["agentExitCodes"][:2] == [0, 0]  # type: ignore[index]
    _assert_matches_a_fixed_run(env, tmp_path)


@pytest.mark.slow
def test_a_join_is_admitted_in_place(tmp_path: Path, tiny_job_env: TinyJobEnv) -> None:
    env = tiny_job_env(tmp_path, ETJ_CHECKPOINT_DIR=str(tmp_path / "ckpt"), ETJ_MAX_WORKERS="3")
    result = run_local(2, parse_schedule("15:+1"), env, tmp_path / "logs", timeout_s=600)
    logs = _assert_resized_in_place(result, tmp_path / "logs", [(2, 3)])
    assert "joining the running world in place" in logs and "resizing 2->3 in process" in logs
    assert result["agentExitCodes"] == [0, 0, 0]
    _assert_matches_a_fixed_run(env, tmp_path)


ATTACKER = """
import os, sys, time
from pathlib import Path
job = Path(sys.argv[1])  # what every pod's spec shows: the store's endpoint and the job's uid
while not job.exists():
    time.sleep(0.05)
os.environ.update(dict(line.split("=", 1) for line in job.read_text().splitlines()))
os.environ["ETJ_PROGRESS_TOKEN"] = "a-guess"  # not the job's
from etj_trainer.resize import join
for k in range(100000):
    ticket = join.ask(wait_s=5, node=f"evil-{k}")
    print("ADMITTED" if ticket else "refused", ticket, flush=True)
    if ticket:
        break
    time.sleep(0.2)
"""


@pytest.mark.slow
def test_a_tokenless_client_queueing_beside_a_join_is_never_admitted(
    tmp_path: Path, tiny_job_env: TinyJobEnv
) -> None:
    """Issue 37, run before the fix: beside `etj-train local --nodes 2 --max-nodes 3`, a process given only
    the store's endpoint and the job's uid, running the trainer's own ``join.ask``, was admitted as rank 2
    of 3 and received the job's state. Now it queues all along and is never admitted; the real joiner is,
    and the job ends as a run without the attacker does."""
    import subprocess
    import sys

    env = tiny_job_env(tmp_path, ETJ_CHECKPOINT_DIR=str(tmp_path / "ckpt"), ETJ_MAX_WORKERS="3")
    logs = tmp_path / "logs"
    attacker = subprocess.Popen(
        [sys.executable, "-c", ATTACKER, str(logs / "job.env")],
        env={k: v for k, v in os.environ.items() if k != "ETJ_PROGRESS_TOKEN"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        result = run_local(2, parse_schedule("15:+1"), env, logs, timeout_s=600)
    finally:
        attacker.kill()
        out, _ = attacker.communicate()
    assert "refused" in out and "ADMITTED" not in out, out[-2000:]
    _assert_resized_in_place(result, logs, [(2, 3)])
    assert result["agentExitCodes"] == [0, 0, 0]
    _assert_matches_a_fixed_run(env, tmp_path)

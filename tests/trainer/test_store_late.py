"""A store that starts after its workers is waited for, never a failure (issue 26; real processes).

On EKS the store pod often waits minutes for a node and an image pull while the workers are already up.
torch's store client gives up after its read timeout (60 s), so every agent exited 1, each exit a counted
worker failure: a job with N >= 5 workers could fail before its first step.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from etj_contract import env as etj_env
from etj_trainer.agent.local_launcher import LocalAgents, free_port, launch_store
from etj_trainer.core.progress import get_json

TORCH_STORE_TIMEOUT_S = 60  # torch's c10d read_timeout default: what an agent waited before the fix
WAITED = re.compile(r"waiting for the rendezvous store at \S+ \((\d+) s\)")


def _wait(what: str, pred: Callable[[], bool], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _env(tmp_path: Path, port: int, http_port: int, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        etj_env.JOB_NAME.name: "latestore",
        etj_env.RDZV_ID.name: uuid.uuid4().hex[:12],
        etj_env.RDZV_ENDPOINT.name: f"127.0.0.1:{port}",
        etj_env.PROGRESS_URL.name: f"http://127.0.0.1:{http_port}/progress",
        etj_env.MIN_WORKERS.name: "2",
        etj_env.MAX_WORKERS.name: "2",
        etj_env.CHECKPOINT_DIR.name: str(tmp_path / "ckpt"),
        etj_env.LOCAL_CHECKPOINT_DIR.name: str(tmp_path / "local"),
        "ETJ_DATA": "digits-tensor",
        "ETJ_MODEL": "etj_trainer.classifier.models:tiny_mlp",
        "ETJ_EPOCHS": "1",
        "ETJ_GLOBAL_BATCH_SIZE": "64",
        **extra,
    }


def _longest_wait(cluster: LocalAgents, i: int) -> int:
    text = (cluster.log_dir / f"worker-{i}.log").read_text(errors="replace")
    return max((int(s) for s in WAITED.findall(text)), default=0)


@pytest.mark.slow
def test_agents_started_well_before_their_store_wait_and_train(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    port, http_port = free_port(), free_port()
    cluster = LocalAgents(env=_env(tmp_path, port, http_port), log_dir=logs)
    cluster.progress_url = cluster.env[etj_env.PROGRESS_URL.name]
    try:
        cluster.start_agent()
        cluster.start_agent()
        # Both agents outlive torch's store timeout with no store at all (before the fix they exited 1).
        _wait(
            "both agents waiting past torch's store timeout",
            lambda: (
                all(_longest_wait(cluster, i) > TORCH_STORE_TIMEOUT_S for i in (0, 1))
                or any(a.poll() is not None for a in cluster.agents)
            ),
        )
        assert [a.poll() for a in cluster.agents] == [None, None], "an agent gave up on a late store"
        cluster.store, _, _ = launch_store(logs / "store.log", port, http_port)
        _wait("the job to finish", lambda: all(a.poll() is not None for a in cluster.agents), timeout=600)
        assert [a.returncode for a in cluster.agents] == [0, 0]
        assert (get_json(cluster.progress_url) or {}).get("finished") is True
    finally:
        cluster.stop()


def test_an_agent_gives_up_on_its_store_at_the_jobs_start_up_deadline(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    env = _env(tmp_path, free_port(), free_port(), **{etj_env.STORE_WAIT_SECONDS.name: "3"})
    cluster = LocalAgents(env=env, log_dir=logs)
    try:
        cluster.start_agent()
        assert cluster.agents[0].wait(timeout=120) == 1
        assert "past the job's start-up deadline" in (logs / "worker-0.log").read_text(errors="replace")
    finally:
        cluster.stop()

"""A deterministic trainer error (a bad data path) is a bounded crash loop (real processes): the agent
restarts its workers a few times, reports the error line to the progress document, then exits 1 so its
pod fails and the job's failure budget applies."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from etj_contract import env as etj_env
from etj_trainer.local_launcher import LocalAgents
from etj_trainer.progress import get_json

BAD_INPUTS = {
    # name: (the job's bad setting, what its error line must name)
    "a bad data path": ({"ETJ_DATA": "{tmp}/no-such-dataset"}, "FileNotFoundError: "),
    "a bad env value": ({"ETJ_MIN_STEP_SECONDS": "soon"}, "ValueError: "),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_a_bad_input_fails_the_agent_with_its_error_in_the_progress_doc(tmp_path: Path, case: str) -> None:
    bad, names = BAD_INPUTS[case]
    env = {
        **os.environ,
        etj_env.JOB_NAME.name: "baddata",
        etj_env.RDZV_ID.name: uuid.uuid4().hex[:12],
        etj_env.MIN_WORKERS.name: "1",
        etj_env.MAX_WORKERS.name: "1",
        etj_env.CHECKPOINT_DIR.name: str(tmp_path / "ckpt"),
        etj_env.LOCAL_CHECKPOINT_DIR.name: str(tmp_path / "local"),
        etj_env.MAX_CRASH_RESTARTS.name: "2",
        "ETJ_DATA": "digits-tensor",
        "ETJ_MODEL": "etj_trainer.models:tiny_mlp",
        **{k: v.replace("{tmp}", str(tmp_path)) for k, v in bad.items()},
    }
    cluster = LocalAgents(env=env, log_dir=tmp_path)
    try:
        cluster.start_store()
        cluster.start_agent()
        agent = cluster.agents[0]
        deadline = time.monotonic() + 300
        while agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        code = agent.poll()
        doc = get_json(cluster.progress_url) or {}
    finally:
        cluster.stop()
    log = (tmp_path / "worker-0.log").read_text(errors="replace")
    assert code == 1, log[-3000:]
    assert log.count("without progress:") == 3, log[-3000:]  # the first run and 2 restarts
    error = doc.get("lastError", "")
    assert error.startswith(f"worker-0: {names}"), doc

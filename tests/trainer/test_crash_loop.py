"""A deterministic trainer error (a bad env value, a corrupt JPEG) is a bounded crash loop (real
processes): the agent restarts its workers a few times, reports the error line to the progress document,
then exits 1 so its pod fails and the job's failure budget applies. The error line names the cause: for a
corrupt JPEG, the sample and its file (DALI's own error names neither). A bad data path is refused by the
agent before any worker starts (agent/preflight.py): the same exit and report, without the loop."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from etj_contract import env as etj_env
from etj_trainer.agent.local_launcher import LocalAgents
from etj_trainer.core.progress import get_json


def _one_corrupt_jpeg(tmp: Path) -> None:
    """16 digit JPEGs in two classes, one of them torn; a global batch of 16 reads them all at step 1."""
    from etj_trainer.data.sources import ensure_digits

    for label in ("0", "1"):
        (tmp / "jpegs" / "train" / label).mkdir(parents=True)
        for f in sorted((ensure_digits(32) / "train" / label).glob("*.jpg"))[:8]:
            shutil.copy(f, tmp / "jpegs" / "train" / label / f.name)
    torn = sorted((tmp / "jpegs" / "train" / "1").glob("*.jpg"))[2]
    torn.write_bytes(torn.read_bytes()[:40] + b"garbage" * 10)


JPEGS = {
    "ETJ_DATA": "{tmp}/jpegs",
    "ETJ_MODEL": "etj_trainer.classifier.models:small_cnn",
    "ETJ_GLOBAL_BATCH_SIZE": "16",
}
BAD_INPUTS: dict[str, tuple[dict[str, str], str, Callable[[Path], None] | None, int]] = {
    # name: (the job's bad setting, what its error line must name, what to put on disk first, worker runs)
    # A data path that does not exist is refused by the agent before any worker starts (agent/preflight.py).
    "a bad data path": (
        {"ETJ_DATA": "{tmp}/no-such-dataset"},
        "InputRefused: ETJ_DATA: {tmp}/no-such-dataset: no such file or directory",
        None,
        0,
    ),
    "a bad env value": ({"ETJ_MIN_STEP_SECONDS": "soon"}, "ValueError: ", None, 3),
    "a corrupt JPEG": (
        {**JPEGS, "ETJ_MICRO_BATCH_SIZE": "16", "ETJ_DTYPE": "float32"},
        "CorruptImageError: sample 10 ({tmp}/jpegs/train/1/",
        _one_corrupt_jpeg,
        3,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_a_bad_input_fails_the_agent_with_its_error_in_the_progress_doc(tmp_path: Path, case: str) -> None:
    bad, names, prepare, runs = BAD_INPUTS[case]
    if prepare is not None:
        prepare(tmp_path)
    names = names.replace("{tmp}", str(tmp_path))
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
        "ETJ_MODEL": "etj_trainer.classifier.models:tiny_mlp",
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
    assert log.count("without progress:") == runs, log[-3000:]  # the first run and 2 restarts, or none
    error = doc.get("lastError", "")
    assert error.startswith(f"worker-0: {names}"), doc
    # The store counted the 2 restarts inside the pod (the operator's CrashLooping condition sees them); the
    # last crash, which gave up, is the pod's failure instead. Input refused before any worker runs is no
    # crash at all.
    assert doc.get("crashes", 0) == (2 if runs else 0), doc

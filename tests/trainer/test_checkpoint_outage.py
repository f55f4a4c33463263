"""A checkpoint is durable or the job says so (issue 37, item 3), against a real S3 server (versitygw) that
the tests stop and start: an unreachable bucket is not an empty one, preflight probes the bucket, a failed
shared write is counted and reported and never named as the last checkpoint, and too many stop the job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.operator.factories import cluster, job, observe, spec, started, store, worker
from tests.trainer.polling import wait_for
from tests.trainer.s3server import S3Process, S3Server, s3_process

from etj_contract import env as etj_env
from etj_contract.progress import ProgressDoc
from etj_operator.api.models import ConditionType
from etj_operator.decide.plan.planner import plan
from etj_trainer.agent import preflight
from etj_trainer.agent.local_launcher import free_port
from etj_trainer.checkpoint.object_store import PROBE_NAME, ObjectDir, probe_problem
from etj_trainer.checkpoint.retry import Backoff, StoreUnreachable
from etj_trainer.checkpoint.store import CheckpointNotDurable, CheckpointStore, StateWriter
from etj_trainer.core.progress import get_json
from etj_trainer.resize.state_sync import agree_on_checkpoint

SHORT = Backoff(timeout_s=3.0, first_s=0.2)  # a restore that gives up quickly, for the tests


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[S3Server, S3Process]]:
    with s3_process(tmp_path / "s3") as (server, proc):
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        yield server, proc


def _state(step: int) -> dict[str, Any]:
    return {"step": step, "w": torch.full((4,), float(step))}


def test_an_unreachable_bucket_is_not_an_empty_one(s3: tuple[S3Server, S3Process], tmp_path: Path) -> None:
    """Issue 37: a LIST that failed read as "no checkpoint", so a node with an older local copy (or none:
    fresh nodes) restored that, or step 0, while the bucket held step 30."""
    _, server = s3
    uri = "s3://etj/jobs/down"
    shared = CheckpointStore(None, None, shared_objects=ObjectDir(uri))
    for step in (20, 30):
        shared.save(_state(step), step, shared=True)
    on_node = CheckpointStore(None, tmp_path / "local", shared_objects=ObjectDir(uri), policy=SHORT)
    on_node.save(_state(5), 5, shared=False)
    fresh = CheckpointStore(None, tmp_path / "fresh", shared_objects=ObjectDir(uri), policy=SHORT)
    server.stop()
    for ckpts in (on_node, fresh):
        t0 = time.monotonic()
        with pytest.raises(StoreUnreachable, match=r"cannot list the checkpoints in s3://etj/jobs/down/"):
            agree_on_checkpoint(ckpts, 0, 1)
        assert time.monotonic() - t0 < 30  # bounded by the setting (and the client's own retries)
        with pytest.raises(StoreUnreachable):
            ckpts.newest_object_step()
    server.start()  # back: both restore the bucket's newest step, not their own older one
    for ckpts in (on_node, fresh):
        state, _ = agree_on_checkpoint(ckpts, 0, 1)
        assert state is not None and state["step"] == 30


def _restore_rank(rank: int, root: str) -> None:
    """One rank of a 2-rank world restarting while the bucket is down; what it got goes to a file."""
    dist.init_process_group("gloo", init_method=f"file://{root}/init", rank=rank, world_size=2)
    ckpts = CheckpointStore(
        None, Path(root, f"local-{rank}"), shared_objects=ObjectDir("s3://etj/jobs/world"), policy=SHORT
    )
    try:
        state, _ = agree_on_checkpoint(ckpts, rank, 2)
        got = f"restored {state['step'] if state else None}"
    except StoreUnreachable as e:
        got = f"unreachable {e}"
    Path(root, f"got-{rank}").write_text(got)
    dist.destroy_process_group()


def test_a_world_restarted_while_the_bucket_is_down_fails_on_every_rank(
    s3: tuple[S3Server, S3Process], tmp_path: Path
) -> None:
    """Rank 1 holds step 5, the bucket step 30, rank 0 cannot list it: no rank restores 5 (or 0), and every
    rank names the cause instead of failing in a broken collective."""
    _, server = s3
    CheckpointStore(None, None, shared_objects=ObjectDir("s3://etj/jobs/world")).save(_state(30), 30, True)
    CheckpointStore(None, tmp_path / "local-1").save(_state(5), 5, shared=False)
    server.stop()
    mp.spawn(_restore_rank, args=(str(tmp_path),), nprocs=2, join=True)
    got = [(tmp_path / f"got-{r}").read_text() for r in range(2)]
    assert got[0].startswith("unreachable cannot list the checkpoints in s3://etj/jobs/world/"), got
    assert got[1] == "unreachable rank 0 could not read s3://etj/jobs/world/ (its log names the error)", got


def _script_env(uri: str) -> dict[str, str]:
    """The smallest job preflight checks the bucket of: this file as the script, and the bucket."""
    return {**os.environ, etj_env.SCRIPT.name: f'["{__file__}"]', etj_env.CHECKPOINT_URI.name: uri}


def test_preflight_probes_the_bucket(s3: tuple[S3Server, S3Process]) -> None:
    """Issue 37: with the endpoint unreachable a job trained all its steps and failed only at the final
    write. Preflight now lists the bucket and writes (then deletes) a probe object before training."""
    server_env, server = s3
    assert preflight.check(_script_env("s3://etj/jobs/ok"), deep=False) == []
    assert ObjectDir("s3://etj/jobs/ok").names() == []  # the probe is gone again
    (missing,) = preflight.check(_script_env("s3://no-such-bucket/x"), deep=False)
    assert missing.var is etj_env.CHECKPOINT_URI and "NoSuchBucket" in missing.problem, missing
    server.stop()
    (down,) = preflight.check(_script_env("s3://etj/jobs/ok"), deep=False)
    assert down.for_cli().startswith("--checkpoint-uri: cannot list s3://etj/jobs/ok/ at "), down
    assert server_env.endpoint in down.problem, down
    assert probe_problem("s3://etj/jobs/ok") is not None and PROBE_NAME.startswith(".")


def test_a_failed_shared_write_is_counted_and_never_named_durable(
    s3: tuple[S3Server, S3Process], tmp_path: Path
) -> None:
    _, server = s3
    store = CheckpointStore(None, tmp_path / "local", shared_objects=ObjectDir("s3://etj/jobs/w"))
    writer = StateWriter(store, local_interval_s=0)

    def write(step: int) -> None:
        writer.background(lambda: _state(step), step, shared=True, local=True)
        writer.wait()

    write(10)
    assert writer.durable is not None and writer.durable["path"] == "s3://etj/jobs/w/ckpt-000000010.pt"
    server.stop()
    for failed, step in enumerate((20, 30), start=1):
        write(step)
        assert (writer.failed_writes, writer.durable["step"]) == (failed, 10)
        assert writer.shared_error is not None and "ckpt-0000000" in writer.shared_error
        assert (tmp_path / "local" / f"ckpt-{step:09d}.pt").is_file()  # the node-local copy goes on
    writer.check_failures(2)  # two failures are within maxFailedWrites 2
    with pytest.raises(CheckpointNotDurable, match="2 shared checkpoint writes failed in a row"):
        writer.check_failures(1)
    server.start()
    write(40)
    assert (writer.failed_writes, writer.shared_error, writer.durable["step"]) == (0, None, 40)


# ---- the whole trainer through an outage --------------------------------------------------------------

INTERVAL = 10
TRAIN = ["--data", "digits-tensor", "--model", "etj_trainer.classifier.models:tiny_mlp", "--epochs", "200",
         "--global-batch-size", "32", "--min-step-seconds", "0.1",
         "--checkpoint-interval-steps", str(INTERVAL)]  # fmt: skip


def _trainer(tmp_path: Path, node: str, url: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "ETJ_LOCAL_CHECKPOINT_DIR": str(tmp_path / node), "ETJ_PROGRESS_URL": url}
    cmd = [sys.executable, "-m", "etj_trainer.cli", "train", *TRAIN, "--checkpoint-uri", "s3://etj/jobs/e2e"]
    out = open(tmp_path / f"{node}.log", "w")  # noqa: SIM115  (the child holds it; read back by name)
    return subprocess.Popen([*cmd, *extra], env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


class _Progress:
    """The progress document as the operator reads it: from a real ``etj-train store``."""

    def __init__(self, tmp_path: Path) -> None:
        port, http_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "etj_trainer.cli", "store", "--host", "127.0.0.1", "--port", str(port),
               "--http-port", str(http_port)]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != etj_env.PROGRESS_TOKEN.name}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{http_port}/progress"
        wait_for(lambda: get_json(self.url) is not None)

    def doc(self) -> ProgressDoc:
        return ProgressDoc.from_json(get_json(self.url) or {})

    def condition(self) -> str:
        """CheckpointDurable as the operator's planner makes it of this document: status, reason."""
        s = spec(checkpoint={"uri": "s3://etj/jobs/e2e"})
        obs = observe(cluster(), [worker(0, "spot-0"), store()], progress=get_json(self.url) or {})
        conds = plan(job(s, started(1)), obs).status.conditions
        (c,) = [c for c in conds if c.type == ConditionType.CHECKPOINT_DURABLE]
        return f"{c.status} {c.reason}"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _durable(doc: ProgressDoc) -> int:
    return int(doc.last_checkpoint["step"]) if doc.last_checkpoint else -1


@pytest.mark.slow
def test_an_outage_is_reported_and_survived(s3: tuple[S3Server, S3Process], tmp_path: Path) -> None:
    """Stop S3 mid-run: within one interval the reports carry the error (CheckpointDurable=False), the
    last durable step stands still, training goes on; S3 back: the error clears and the durable step is
    again within one interval of the step. A whole world restarted while S3 is down does not start from 0.
    Timings go to tmp_path/outage.txt (docs/trainer.md quotes them)."""
    _, server = s3
    progress = _Progress(tmp_path)
    trainer = _trainer(tmp_path, "node-a", progress.url, "--checkpoint-max-failed-writes", "1000")
    lines: list[str] = []
    try:
        wait_for(lambda: _durable(progress.doc()) >= INTERVAL, timeout=240, every=0.2)
        before = progress.doc()
        assert progress.condition() == "True CheckpointWritten"
        server.stop()
        t_down = time.monotonic()
        wait_for(lambda: progress.doc().checkpoint_error is not None, timeout=120, every=0.2)
        failing = progress.doc()
        t_seen = time.monotonic() - t_down
        assert progress.condition() == "False CheckpointWriteFailed"
        assert failing.step is not None and before.step is not None
        assert _durable(failing) <= before.step + INTERVAL  # nothing written during the outage is named
        assert "s3://etj/jobs/e2e/ckpt-" in (failing.checkpoint_error or "")
        lines.append(
            f"down at step {before.step} (durable {_durable(before)}); error reported {t_seen:.1f} s "
            f"later at step {failing.step}: {failing.checkpoint_error}"
        )
        wait_for(lambda: (progress.doc().failed_writes or 0) >= 2, timeout=120, every=0.2)
        down_doc = progress.doc()
        assert down_doc.step is not None and down_doc.step > failing.step  # training went on
        server.start()
        t_up = time.monotonic()
        wait_for(lambda: progress.doc().checkpoint_error is None, timeout=120, every=0.2)
        back = progress.doc()
        assert progress.condition() == "True CheckpointWritten"
        assert back.step is not None and back.step - _durable(back) <= INTERVAL, back  # at most one interval
        lines.append(
            f"{down_doc.failed_writes} writes failed by step {down_doc.step} ({t_up - t_down:.1f} s down); "
            f"up: cleared {time.monotonic() - t_up:.1f} s later at step {back.step}, durable {_durable(back)}"
        )
        # A whole-world restart on a fresh node while S3 is down: refused with the error, not from step 0.
        server.stop()
        fresh = _trainer(tmp_path, "node-b", progress.url, "--checkpoint-store-timeout-s", "5")
        assert fresh.wait(120) != 0
        text = (tmp_path / "node-b.log").read_text()
        assert "--checkpoint-uri: cannot list s3://etj/jobs/e2e/" in text and "ready at step" not in text, (
            text
        )
        lines.append("restart on a fresh node while down: " + text.strip().splitlines()[-1])
        server.start()
    finally:
        trainer.send_signal(signal.SIGTERM)
        trainer.wait(120)
        progress.close()
        (tmp_path / "outage.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))


@pytest.mark.slow
def test_too_many_failed_writes_stop_the_job_with_the_error(
    s3: tuple[S3Server, S3Process], tmp_path: Path
) -> None:
    _, server = s3
    progress = _Progress(tmp_path)
    trainer = _trainer(tmp_path, "node-a", progress.url, "--checkpoint-max-failed-writes", "1")
    try:
        wait_for(lambda: _durable(progress.doc()) >= INTERVAL, timeout=240, every=0.2)
        server.stop()
        assert trainer.wait(180) != 0
    finally:
        if trainer.poll() is None:
            trainer.kill()
        progress.close()
    text = (tmp_path / "node-a.log").read_text()
    assert "CheckpointNotDurable: 2 shared checkpoint writes failed in a row" in text, text[-3000:]
    assert "checkpoint.maxFailedWrites 1" in text, text[-3000:]

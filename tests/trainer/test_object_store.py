"""Checkpoints on S3 for real (checkpoint.uri: s3://bucket/prefix), against a real S3-compatible server
(versitygw, tests/trainer/s3server.py): the object store as a checkpoint location, and a trainer that
loses every local copy and resumes from the bucket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.trainer.s3server import S3Server, s3_server

from etj_trainer.checkpoint.object_store import ObjectDir, S3Location
from etj_trainer.checkpoint.store import CheckpointStore, encode
from etj_trainer.resize.state_sync import agree_on_checkpoint


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    with s3_server(tmp_path / "s3") as server:
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        yield server


@pytest.mark.parametrize(
    ("uri", "bucket", "prefix"),
    [("s3://b/jobs/one", "b", "jobs/one/"), ("s3://b/jobs/one/", "b", "jobs/one/"), ("s3://b", "b", "")],
)
def test_s3_uri(uri: str, bucket: str, prefix: str) -> None:
    assert S3Location.parse(uri) == S3Location(bucket, prefix)


@pytest.mark.parametrize("bad", ["/ckpt", "gs://b/x", "s3:///x"])
def test_not_an_s3_uri(bad: str) -> None:
    with pytest.raises(ValueError):
        S3Location.parse(bad)


def _state(step: int) -> dict[str, object]:
    return {"step": step, "w": torch.full((4,), float(step))}


def test_object_store_keeps_the_newest_verified_checkpoints(s3: S3Server, tmp_path: Path) -> None:
    store = CheckpointStore(None, None, keep=2, shared_objects=ObjectDir("s3://etj/jobs/a"))
    assert store.durable
    for step in (10, 20, 30):
        store.save(_state(step), step, shared=True)
    objects = ObjectDir("s3://etj/jobs/a")
    assert sorted(objects.names()) == ["ckpt-000000020.pt", "ckpt-000000030.pt"]  # keep=2 pruned the oldest
    # The newest object is corrupt (written by something else): the previous good one is loaded.
    objects.write("ckpt-000000040.pt", encode(_state(40))[:-7])
    latest = store.latest()
    assert latest is not None and latest.step == 30 and latest.path == "s3://etj/jobs/a/ckpt-000000030.pt"
    assert torch.equal(latest.state["w"], torch.full((4,), 30.0))
    # Another prefix in the same bucket is another job's.
    assert ObjectDir("s3://etj/jobs/b").names() == []


RESTORES = {
    # local copies per rank -> (step every rank restores, source rank, downloads)
    "fresh-nodes": ({}, (30, 0, 1)),  # the bucket's step, downloaded once for the world
    "older-survivor": ({1: 10}, (30, 0, 1)),  # a survivor's older copy: the bucket still wins, still once
    "newer-survivor": ({2: 40}, (40, 2, 0)),  # a survivor's newer copy: no download at all
}


def _restore(rank: int, world: int, root: str) -> None:
    """One rank of a world restarting once per case: its own copy (if any), the bucket, downloads counted."""
    dist.init_process_group("gloo", init_method=f"file://{root}/init", rank=rank, world_size=world)
    for case, (local_steps, _) in RESTORES.items():
        local = Path(root, case, f"local-{rank}")
        store = CheckpointStore(None, local, shared_objects=ObjectDir(f"s3://etj/jobs/{case}"))
        if rank in local_steps:
            CheckpointStore(None, local).save(_state(local_steps[rank]), local_steps[rank], shared=False)
        assert store.shared_objects is not None
        read = store.shared_objects.read

        def counted(name: str, read: Callable[[str], bytes] = read, case: str = case) -> bytes:
            with open(Path(root, case, "downloads"), "a") as f:
                f.write(f"{rank} {name}\n")
            return read(name)

        store.shared_objects.read = counted  # type: ignore[method-assign]
        state, src = agree_on_checkpoint(store, rank, world)
        assert state is not None
        step, w = state["step"], float(state["w"][0])  # type: ignore[index]
        Path(root, case, f"got-{rank}").write_text(f"{step} {w} {src}")
    dist.destroy_process_group()


def test_a_world_restores_with_at_most_one_download(s3: S3Server, tmp_path: Path) -> None:
    """Issue 26: every rank downloaded and decoded the S3 checkpoint on a restart (N GETs of a large file)."""
    for case in RESTORES:
        (tmp_path / case).mkdir()
        shared = CheckpointStore(None, None, shared_objects=ObjectDir(f"s3://etj/jobs/{case}"))
        for step in (20, 30):
            shared.save(_state(step), step, shared=True)
    mp.spawn(_restore, args=(3, str(tmp_path)), nprocs=3, join=True)
    for case, (_, (want_step, want_src, want_downloads)) in RESTORES.items():
        got = {Path(tmp_path, case, f"got-{r}").read_text() for r in range(3)}
        assert got == {f"{want_step} {float(want_step)} {want_src}"}, case
        downloads = tmp_path / case / "downloads"
        lines = downloads.read_text().splitlines() if downloads.exists() else []
        assert len(lines) == want_downloads and all(x.startswith("0 ") for x in lines), (case, lines)


TRAIN = ["--data", "digits-tensor", "--model", "etj_trainer.classifier.models:tiny_mlp", "--epochs", "50",
         "--global-batch-size", "32", "--min-step-seconds", "0.05"]  # fmt: skip


def _train(tmp_path: Path, local: str, extra: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ETJ_LOCAL_CHECKPOINT_DIR": str(tmp_path / local)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "etj_trainer.cli",
            "train",
            *TRAIN,
            "--checkpoint-uri",
            "s3://etj/jobs/e2e",
            "--checkpoint-interval-steps",
            "10000",
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.slow
def test_a_trainer_that_lost_every_local_copy_resumes_from_the_bucket(s3: S3Server, tmp_path: Path) -> None:
    objects = ObjectDir("s3://etj/jobs/e2e")
    first = _train(tmp_path, "node-a", [])
    try:
        deadline = time.monotonic() + 180
        while (
            len(list((tmp_path / "node-a").glob("ckpt-*.pt"))) == 0
            or max(int(p.name[5:14]) for p in (tmp_path / "node-a").glob("ckpt-*.pt")) < 5
        ):
            assert time.monotonic() < deadline and first.poll() is None, "no progress"
            time.sleep(0.2)
        first.send_signal(signal.SIGTERM)  # the just-in-time checkpoint goes to the bucket
        out, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, out.decode()[-2000:]
    saved = [int(n[5:14]) for n in objects.names()]
    assert len(saved) == 1 and saved[0] >= 5, saved
    assert not list(tmp_path.glob("s3:*")), "the URI became a local directory"
    # A new node: no local copy at all; it must start from the bucket's step, not from step 0.
    second = _train(tmp_path, "node-b", ["--epochs", "1"])
    out2, _ = second.communicate(timeout=300)
    text = out2.decode()
    assert second.returncode == 0, text[-2000:]
    assert f"ready at step {saved[0]}" in text, text[-2000:]


def test_every_scheme_the_crd_admits_is_one_the_trainer_writes() -> None:
    """checkpoint.uri: the CRD's pattern and the trainer's parser agree (gs:// passed the CRD and failed
    the job at its first save)."""
    import re

    from etj_contract import env as etj_env

    pattern = re.compile(etj_env.CHECKPOINT_URI_RE)
    for scheme in etj_env.CHECKPOINT_URI_SCHEMES:
        for uri in (f"{scheme}://bucket", f"{scheme}://bucket/a/b/"):
            assert pattern.match(uri), uri
            assert S3Location.parse(uri).bucket == "bucket"
    for uri in ("gs://bucket/job", "az://c/job", "file:///tmp/x", "s3:///job", "bucket/job"):
        assert not pattern.match(uri), uri

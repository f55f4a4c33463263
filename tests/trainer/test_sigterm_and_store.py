"""Real processes, real signals: just-in-time checkpoint on SIGTERM; the store's progress server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.trainer.polling import wait_for

from etj_trainer.agent.local_launcher import launch_store
from etj_trainer.checkpoint.store import list_checkpoints, load_latest
from etj_trainer.core.progress import get_json, post_json

TRAIN_ARGS = [
    "--data",
    "digits-tensor",
    "--model",
    "etj_trainer.classifier.models:tiny_mlp",
    "--epochs",
    "50",
    "--global-batch-size",
    "32",
    "--min-step-seconds",
    "0.05",
]


def _wait_for(pred: Callable[[], object], timeout: float = 120.0) -> None:
    wait_for(pred, timeout, every=0.1)


def test_sigterm_writes_checkpoint_at_next_step_boundary(tmp_path: Path) -> None:
    shared, local = tmp_path / "ckpt", tmp_path / "shm"
    # The local copy is no longer written every step; frequent background snapshots show the progress.
    env = {**os.environ, "ETJ_LOCAL_CHECKPOINT_DIR": str(local), "ETJ_LOCAL_SNAPSHOT_INTERVAL_S": "0.2"}
    # Shared checkpoints only every 10,000 steps: any shared checkpoint we find was written because of
    # the signal.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "etj_trainer.cli",
            "train",
            *TRAIN_ARGS,
            "--checkpoint-dir",
            str(shared),
            "--checkpoint-interval-steps",
            "10000",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for(lambda: len(list_checkpoints(local)) > 0 and list_checkpoints(local)[0][0] >= 5)
        assert list_checkpoints(shared) == []
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out.decode()[-2000:]
    saved = load_latest(shared)
    newest_local = load_latest(local)
    assert saved is not None and newest_local is not None
    assert saved.step == newest_local.step >= 5  # the just-in-time copy is the last completed step
    # the sampler is at that step: an epoch of 1438 samples is 44 steps of 32 and one of 30
    epoch, steps_in = divmod(saved.step, 45)
    assert (saved.state["sampler"]["epoch"], saved.state["sampler"]["consumed"]) == (epoch, steps_in * 32)
    assert b"ETJ_RESULT" not in out  # it stopped early, it did not "finish"


def test_store_serves_progress_and_tcpstore(tmp_path: Path) -> None:
    proc, port, http_port = launch_store()
    url = f"http://127.0.0.1:{http_port}/progress"
    try:
        _wait_for(lambda: get_json(url) is not None)
        assert get_json(url) == {}
        leave = {"time": "2026-01-01T12:00:00Z", "from": 2, "to": 1, "reason": "scale-down"}
        post_json(url, {"step": 7, "worldSize": 2, "resizes": [leave]})
        want = {"step": 7, "worldSize": 2, "resizes": [leave], "finished": False}
        assert get_json(url) == want
        post_json(url, {"step": 6, "worldSize": 2, "resizes": []})  # stale: the resize stays
        assert get_json(url) == {**want, "step": 6}
        req = urllib.request.Request(url, data=b"[1]", method="POST")
        try:
            urllib.request.urlopen(req, timeout=5)
            raise AssertionError("a non-object body must be rejected")
        except urllib.error.HTTPError as e:
            assert e.code == 400
        from datetime import timedelta

        from torch.distributed import TCPStore

        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert urllib.request.urlopen(url.replace("progress", "healthz")).read() == b"ok"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_two_stores_on_one_machine_share_the_ports_on_their_own_addresses() -> None:
    # regression: the store listened on every address (TCPStore's libuv server ignores the host it is
    # given), so two process-backed jobs on one machine (a demo beside a test run) took each other's port
    from etj_trainer.agent.local_launcher import free_port

    port, http_port = free_port(), free_port()
    procs = []
    try:
        for ip in ("127.77.0.2", "127.77.0.3"):
            cmd = [sys.executable, "-m", "etj_trainer.cli", "store", "--host", ip,
                   "--port", str(port), "--http-port", str(http_port)]  # fmt: skip
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls = [f"http://127.77.0.{i}:{http_port}/progress" for i in (2, 3)]
        _wait_for(lambda: all(get_json(u) is not None for u in urls))
        post_json(urls[0], {"step": 1})
        post_json(urls[1], {"step": 2})
        assert [(get_json(u) or {}).get("step") for u in urls] == [1, 2]
        assert all(p.poll() is None for p in procs), "a store exited: its port was taken"
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)

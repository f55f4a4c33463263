"""A worker's life under a real kubelet: a graceful delete (SIGTERM to PID 1, then the grace period), an
OOM kill by the container's memory limit, and a command that fails (the whole kind suite: `make e2e-kind`)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kind.kindbed import KindBed, exactly_once, running_job, two_worker_job

pytestmark = [pytest.mark.slow, pytest.mark.kind, pytest.mark.kind_full]

EPOCHS = 10


def two_workers(epochs: int = EPOCHS, **trainer: Any) -> dict[str, Any]:
    return two_worker_job(epochs, 0.5, spot_only=True, **trainer)


def test_a_gracefully_deleted_worker_leaves_in_place(kind: KindBed) -> None:
    with running_job(kind, "delete", two_workers(), EPOCHS) as run:
        workers = run.wait("two workers training", lambda: run.training_workers(2, min_step=5))
        victim, survivor = sorted(workers)
        # SIGTERM to the worker's PID 1, then the pod's grace period: what a drain or a user does.
        kind.kube.request("DELETE", f"/api/v1/namespaces/{run.ns}/pods/{victim}")
        run.wait(
            "a resize 2 -> 1 with its pause recorded",
            lambda: any(
                r["from"] == 2 and r["to"] == 1 and r.get("pauseSeconds") is not None
                for r in run.status().get("resizeHistory") or []
            ),
        )
        assert survivor in run.running_on("worker"), "the survivor was restarted or replaced"
        result = run.result()

    status = result.status.get("status") or {}
    assert result.phase == "Succeeded", (run.run_dir, status.get("conditions"))
    leave = next(r for r in status.get("resizeHistory") or [] if r["from"] == 2 and r["to"] == 1)
    assert not leave.get("stepsLost"), leave  # in place: the leaver finished its step and left
    assert not status.get("failures"), status
    exactly_once(run.run_dir, EPOCHS)


def _warnings(kind: KindBed, ns: str, name: str) -> list[str]:
    return [e.get("message") or "" for e in kind.events(ns, name) if e.get("type") == "Warning"]


def test_an_oom_killed_worker_shows_in_status_and_events(kind: KindBed) -> None:
    # 200 MiB is less than torch's import needs: the kernel's OOM killer ends the container (limit = request).
    job = two_workers(2)
    job["spec"]["trainer"]["resources"]["memory"] = "200Mi"
    job["spec"]["failurePolicy"]["maxFailures"] = 1
    with running_job(kind, "oom", job, 2) as run:
        run.wait(
            "an OOMKilled warning",
            lambda: any("OOMKilled" in m for m in _warnings(kind, run.ns, run.name)),
        )
        result = run.result(600)
    status = result.status.get("status") or {}
    assert (status.get("failures") or 0) >= 1, status
    assert result.phase == "Failed", status.get("conditions")


def test_a_failing_command_shows_its_exit_code_and_last_line(kind: KindBed) -> None:
    job = two_workers(2, command=["sh", "-c", "echo 'no data set at /data/imagenet/train' >&2; exit 3"])
    job["spec"]["failurePolicy"]["maxFailures"] = 1
    with running_job(kind, "cmdfail", job, 2) as run:
        message = run.wait(
            "a WorkerFailed warning with the exit code and the log's last line",
            lambda: next((m for m in _warnings(kind, run.ns, run.name) if "exit code 3" in m), None),
        )
        result = run.result(600)
    assert "no data set at /data/imagenet/train" in message, message
    status = result.status.get("status") or {}
    assert result.phase == "Failed" and (status.get("failures") or 0) >= 1, status

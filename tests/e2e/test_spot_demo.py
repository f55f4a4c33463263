"""End to end: the demo's spot interruption and return, against a fixed-size run of the same job.

Runs on the local control plane by default; ETJ_E2E_KUBECONFIG runs it on another cluster, with the
operator, the process-node harness and the worker processes still on this machine. With
ETJ_E2E_OPERATOR=installed it starts nothing: the cluster's installed operator and its own nodes train the
job, in the image ETJ_E2E_TRAINER_IMAGE, and the interruption is a taint and cordon through the API
(tests/e2e/e2econfig.py; the kind workflow runs it that way).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from etj_testbed.demo.script import DemoResult, Script
from tests.e2e.e2econfig import ACCURACY_POINTS, E2EConfig, demo_job

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

CONFIG = E2EConfig.from_env()
EPOCHS = CONFIG.epochs  # long enough for an interruption and a return
MIN_STEP_SECONDS = 0.5  # ~90 steps after the interruption: >= 45 s for the joiner to arrive


def _manifest(**replicas: int) -> dict[str, Any]:
    job = demo_job()
    job["spec"]["training"]["epochs"] = EPOCHS
    job["spec"]["replicas"].update(replicas)
    # A floor under the training time, whatever the machine's speed: the scale-up after the interruption
    # must complete before training ends (a clean-clone run beside another test run finished its ~90 steps
    # after the interruption in 15 s, before the joiner's world formed, and the scale-up had no pause).
    job["spec"]["trainer"]["env"].append({"name": "ETJ_MIN_STEP_SECONDS", "value": str(MIN_STEP_SECONDS)})
    return job


@pytest.fixture(scope="module")
def runs(kubeconfig: Path) -> Iterator[tuple[DemoResult, DemoResult]]:
    # Kept after the session (pytest's tmp dirs rotate away), for whoever debugs a failure.
    base = CONFIG.run_root()
    elastic = CONFIG.run(kubeconfig, base / "elastic", _manifest(), Script(timeout_s=1500), "el")
    # Same job, same seed, at the elastic run's full size (4) throughout: the reference for accuracy (what
    # the interruption cost) and for the samples of each epoch. Same size also means the same per-worker
    # batches, so BatchNorm statistics match outside the interrupted stretch.
    never = Script(interrupt_epoch=10**6, timeout_s=1500)
    fixed = CONFIG.run(kubeconfig, base / "fixed", _manifest(min=4, max=4), never, "fx")
    yield elastic, fixed


def _status(result: DemoResult) -> dict[str, Any]:
    return result.status.get("status") or {}


def test_both_jobs_succeed(runs: tuple[DemoResult, DemoResult]) -> None:
    elastic, fixed = runs
    for result in (elastic, fixed):
        conditions = [
            (c["type"], c["status"], c.get("message")) for c in _status(result).get("conditions") or []
        ]
        assert result.phase == "Succeeded", f"{result.run_dir}: {result.phase} {conditions}"


def test_interruption_and_scale_up_are_recorded_with_reasons_and_pauses(
    runs: tuple[DemoResult, DemoResult],
) -> None:
    elastic, _ = runs
    assert [what for _, what in elastic.events if "interruption" in what], elastic.events
    history = _status(elastic).get("resizeHistory") or []
    # Pods starting before the first world (0→1→3→4) and exiting after the finish (n→0) are not resizes:
    # the timeline shows only the world's own changes (issue 16).
    assert all(r["from"] > 0 and r["to"] > 0 for r in history), history
    # A scale-in while training, then a scale-up.
    downs = [i for i, r in enumerate(history) if 0 < r["to"] < r["from"]]
    assert downs, history
    ups = [r for r in history[downs[0] + 1 :] if r["to"] > r["from"] >= 1]
    assert ups, history
    downs_ = [history[i] for i in downs]
    for resize in (downs_[0], ups[0]):
        assert resize.get("reason"), (resize, history, elastic.run_dir)
        assert resize.get("pauseSeconds") is not None, (resize, history, elastic.run_dir)
    spot = [r for r in downs_ if "Spot" in r["reason"] or "Interrupt" in r["reason"]]
    assert spot, downs_
    # One entry per resize: the operator's reason and the trainer's pause on the same record (an in-place
    # leave reports before the pod is gone; that used to leave a second, pause-less entry).
    assert all(r.get("pauseSeconds") is not None for r in spot), (spot, history, elastic.run_dir)


def test_every_sample_is_seen_exactly_once_per_epoch(runs: tuple[DemoResult, DemoResult]) -> None:
    from etj_trainer.core.sample_log import consumed_per_epoch

    if not CONFIG.reads_sample_logs:
        pytest.skip("ETJ_E2E_SHARED_DIR is not set: the workers' sample logs are on the nodes, not here")
    elastic, fixed = runs
    got = consumed_per_epoch(elastic.run_dir / "samples")
    want = consumed_per_epoch(fixed.run_dir / "samples")
    assert sorted(got) == list(range(EPOCHS)) == sorted(want)
    for epoch in range(EPOCHS):
        duplicates = [i for i, n in Counter(got[epoch]).items() if n > 1]
        assert not duplicates, f"epoch {epoch}: samples trained twice: {duplicates[:20]}"
        assert sorted(got[epoch]) == sorted(want[epoch]), f"epoch {epoch}: samples skipped or extra"


def test_final_accuracy_matches_a_fixed_size_run(runs: tuple[DemoResult, DemoResult]) -> None:
    elastic, fixed = runs
    acc = [(_status(r).get("progress") or {}).get("accuracy") for r in (elastic, fixed)]
    assert None not in acc, acc
    # The trainer may report a fraction or a percentage.
    points = [float(a) * 100 if float(a) <= 1 else float(a) for a in acc if a is not None]
    assert abs(points[0] - points[1]) <= ACCURACY_POINTS, f"elastic {points[0]:.2f} vs fixed {points[1]:.2f}"

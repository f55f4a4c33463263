"""End to end: a CPU job of 2 processes per pod (spec.trainer.procsPerWorker) on the local cluster.

Two worker pods of 2 ranks each train the demo's job; a spot interruption takes one pod -- both of its
ranks leave at once and the other pod's ranks go on in place. Status counts ranks where it means ranks
(worldSize 4 at full size) and pods in the resize history (the trainer's 4 -> 2 becomes the operator's
2 -> 1, with the trainer's pause on the same entry), and every sample is trained once per epoch.
Short on purpose (3 epochs of ~23 steps): CI runs it on a 2-core machine.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from etj_testbed.demo.script import Script
from tests.e2e.e2econfig import E2EConfig, demo_job

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

CONFIG = E2EConfig.from_env()
EPOCHS = 3
PROCS = 2


def _manifest() -> dict[str, Any]:
    job = demo_job()
    spec = job["spec"]
    trainer = spec["trainer"]
    trainer["resources"]["gpu"] = 0  # CPU processes: their number comes from procsPerWorker alone
    trainer["procsPerWorker"] = PROCS
    # A floor under the training time, as the spot demo's: the interruption must land while the job trains.
    trainer["env"].append({"name": "ETJ_MIN_STEP_SECONDS", "value": "0.5"})
    spec["replicas"] = {"min": 1, "max": 2}
    spec["training"]["epochs"] = EPOCHS
    # CPU pods do not use up a node's GPUs, so nothing else keeps the two pods on two nodes; the
    # interruption must take one pod (both its ranks), not the whole job.
    worker = {"etj.dev/job": job["metadata"]["name"], "etj.dev/role": "worker"}
    spec["placement"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": worker}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    return job


def test_two_processes_per_pod_through_a_spot_interruption(kubeconfig: Path) -> None:
    if CONFIG.installed:
        pytest.skip("the installed mode's nodes are the cluster's own; this job is sized for the local one")
    run_dir = CONFIG.run_root() / "procs"
    script = Script(interrupt_epoch=1, interrupt_min_world=2 * PROCS, timeout_s=900)
    result = CONFIG.run(kubeconfig, run_dir, _manifest(), script, "pp")
    status = result.status.get("status") or {}
    assert result.phase == "Succeeded", (result.run_dir, status.get("conditions"))
    assert max(s["world"] for s in result.samples) == 2 * PROCS  # worldSize counts ranks: 2 pods x 2
    assert status.get("perRankBatch") and status.get("perWorkerBatch"), status
    history = status.get("resizeHistory") or []
    spot = [r for r in history if r["reason"] == "SpotInterruption"]
    assert [(r["from"], r["to"]) for r in spot] == [(2, 1)], history  # pods, not ranks
    # the trainer's record of the in-place leave (4 -> 2 ranks) landed on the operator's entry
    assert spot[0].get("pauseSeconds") is not None, history
    assert not [r for r in history if r["from"] > 2 or r["to"] > 2], history
    _assert_every_sample_once(result.run_dir / "samples")


def _assert_every_sample_once(samples: Path) -> None:
    from etj_trainer.core.sample_log import consumed_per_epoch

    got = consumed_per_epoch(samples)
    assert sorted(got) == list(range(EPOCHS))
    for epoch, ids in got.items():
        duplicates = [i for i, n in Counter(ids).items() if n > 1]
        assert not duplicates, f"epoch {epoch}: samples trained twice: {duplicates[:20]}"
        assert sorted(ids) == sorted(got[0]), f"epoch {epoch}: samples skipped or extra"

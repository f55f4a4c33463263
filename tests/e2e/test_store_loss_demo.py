"""End to end on process-backed nodes: the demo job's rendezvous store is SIGKILLed (its pod force-deleted)
mid-training. The operator starts a fresh store pod at once, the agents wait for it and re-form the world
on it, and the job Succeeds with no failure counted and every sample trained exactly once per epoch."""

from __future__ import annotations

import copy
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from etj_testbed.demo.local import Demo
from etj_testbed.demo.scenario import Scenario
from etj_testbed.demo.script import Script
from etj_testbed.localcluster.toolchain import cache_root
from etj_trainer.core.sample_log import consumed_per_epoch

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 8


class StoreKill(Scenario):
    """In place of the demo's spot interruption: once training is at epoch 2, the store is killed."""

    killed: str | None = None
    killed_uid: str | None = None
    replacement_uid: str | None = None  # a store pod seen running after the kill

    def poll(self, demo: Demo, job: dict[str, Any]) -> None:
        progress = (job.get("status") or {}).get("progress") or {}
        if self.replacement_uid is None and (self.killed is not None or (progress.get("epoch") or 0) >= 2):
            sel = f"etj.dev/job={demo.name},etj.dev/role=rendezvous"
            pods = demo.kube.get(f"/api/v1/namespaces/{demo.ns}/pods", labelSelector=sel).get("items") or []
            running = [p["metadata"] for p in pods if (p.get("status") or {}).get("phase") == "Running"]
            if self.killed is not None:
                # A fresh store pod. Its name may be the killed one's: a force-deleted pod can be gone from
                # the API before the operator sees it fail, and then its name is free (seen in a clean clone).
                fresh = [m["uid"] for m in running if m["uid"] != self.killed_uid]
                self.replacement_uid = fresh[0] if fresh else None
            elif running:
                self.killed, self.killed_uid = running[0]["name"], running[0]["uid"]
                demo.kubectl("delete", "pod", self.killed, "-n", demo.ns, "--grace-period=0", "--force")
                demo.event(f"store killed: {self.killed}")


def test_the_job_survives_its_store(cluster: Any) -> None:
    manifest: dict[str, Any] = copy.deepcopy(
        yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    )
    manifest["spec"]["training"]["epochs"] = EPOCHS
    manifest["spec"]["trainer"]["env"].append({"name": "ETJ_MIN_STEP_SECONDS", "value": "0.2"})
    suffix = uuid.uuid4().hex[:5]
    run_dir = cache_root() / "e2e" / f"store-loss-{suffix}"  # kept for whoever debugs a failure
    scenario = StoreKill()
    demo = Demo(
        Path(cluster.kubeconfig),
        f"e2e-store-{suffix}",
        run_dir,
        manifest,
        Script(timeout_s=1200),
        f"e2estore{suffix}",
        scenario=scenario,
    )
    try:
        demo.start()
        result = demo.run()
        stores = demo.kube.get(
            f"/api/v1/namespaces/{demo.ns}/pods",
            labelSelector=f"etj.dev/job={demo.name},etj.dev/role=rendezvous",
        )
    finally:
        demo.cleanup(delete_job=True)
    status = result.status.get("status") or {}
    assert scenario.killed is not None, result.events
    assert result.phase == "Succeeded", (result.phase, status.get("conditions"), run_dir)
    assert not status.get("failures"), status  # the store's loss is not a worker failure
    assert scenario.replacement_uid is not None, result.events  # a fresh store pod ran
    assert scenario.killed_uid not in {p["metadata"]["uid"] for p in stores.get("items") or []}
    logs = "".join(p.read_text(errors="replace") for p in run_dir.glob("proclet/pods/*/*/trainer.log"))
    assert "rendezvous store back after" in logs, run_dir
    got = consumed_per_epoch(run_dir / "samples")
    assert sorted(got) == list(range(EPOCHS))
    for epoch, ids in got.items():
        assert not [i for i, n in Counter(ids).items() if n > 1], f"epoch {epoch}: samples trained twice"
        assert sorted(set(ids)) == list(range(1438)), f"epoch {epoch}: samples skipped"

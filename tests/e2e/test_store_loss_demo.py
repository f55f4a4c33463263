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
from etj_testbed.demo.script import Script
from etj_testbed.localcluster.toolchain import cache_root
from etj_trainer.core.sample_log import consumed_per_epoch

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 8


class StoreKillDemo(Demo):
    """The demo with its own interruption off; instead, once training is at epoch 2, the store is killed."""

    killed: str | None = None
    killed_uid: str | None = None
    replacement_uid: str | None = None  # a store pod seen running after the kill

    def job(self) -> dict[str, Any]:
        job = super().job()
        progress = (job.get("status") or {}).get("progress") or {}
        if self.replacement_uid is None and (self.killed is not None or (progress.get("epoch") or 0) >= 2):
            sel = f"etj.dev/job={self.name},etj.dev/role=rendezvous"
            pods = self.kube.get(f"/api/v1/namespaces/{self.ns}/pods", labelSelector=sel).get("items") or []
            running = [p["metadata"] for p in pods if (p.get("status") or {}).get("phase") == "Running"]
            if self.killed is not None:
                # A fresh store pod. Its name may be the killed one's: a force-deleted pod can be gone from
                # the API before the operator sees it fail, and then its name is free (seen in a clean clone).
                fresh = [m["uid"] for m in running if m["uid"] != self.killed_uid]
                self.replacement_uid = fresh[0] if fresh else None
            elif running:
                self.killed, self.killed_uid = running[0]["name"], running[0]["uid"]
                self.kubectl("delete", "pod", self.killed, "-n", self.ns, "--grace-period=0", "--force")
                self.event(f"store killed: {self.killed}")
        return job


def test_the_job_survives_its_store(cluster: Any) -> None:
    manifest: dict[str, Any] = copy.deepcopy(
        yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    )
    manifest["spec"]["training"]["epochs"] = EPOCHS
    manifest["spec"]["trainer"]["env"].append({"name": "ETJ_MIN_STEP_SECONDS", "value": "0.2"})
    suffix = uuid.uuid4().hex[:5]
    run_dir = cache_root() / "e2e" / f"store-loss-{suffix}"  # kept for whoever debugs a failure
    demo = StoreKillDemo(
        Path(cluster.kubeconfig),
        f"e2e-store-{suffix}",
        run_dir,
        manifest,
        Script(interrupt_epoch=10**6, timeout_s=1200),
        f"e2estore{suffix}",
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
    assert demo.killed is not None, result.events
    assert result.phase == "Succeeded", (result.phase, status.get("conditions"), run_dir)
    assert not status.get("failures"), status  # the store's loss is not a worker failure
    assert demo.replacement_uid is not None, result.events  # a fresh store pod ran
    assert demo.killed_uid not in {p["metadata"]["uid"] for p in stores.get("items") or []}
    logs = "".join(p.read_text(errors="replace") for p in run_dir.glob("proclet/pods/*/*/trainer.log"))
    assert "rendezvous store back after" in logs, run_dir
    got = consumed_per_epoch(run_dir / "samples")
    assert sorted(got) == list(range(EPOCHS))
    for epoch, ids in got.items():
        assert not [i for i, n in Counter(ids).items() if n > 1], f"epoch {epoch}: samples trained twice"
        assert sorted(set(ids)) == list(range(1438)), f"epoch {epoch}: samples skipped"

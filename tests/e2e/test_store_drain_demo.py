"""End to end on process-backed nodes: `kubectl drain` of the node the demo job's rendezvous store runs on,
mid-training, while every other node "pulls" images for PULL_S seconds (as a fresh node would). The store
moves (docs/operator.md, "Rendezvous store"), the drain completes, the job Succeeds with no failure counted
and every sample trained exactly once per epoch. The agents print how long their store was away
("rendezvous store back after N s"): this test prints those numbers, the measure of the move (make before
break keeps it near the agents' probe interval; break before make adds the new store pod's start)."""

from __future__ import annotations

import copy
import re
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from etj_testbed.demo.local import Demo
from etj_testbed.demo.scenario import Scenario
from etj_testbed.demo.script import Script
from etj_testbed.localcluster import toolchain
from etj_testbed.localcluster.proclet.nodes import PULL_SECONDS_ANNOTATION
from etj_testbed.localcluster.toolchain import cache_root
from etj_trainer.core.sample_log import consumed_per_epoch

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 6
PULL_S = 20
AWAY = re.compile(r"rendezvous store back after ([0-9.]+) s")


class StoreDrain(Scenario):
    """In place of the demo's spot interruption: once training is at epoch 2, the store's node is drained."""

    drained: str | None = None  # the store's node
    drain: subprocess.Popen[str] | None = None
    drain_started = 0.0
    drain_seconds: float | None = None

    def poll(self, demo: Demo, job: dict[str, Any]) -> None:
        progress = (job.get("status") or {}).get("progress") or {}
        if self.drain is None and (progress.get("epoch") or 0) >= 2:
            sel = f"etj.dev/job={demo.name},etj.dev/role=rendezvous"
            pods = demo.kube.get(f"/api/v1/namespaces/{demo.ns}/pods", labelSelector=sel).get("items") or []
            running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
            if running:
                self.drained = running[0]["spec"]["nodeName"]
                for node in demo.nodes:
                    if node != self.drained:
                        demo.kubectl(
                            "annotate", "node", node, f"{PULL_SECONDS_ANNOTATION}={PULL_S}", "--overwrite"
                        )
                cmd = [str(toolchain.binary("kubectl")), "--kubeconfig", str(demo.kubeconfig), "drain"]
                cmd += [self.drained, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=300s"]
                self.drain_started = time.monotonic()
                self.drain = subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
                demo.event(f"kubectl drain {self.drained} (the store's node)")
        if self.drain is not None and self.drain_seconds is None and self.drain.poll() is not None:
            self.drain_seconds = time.monotonic() - self.drain_started
            demo.event(
                f"drain of {self.drained} done ({self.drain.returncode}) in {self.drain_seconds:.1f} s"
            )


def test_a_drain_of_the_store_node_moves_the_store(cluster: Any) -> None:
    manifest: dict[str, Any] = copy.deepcopy(
        yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    )
    manifest["spec"]["training"]["epochs"] = EPOCHS
    # Long enough that training outlives the move (the replacement's 20 s pull, start and switch): with
    # 0.2 s steps a loaded machine finished the job before the switch, and no agent had a store to lose.
    manifest["spec"]["trainer"]["env"].append({"name": "ETJ_MIN_STEP_SECONDS", "value": "0.5"})
    suffix = uuid.uuid4().hex[:5]
    run_dir = cache_root() / "e2e" / f"store-drain-{suffix}"  # kept for whoever debugs a failure
    scenario = StoreDrain()
    demo = Demo(
        Path(cluster.kubeconfig),
        f"e2e-drain-{suffix}",
        run_dir,
        manifest,
        Script(timeout_s=1200),
        f"e2edrain{suffix}",
        scenario=scenario,
    )
    try:
        demo.start()
        result = demo.run()
        if scenario.drain is not None:
            scenario.drain.wait(60)
    finally:
        if scenario.drain is not None and scenario.drain.poll() is None:
            scenario.drain.kill()
        demo.cleanup(delete_job=True)
    status = result.status.get("status") or {}
    assert scenario.drain is not None, result.events
    output = scenario.drain.stdout.read() if scenario.drain.stdout else ""
    print("drain:", scenario.drain.returncode, f"{scenario.drain_seconds} s", output[-1500:])
    assert scenario.drain.returncode == 0, output
    assert result.phase == "Succeeded", (result.phase, status.get("conditions"), run_dir)
    assert not status.get("failures"), status  # the store's move is not a worker failure
    logs = "".join(p.read_text(errors="replace") for p in run_dir.glob("proclet/pods/*/*/trainer.log"))
    away = sorted(float(s) for s in AWAY.findall(logs))
    print("store away (s), per agent:", away, "run dir:", run_dir)
    assert away, run_dir  # the agents lost the old store and found the new one
    got = consumed_per_epoch(run_dir / "samples")
    assert sorted(got) == list(range(EPOCHS))
    for epoch, ids in got.items():
        assert not [i for i, n in Counter(ids).items() if n > 1], f"epoch {epoch}: samples trained twice"
        assert sorted(set(ids)) == list(range(1438)), f"epoch {epoch}: samples skipped"

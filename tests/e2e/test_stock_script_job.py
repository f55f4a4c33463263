"""End to end: a stock torchrun script as an ElasticTrainingJob on the local bed (issue 47, rung 0).

The script is tests/trainer/stock_ddp/multinode.py, written as pytorch/examples' DDP tutorial is (its own
init_process_group, a sibling module, a DistributedSampler, a snapshot file), run unchanged under
``spec.trainer.launcher: Torchrun`` by the real operator on process-backed nodes. A spot interruption takes
a worker (a leave), a node vanishes (a kill) and spot capacity comes back (a join); after each, every
worker restarts and the script resumes from its own snapshot, and the job succeeds. The status says the
job resizes by restart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from etj_testbed.demo.local import Demo
from etj_testbed.demo.scenario import Scenario
from etj_testbed.demo.script import JSON, Script
from tests.e2e.e2econfig import E2EConfig, demo_job

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

CONFIG = E2EConfig.from_env()
SCRIPT = Path(__file__).resolve().parents[1] / "trainer" / "stock_ddp" / "multinode.py"
EPOCHS = 30


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class LeaveKillJoin(Scenario):
    """Three nodes (one on-demand, two spot) for three workers; each step once the world before it has
    trained two epochs (read from the script's own record, since a stock script reports no progress)."""

    def __init__(self, record: Path) -> None:
        self.record, self.stage, self.mark, self.victim = record, "leave", 0, ""

    def start(self, demo: Demo) -> None:
        for name, capacity_type in (("od-1", "on-demand"), ("spot-1", "spot"), ("spot-2", "spot")):
            demo.add_node(f"{demo.instance}-{name}", capacity_type)

    def _trained(self, world: int) -> bool:
        rows = _records(self.record)[self.mark :]
        return sum(1 for r in rows if r["event"] == "epoch" and r["world"] == world and r["rank"] == 0) >= 2

    def poll(self, demo: Demo, job: JSON) -> None:
        if self.stage == "leave" and self._trained(3):
            self.victim = sorted(demo.spot_worker_nodes())[-1]
            demo.interrupt(self.victim)
            demo.event(f"spot interruption notice on {self.victim}")
            self.stage, self.mark = "drain", len(_records(self.record))
        elif self.stage == "drain" and self.victim not in demo.worker_nodes().values():
            demo.end_of_notice(self.victim, drained=True)
            self.stage = "kill"
        elif self.stage == "kill" and self._trained(2):
            self.victim = sorted(demo.spot_worker_nodes())[0]
            demo.remove_node(self.victim)
            demo.event(f"{self.victim} lost without notice")
            self.stage, self.mark = "join", len(_records(self.record))
        elif self.stage == "join" and self._trained(1):
            demo.return_capacity(self.victim, 3)
            self.stage, self.mark = "done", len(_records(self.record))


def _manifest(record: Path, snapshot: Path) -> dict[str, Any]:
    job = demo_job()
    spec = job["spec"]
    spec["trainer"]["launcher"] = "Torchrun"
    spec["trainer"]["args"] = [
        "--script", str(SCRIPT), str(EPOCHS), "1", "--batch_size", "16",
        "--snapshot", str(snapshot), "--record", str(record), "--batch-seconds", "0.1",
    ]  # fmt: skip
    spec["replicas"] = {"min": 1, "max": 3}
    spec["failurePolicy"] = {"maxFailures": 5}  # the lost node's worker is one
    return job


def test_a_stock_torchrun_script_runs_as_a_job_through_a_leave_a_kill_and_a_join(kubeconfig: Path) -> None:
    if CONFIG.installed:
        pytest.skip("the script's record and snapshot are paths on this machine: local bed only")
    run_dir = CONFIG.run_root() / "stock"
    run_dir.mkdir(parents=True, exist_ok=True)
    record, snapshot = run_dir / "record.jsonl", run_dir / "snapshot.pt"
    scenario = LeaveKillJoin(record)
    demo = CONFIG.demo(
        kubeconfig, "e2e-stock", run_dir, _manifest(record, snapshot), Script(timeout_s=900), "e2estock"
    )
    demo.scenario = scenario
    try:
        demo.start()
        result = demo.run()
    finally:
        demo.cleanup(delete_job=True)
    status = result.status.get("status") or {}
    assert result.phase == "Succeeded", (run_dir, status.get("conditions"))
    assert status.get("resizeMode") == "Restart", status
    assert scenario.stage == "done", scenario.stage
    rows = _records(record)
    starts = [r for r in rows if r["event"] == "start" and r["rank"] == 0]
    assert [r["world"] for r in starts][:3] == [3, 2, 1] and starts[-1]["world"] >= 2, starts
    assert starts[0]["resumed"] is None and all(r["resumed"] is not None for r in starts[1:]), starts
    for r in (r for r in rows if r["event"] == "start"):
        assert r["env"]["WORLD_SIZE"] == str(r["world"]) and int(r["env"]["RANK"]) == r["rank"], r
    assert max(r["epoch"] for r in rows if r["event"] == "epoch") == EPOCHS - 1

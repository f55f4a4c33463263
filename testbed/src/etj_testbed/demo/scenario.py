"""What happens to the demo's machines: the strategy object `Demo` calls at its few explicit points.

`Demo` (local.py) owns the mechanics: the harness, the operator, the job, the poll loop and the clean-up.
What it does to the nodes is a `Scenario`'s: which nodes it starts with, what it does on each poll of the
job, what more it submits, what it cleans up. `SpotInterruption` is `etj demo`'s own script; bench/chaos.py,
bench/spot_replay.py and the e2e store tests pass their own `Scenario` instead of overriding `Demo`'s
methods, so a reader of `Demo.run` sees every call a bench makes, in order, in one place.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from etj_testbed.demo.script import JSON, SPOT_ITN

if TYPE_CHECKING:  # only for the annotations: local.py imports this module
    from etj_testbed.demo.local import Demo

# The demo's own nodes: two on-demand and two spot, one GPU each.
DEMO_NODES = (("od-1", "on-demand"), ("od-2", "on-demand"), ("spot-1", "spot"), ("spot-2", "spot"))


class Scenario:
    """The hooks, each a no-op but `start` (the demo's four nodes); a scenario overrides what it changes."""

    def operator_args(self, demo: Demo) -> tuple[str, ...]:
        """Extra `etj operator run` flags (the spot replay's deadline arm: the policy's bed-sized costs)."""
        return ()

    def start(self, demo: Demo) -> None:
        """The nodes, once the harness and the operator run."""
        for name, capacity_type in DEMO_NODES:
            demo.add_node(f"{demo.instance}-{name}", capacity_type)

    def node_added(self, demo: Demo, name: str, capacity_type: str) -> None:
        """A node was created (by `start`, the scenario itself or anyone else through `Demo.add_node`)."""

    def submitted(self, demo: Demo) -> None:
        """The job is submitted; a scenario may submit more (the chaos bench's bad-data job)."""

    def poll(self, demo: Demo, job: JSON) -> None:
        """Once a second, right after `Demo.run` reads the job and before it records a sample of it."""

    def cleanup(self, demo: Demo) -> None:
        """Before `Demo.cleanup` stops the operator and the harness: what the scenario started."""


class SpotInterruption(Scenario):
    """`etj demo`'s script: at the script's epoch and world, a spot node with a worker gets the
    interruption notice; it goes once drained (or the notice ends); later a new spot node arrives."""

    def __init__(self) -> None:
        self.stage, self.victim, self.stage_at, self.spare = "train", "", 0.0, 3

    def poll(self, demo: Demo, job: JSON) -> None:
        status = job.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        script = demo.script
        epoch = (status.get("progress") or {}).get("epoch") or 0
        world = status.get("worldSize") or 0
        # Interrupt at full size; if full size never comes, a epoch later anyway.
        due = epoch >= script.interrupt_epoch and (
            world >= script.interrupt_min_world or epoch > script.interrupt_epoch
        )
        if self.stage == "train" and due:
            spot = demo.spot_worker_nodes()
            if spot:
                self.victim = sorted(spot)[0]
                demo.interrupt(self.victim)
                self.stage, self.stage_at = "notice", time.monotonic()
                demo.event(f"spot interruption notice on {self.victim} (taint {SPOT_ITN}:NoSchedule, cordon)")
        elif self.stage == "notice":
            drained = self.victim not in demo.worker_nodes().values()
            if drained or time.monotonic() - self.stage_at > script.notice_s:
                demo.end_of_notice(self.victim, drained)
                self.stage, self.stage_at = "gone", time.monotonic()
        elif self.stage == "gone" and time.monotonic() - self.stage_at > script.return_after_s:
            demo.return_capacity(self.victim, self.spare)
            self.stage = "returned"

"""The demo is extended by composition: a `Scenario` (etj_testbed/demo/scenario.py) at `Demo`'s few explicit
points, not a subclass overriding its methods. No cluster: `SpotInterruption` runs against a stand-in demo,
and the rule itself is checked on the source of bench/ and tests/."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from etj_testbed.demo.scenario import DEMO_NODES, Scenario, SpotInterruption
from etj_testbed.demo.script import Script

REPO = Path(__file__).resolve().parents[2]


class FakeDemo:
    """What a scenario calls on `Demo`, recorded."""

    def __init__(self, script: Script) -> None:
        self.script, self.instance = script, "t"
        self.calls: list[tuple[str, ...]] = []
        self.workers = {"w0": "t-od-1", "w1": "t-spot-1", "w2": "t-spot-2"}

    def add_node(self, name: str, capacity_type: str, gpus: int = 1) -> None:
        self.calls.append(("add_node", name, capacity_type))

    def spot_worker_nodes(self) -> list[str]:
        return [n for n in self.workers.values() if n.startswith("t-spot")]

    def worker_nodes(self) -> dict[str, str]:
        return dict(self.workers)

    def interrupt(self, node: str) -> None:
        self.calls.append(("interrupt", node))

    def end_of_notice(self, victim: str, drained: bool) -> None:
        self.calls.append(("end_of_notice", victim, str(drained)))

    def return_capacity(self, victim: str, serial: int) -> None:
        self.calls.append(("return_capacity", victim, str(serial)))

    def event(self, what: str) -> None:
        pass


def _job(epoch: int, world: int, phase: str = "Running") -> dict[str, Any]:
    return {"status": {"phase": phase, "worldSize": world, "progress": {"epoch": epoch}}}


def test_the_default_scenario_starts_the_four_demo_nodes() -> None:
    demo = FakeDemo(Script())
    Scenario().start(demo)  # type: ignore[arg-type]
    assert demo.calls == [("add_node", f"t-{name}", ctype) for name, ctype in DEMO_NODES]


def test_spot_interruption_follows_the_script() -> None:
    demo = FakeDemo(Script(interrupt_epoch=1, interrupt_min_world=4, notice_s=120.0, return_after_s=0.0))
    spot = SpotInterruption()
    spot.poll(demo, _job(epoch=0, world=4))  # type: ignore[arg-type]
    spot.poll(demo, _job(epoch=1, world=3))  # type: ignore[arg-type]
    assert demo.calls == []  # not yet: before the epoch, then below full size
    spot.poll(demo, _job(epoch=1, world=4))  # type: ignore[arg-type]
    assert demo.calls == [("interrupt", "t-spot-1")]  # the first spot node with a worker
    spot.poll(demo, _job(epoch=1, world=4))  # type: ignore[arg-type]
    assert demo.calls[-1] == ("interrupt", "t-spot-1")  # its worker is still there: the notice runs
    del demo.workers["w1"]
    spot.poll(demo, _job(epoch=1, world=3))  # type: ignore[arg-type]
    assert demo.calls[-1] == ("end_of_notice", "t-spot-1", "True")
    spot.poll(demo, _job(epoch=1, world=3))  # type: ignore[arg-type]
    assert demo.calls[-1] == ("return_capacity", "t-spot-1", "3")
    spot.poll(demo, _job(epoch=2, world=4))  # type: ignore[arg-type]
    assert len(demo.calls) == 3  # once only


def test_a_finished_job_is_not_interrupted() -> None:
    demo = FakeDemo(Script(interrupt_epoch=0, interrupt_min_world=1))
    SpotInterruption().poll(demo, _job(epoch=5, world=4, phase="Succeeded"))  # type: ignore[arg-type]
    assert demo.calls == []


def test_nothing_outside_the_demo_package_subclasses_demo() -> None:
    """bench/ and tests/ pass a Scenario; a subclass overriding Demo's methods sends a reader of
    `Demo.run` back and forth between files."""
    found = []
    for root in (REPO / "bench", REPO / "tests"):
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                    if bases & {"Demo", "ClusterDemo"}:
                        found.append(f"{path.relative_to(REPO)}: {node.name}")
    assert found == [], f"pass a Scenario (etj_testbed/demo/scenario.py) instead: {found}"

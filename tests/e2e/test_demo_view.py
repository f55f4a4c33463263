"""The demo's view and timeline from a recorded status (no cluster needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from etj_testbed.demo.script import DemoResult
from etj_testbed.demo.view import describe_resize, logged_accuracy, view_rows, world_line, write_timeline

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def _result(tmp_path: Path) -> DemoResult:
    status = {
        "phase": "Running",
        "workers": "3/4",
        "worldSize": 3,
        "progress": {"epoch": 1, "step": 40, "samplesPerSecond": 97.5, "loss": 0.25},
        "resizeHistory": [
            {"time": "2027-01-15T08:00:02Z", "from": 0, "to": 4, "reason": "CapacityAdded"},
            {
                "time": "2027-01-15T08:00:30Z",
                "from": 4,
                "to": 3,
                "reason": "SpotInterruption",
                "pauseSeconds": 12.5,
            },
        ],
    }
    samples = [
        {
            "t": float(t),
            "world": 4 if t < 30 else 3,
            "sps": 100.0 - t,
            "loss": 2.0 / (t + 1),
            "epoch": 0,
            "step": t,
        }
        for t in range(0, 60, 5)
    ]
    return DemoResult(
        status={"metadata": {"name": "demo"}, "status": status},
        samples=samples,
        events=[(25.0, "spot interruption notice on demo-spot-1")],
        run_dir=tmp_path,
        t0=T0,
    )


def test_view_rows_show_progress_and_the_last_resize(tmp_path: Path) -> None:
    rows = dict(view_rows(_result(tmp_path).status))
    assert rows["world size (ranks)"] == "3" and rows["samples/s"] == "97.5" and rows["loss"] == "0.2500"
    assert rows["last resize"] == "4→3 SpotInterruption: paused 12500 ms"
    assert dict(view_rows({}))["phase"] == "-"


def test_timeline_png_is_written(tmp_path: Path) -> None:
    path = write_timeline(_result(tmp_path), tmp_path / "out" / "timeline.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_accuracy_is_read_from_the_rank0_result_line(tmp_path: Path) -> None:
    log = tmp_path / "proclet" / "pods" / "ns" / "demo-worker-0-abc" / "trainer.log"
    log.parent.mkdir(parents=True)
    log.write_text('noise\nETJ_RESULT {"step": 9, "accuracy": 0.975}\n')
    assert logged_accuracy(tmp_path) == 0.975
    assert logged_accuracy(tmp_path / "nothing") is None


def test_the_demo_writes_no_tracked_file_by_default() -> None:
    # regression: `make demo` rewrote docs/demo-timeline.png, leaving `git status` dirty
    from etj_testbed.demo.main import parse_args

    assert parse_args([]).timeline is None  # the run directory's timeline.png
    assert parse_args(["--timeline", "docs/demo-timeline.png"]).timeline is not None


RESIZES = [
    (
        {"from": 4, "to": 2, "reason": "SpotInterruption", "pauseSeconds": 0.24},
        "4→2 SpotInterruption: paused 240 ms",
    ),
    (
        {"from": 2, "to": 4, "reason": "CapacityAdded", "pauseSeconds": 0.42, "stepsLost": 3},
        "2→4 CapacityAdded: paused 420 ms, 3 steps lost",
    ),
    (
        {"from": 2, "to": 3, "reason": "CapacityAdded", "unmeasuredReason": "NotJoinedBeforeEnd"},
        "2→3 CapacityAdded: pods started, the job finished before they joined",
    ),
    ({"from": 2, "to": 3, "reason": "CapacityAdded"}, "2→3 CapacityAdded: pods only, not joined (yet)"),
]


@pytest.mark.parametrize(("resize", "words"), RESIZES, ids=[w for _, w in RESIZES])
def test_a_resize_says_its_pause_in_milliseconds_or_why_it_has_none(
    resize: dict[str, Any], words: str
) -> None:
    """Issue 38: "paused 0 s" for pauses of 240 and 420 ms, and "pause None s" for pods that never joined."""
    assert describe_resize(resize) == words


def test_the_world_size_line_moves_at_the_trainers_resize_times_not_the_polls(tmp_path: Path) -> None:
    result = _result(tmp_path)
    # The polls (every 5 s) saw the world change at t=30; the trainer's record of it says t=27.
    result.status["status"]["resizeHistory"][1]["time"] = "2027-01-15T08:00:27Z"
    assert world_line(result) == [(0.0, 4), (27.0, 3), (55.0, 3)]
    # Unmeasured entries (pods only) do not move the world.
    result.status["status"]["resizeHistory"].append(
        {"time": "2027-01-15T08:00:40Z", "from": 3, "to": 4, "reason": "CapacityAdded"}
    )
    assert world_line(result) == [(0.0, 4), (27.0, 3), (55.0, 3)]

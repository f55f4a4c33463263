"""The demo's view and timeline from a recorded status (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

from etj_testbed.demo.script import DemoResult
from etj_testbed.demo.view import logged_accuracy, view_rows, write_timeline

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
    assert rows["last resize"] == "4→3 SpotInterruption pause 12.5s"
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

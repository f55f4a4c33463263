"""What `etj demo` shows: the live status view, the timeline PNG, and the accuracy from the pod logs."""

from __future__ import annotations

import contextlib
import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from etj_testbed.demo.script import DemoResult

JSON = dict[str, Any]


class Live:
    """A one-screen view of the job's status (rich when on a terminal, a line every few seconds otherwise)."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console()
        self._live: Any = None
        self._last_line = 0.0

    def __enter__(self) -> Live:
        if self.console.is_terminal:
            from rich.live import Live as RichLive

            self._live = RichLive(console=self.console, refresh_per_second=2)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def update(self, job: JSON, events: list[tuple[float, str]]) -> None:
        rows = view_rows(job)
        if self._live is not None:
            from rich.table import Table

            table = Table(
                title=f"ElasticTrainingJob {job.get('metadata', {}).get('name', '')}", show_header=False
            )
            for key, value in rows:
                table.add_row(key, value)
            for t, what in events[-4:]:
                table.add_row(f"{t:6.0f}s", what)
            self._live.update(table)
        elif time.monotonic() - self._last_line > 5:
            self._last_line = time.monotonic()
            print("  ".join(f"{k}={v}" for k, v in rows), flush=True)


def view_rows(job: JSON) -> list[tuple[str, str]]:
    status = job.get("status") or {}
    progress = status.get("progress") or {}
    resizes = status.get("resizeHistory") or []
    last = resizes[-1] if resizes else None

    def fmt(value: Any, spec: str = "") -> str:
        return "-" if value is None else format(value, spec)

    resize = describe_resize(last) if last else "-"

    return [
        ("phase", fmt(status.get("phase"))),
        ("workers", fmt(status.get("workers"))),
        ("world size (ranks)", fmt(status.get("worldSize"))),
        ("epoch", fmt(progress.get("epoch"))),
        ("step", fmt(progress.get("step"))),
        ("samples/s", fmt(progress.get("samplesPerSecond"), ".1f")),
        ("loss", fmt(progress.get("loss"), ".4f")),
        ("last resize", resize),
    ]


# status.resizeHistory[].unmeasuredReason, in words.
UNMEASURED = {"NotJoinedBeforeEnd": "pods started, the job finished before they joined"}


def pause_ms(seconds: float) -> str:
    """A pause in milliseconds: in-place resizes take well under a second ("paused 0 s" hid 240 ms)."""
    return f"{seconds * 1000:.0f} ms"


def describe_resize(r: JSON) -> str:
    """One resize as a user reads it: the change, why, and what it cost or why that was not measured."""
    head = f"{r.get('from')}→{r.get('to')} {r.get('reason', '')}"
    if r.get("pauseSeconds") is not None:
        lost = r.get("stepsLost")
        return f"{head}: paused {pause_ms(r['pauseSeconds'])}" + (f", {lost} steps lost" if lost else "")
    why = r.get("unmeasuredReason")
    return f"{head}: {UNMEASURED.get(why, why)}" if why else f"{head}: pods only, not joined (yet)"


def world_line(result: DemoResult) -> list[tuple[float, int]]:
    """World size (ranks) against time from the trainer's measured resizes, at their own times.

    Status polls come every few seconds, so a line drawn from them drops about 3 s after the interruption
    and rises 3 s after the join (issue 38). The polls give only the first world and the end of the line.
    """
    status = result.status.get("status") or {}
    first = next(((s["t"], s["world"]) for s in result.samples if s.get("world")), None)
    if first is None:
        return []
    spec = result.status.get("spec") or {}
    ranks = int((spec.get("trainer") or {}).get("procsPerWorker") or 1)
    points = [first]
    for r in status.get("resizeHistory") or []:
        when = _seconds(r.get("time"), result.t0)
        if r.get("pauseSeconds") is None or when is None or when <= first[0] or not r.get("to"):
            continue
        points.append((when, int(r["to"]) * ranks))
    points.sort()
    return [*points, (result.samples[-1]["t"], points[-1][1])]


def write_timeline(result: DemoResult, path: Path) -> Path:
    """World size, samples/s and loss against time, with resizes and the demo's actions marked."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    samples = result.samples
    t = [s["t"] for s in samples]
    fig, axes = plt.subplots(3, 1, sharex=True, figsize=(10, 7))
    series = (("world size", "world", "steps-post"), ("samples/s", "sps", None), ("loss", "loss", None))
    for ax, (label, key, draw) in zip(axes, series, strict=True):
        points = [(x, s[key]) for x, s in zip(t, samples, strict=True) if s[key] is not None]
        if key == "world":
            points = world_line(result) or points
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, drawstyle=draw or "default")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    for resize in (result.status.get("status") or {}).get("resizeHistory") or []:
        when = _seconds(resize.get("time"), result.t0)
        if when is None or not resize.get("from") or not resize.get("to"):
            continue  # the start-up ramp (0→n) and the finish (n→0) are not resizes worth marking
        for ax in axes:
            ax.axvline(
                when,
                color="tab:red" if resize.get("to", 0) < resize.get("from", 0) else "tab:green",
                linestyle="--",
                alpha=0.7,
            )
        axes[0].annotate(
            describe_resize(resize),
            (when, 0.03),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=6,
            va="bottom",
            xytext=(2, 0),
            textcoords="offset points",
        )
    for when, what in result.events:
        axes[-1].axvline(when, color="grey", linestyle=":", alpha=0.6)
        axes[-1].annotate(
            what[:40], (when, 0.95), xycoords=("data", "axes fraction"), rotation=90, fontsize=6, va="top"
        )
    axes[-1].set_xlabel("seconds since submission")
    fig.suptitle("etj demo: spot interruption and return")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def logged_accuracy(run_dir: Path) -> float | None:
    """The accuracy in the trainer's `ETJ_RESULT {...}` line, from the process-node pod logs."""
    for log in sorted((run_dir / "proclet" / "pods").glob("*/*/*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("ETJ_RESULT "):
                with contextlib.suppress(ValueError):
                    value = json.loads(line.split(" ", 1)[1]).get("accuracy")
                    if value is not None:
                        return float(value)
    return None


def _seconds(stamp: str | None, t0: float) -> float | None:
    if not stamp:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - t0
    return None

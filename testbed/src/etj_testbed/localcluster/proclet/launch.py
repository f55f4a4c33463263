"""The harness as its own process: `start_subprocess` (the demo's way) and `main`
(``python -m etj_testbed.localcluster.proclet``)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from etj_testbed.localcluster.proclet.harness import DEFAULT_SELECTOR, Proclet


def start_subprocess(
    kubeconfig: str | os.PathLike[str],
    root: Path | None = None,
    selector: str = DEFAULT_SELECTOR,
    log_file: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start the harness as its own process (what the demo does); SIGTERM stops it cleanly."""
    argv = [
        sys.executable,
        "-m",
        "etj_testbed.localcluster.proclet",
        "--kubeconfig",
        str(kubeconfig),
        "--selector",
        selector,
    ]
    if root is not None:
        argv += ["--root", str(root)]
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115 - child owns it
    try:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        if log_file:
            out.close()  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m etj_testbed.localcluster.proclet",
        description="run pods bound to process-backed nodes as local processes",
    )
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--root", type=Path, default=None, help="pod logs and scratch dirs")
    parser.add_argument("--selector", default=DEFAULT_SELECTOR, help="label selector of the nodes to run")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(threadName)s: %(message)s",
    )
    harness = Proclet(args.kubeconfig, args.root, args.selector)

    def on_signal(signum: int, _frame: object) -> None:
        harness._stopped.set()  # run_forever's loop ends and stop() kills every pod process

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    harness.run_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

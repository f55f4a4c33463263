"""The agent's forkserver survives a SIGTERM to the pod's process group (regression found by make demo).

Runs in a subprocess: the forkserver is a per-process singleton and must not leak into pytest.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, signal, time
    from multiprocessing import forkserver
    from etj_trainer.agent import BASE_PRELOAD, _noop

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([m for m in BASE_PRELOAD if m.startswith("etj_trainer._")])
    p = ctx.Process(target=_noop); p.start(); p.join()
    server = forkserver._forkserver._forkserver_pid
    os.kill(server, signal.SIGTERM)
    time.sleep(0.5)
    os.kill(server, 0)  # still alive, or ProcessLookupError
    q = ctx.Process(target=_noop); q.start(); q.join(30)
    print("exit", p.exitcode, q.exitcode, "same server", forkserver._forkserver._forkserver_pid == server)
    """
)


def test_forkserver_ignores_sigterm_and_keeps_forking() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exit 0 0 same server True"

"""The agent's forkserver survives a SIGTERM to the pod's process group (regression found by make demo).

Runs in a subprocess: the forkserver is a per-process singleton and must not leak into pytest.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, signal
    from multiprocessing import forkserver
    from etj_trainer.agent.worker import BASE_PRELOAD, _noop

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([m for m in BASE_PRELOAD if m.startswith("etj_trainer.agent._")])
    p = ctx.Process(target=_noop); p.start(); p.join()
    server = forkserver._forkserver._forkserver_pid
    # The kernel's own record, not a wait: an ignored signal is discarded when it is sent, while a sleep
    # after the kill only shows the server had not died *yet* (a loaded machine made that a coin toss).
    with open(f"/proc/{server}/status") as f:
        ignored = int(next(l for l in f if l.startswith("SigIgn:")).split()[1], 16)
    assert ignored & (1 << (signal.SIGTERM - 1)), "the forkserver does not ignore SIGTERM"
    os.kill(server, signal.SIGTERM)
    q = ctx.Process(target=_noop); q.start(); q.join(30)
    os.kill(server, 0)  # still alive, or ProcessLookupError
    print("exit", p.exitcode, q.exitcode, "same server", forkserver._forkserver._forkserver_pid == server)
    """
)


def test_forkserver_ignores_sigterm_and_keeps_forking() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exit 0 0 same server True"


PRELOAD_SCRIPT = textwrap.dedent(
    """
    import multiprocessing, sys
    from etj_trainer.agent.worker import preload_modules

    def child():
        before = set(sys.modules)
        import torch
        from etj_trainer.data.sources import open_source
        torch.use_deterministic_algorithms(True, warn_only=True)  # what train() does first
        open_source("digits-tensor", "train", 32, torch.float32)
        new = sorted(m for m in set(sys.modules) - before if m.startswith(("torch", "nvidia")))
        print("late imports:", new[:5], flush=True)

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(preload_modules({"ETJ_DATA": "digits-tensor"}))
        p = ctx.Process(target=child); p.start(); p.join()
    """
)


def test_forkserver_preload_covers_a_workers_start(tmp_path: Path) -> None:
    # regression: torch.use_deterministic_algorithms imports torch._inductor/_dynamo (1.7-5 s per restart)
    script = tmp_path / "probe.py"
    script.write_text(PRELOAD_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "late imports: []" in out.stdout, out.stdout


ORPHAN_SCRIPT = textwrap.dedent(
    """
    import subprocess, sys, time
    # The "agent": starts a "worker" that asks to die with it, prints the worker's pid, then waits. The
    # worker shares its stdout and says "armed" once the request is in place.
    code = "from etj_trainer.agent.lifetime import die_with_parent; die_with_parent(); "
    code += "print('armed', flush=True); "
    code += "import time; time.sleep(600)"
    worker = subprocess.Popen([sys.executable, "-c", code])
    print(worker.pid, flush=True)
    time.sleep(600)
    """
)


def test_a_worker_dies_with_its_parent() -> None:
    # regression (issue 14): a SIGKILLed agent left its worker training on as a full rank
    import signal
    import time

    agent = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None
        worker = int(agent.stdout.readline())
        assert agent.stdout.readline().strip() == "armed"
        agent.send_signal(signal.SIGKILL)  # the way an OOM killer would
        agent.wait(30)
        deadline = time.monotonic() + 60
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker), "the worker outlived its agent"
    finally:
        if agent.poll() is None:
            agent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


FORKSERVER_AGENT = textwrap.dedent(
    """
    import multiprocessing, os, sys, time
    sys.path.insert(0, sys.argv[1])
    from etj_trainer.agent.worker import start_forkserver
    from fsworker import work

    start_forkserver(os.environ).join()  # the agent's own start-up: forkserver spawned, preload imported
    from multiprocessing import forkserver
    r, w = multiprocessing.Pipe(duplex=False)
    p = multiprocessing.get_context("forkserver").Process(target=work, args=(w,)); p.start()
    print(forkserver._forkserver._forkserver_pid, r.recv(), flush=True)
    time.sleep(600)
    """
)
FSWORKER = textwrap.dedent(
    """
    import os, time
    from etj_trainer.agent.lifetime import die_with_parent

    def work(conn):  # what agent.worker_entry does first
        die_with_parent()
        conn.send(os.getpid())
        time.sleep(600)
    """
)


def test_a_sigkilled_agent_takes_its_forkserver_and_workers_along(tmp_path: Path) -> None:
    # regression (issue 14): every forkserver child holds a copy of the forkserver's "alive" pipe, so the
    # forkserver never saw its SIGKILLed agent go and its workers trained on as full ranks
    import signal
    import time

    (tmp_path / "fsworker.py").write_text(FSWORKER)
    agent = subprocess.Popen(
        [sys.executable, "-c", FORKSERVER_AGENT, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert agent.stdout is not None
        server, worker = map(int, agent.stdout.readline().split())
        agent.send_signal(signal.SIGKILL)
        agent.wait(30)
        deadline = time.monotonic() + 60
        while (_alive(server) or _alive(worker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server), "the forkserver outlived its agent"
        assert not _alive(worker), "the worker outlived its agent"
    finally:
        if agent.poll() is None:
            agent.kill()

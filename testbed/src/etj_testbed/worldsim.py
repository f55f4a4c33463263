"""Run the real trainer in N local processes (over loopback) without an elastic agent.

Used by the equivalence tests and benchmarks to run "segments" at different world sizes that hand over
through checkpoints, exactly like a restart-based resize does, but deterministically and without
rendezvous timing. ``leave_at`` makes ranks leave gracefully at a given step instead (the in-process
resize of regroup.py), ``kill_at`` SIGKILLs ranks inside a given step (the in-place crash recovery of
recover.py): the survivors re-form the world on a TCPStore this function hosts.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from etj_trainer.classifier.trainer import StopFlag
from etj_trainer.config import TrainConfig
from etj_trainer.core.stopping import StopCode


class _AtStep(StopFlag):
    """Acts when step ``step``'s stop code is read (once a step: after its backward, before the commit)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self._at = step
        self._reads = 0

    @property
    def code(self) -> StopCode:
        self._reads += 1
        return self.act() if self._reads >= self._at else StopCode.RUN

    @code.setter
    def code(self, value: StopCode) -> None:  # StopFlag.__init__ assigns it
        pass

    def act(self) -> StopCode:
        raise NotImplementedError


class LeaveAtStep(_AtStep):
    """Behaves as if SIGTERM (pod leaving) arrived during the step."""

    def act(self) -> StopCode:
        self.requested = True
        return StopCode.LEAVING


class KillAtStep(_AtStep):
    """SIGKILLs this process inside the step (a crash: no exit path runs)."""

    def act(self) -> StopCode:
        os.kill(os.getpid(), signal.SIGKILL)
        return StopCode.RUN


def _rank_main(
    rank: int,
    world: int,
    init_file: str,
    cfg: TrainConfig,
    out_dir: str,
    leave_at: dict[int, int],
    store: str,
    kill_at: dict[int, int],
) -> None:
    from etj_trainer.classifier.trainer import train
    from etj_trainer.resize import group_sockets

    os.environ["LOCAL_RANK"] = str(rank)
    if store:
        os.environ["ETJ_RDZV_ENDPOINT"] = store
        os.environ["ETJ_AGENT_STATE_FILE"] = str(Path(out_dir, "agent.state"))  # never "restarting"
    group_sockets.init(init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        stop: StopFlag | None = None
        if rank in leave_at:
            stop = LeaveAtStep(leave_at[rank])
        elif rank in kill_at:
            stop = KillAtStep(kill_at[rank])
        result = train(cfg, stop)
        Path(out_dir, f"rank{rank}.done").write_text(f"{result.step} {result.loss} {result.world_size}\n")
    finally:
        dist.destroy_process_group()
    # The rank's result is its done file, written above. Leave without the interpreter's teardown: once, on
    # a loaded CI machine, a rank that had trained to the end aborted there ("terminate called without an
    # active exception", a C++ thread object destroyed while still joinable: torch 2.14 keeps a reference
    # to the gloo group past destroy_process_group, see resize/group_sockets.py) and failed the reference run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_world(
    cfg: TrainConfig,
    world_size: int,
    leave_at: dict[int, int] | None = None,
    kill_at: dict[int, int] | None = None,
) -> list[str]:
    """Train with ``world_size`` ranks until ``cfg.max_steps``/``cfg.epochs``; raises if any rank fails.

    Returns each rank's "step loss final-world-size" line ("killed" for a rank of ``kill_at``).
    """
    leave_at, kill_at = leave_at or {}, kill_at or {}
    with tempfile.TemporaryDirectory() as tmp:
        init_file = str(Path(tmp) / "init")
        resizes = bool(leave_at or kill_at)
        host = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False) if resizes else None
        endpoint = f"127.0.0.1:{host.port}" if host is not None else ""
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(
                target=_rank_main,
                args=(r, world_size, init_file, replace(cfg), tmp, leave_at, endpoint, kill_at),
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        for p in procs:  # every rank to its end (mp.spawn would kill the others when the first one dies)
            p.join()
        killed = {r for r, p in enumerate(procs) if r in kill_at and p.exitcode == -signal.SIGKILL}
        failed = [r for r, p in enumerate(procs) if r not in killed and p.exitcode != 0]
        missing = [
            r for r in range(world_size) if r not in killed and not Path(tmp, f"rank{r}.done").exists()
        ]
        if failed or missing:
            codes = {r: p.exitcode for r, p in enumerate(procs)}
            raise RuntimeError(
                f"ranks {sorted(set(failed) | set(missing))} did not finish "
                f"(exit codes {codes}, no done file from {missing})"
            )
        return [
            "killed" if r in killed else Path(tmp, f"rank{r}.done").read_text().strip()
            for r in range(world_size)
        ]

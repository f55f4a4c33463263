"""What each worker process of an agent runs: the built-in trainer or the user's script, under torch's
error recording, and how it leaves (the exit code its agent reads).

Kept apart from worker.py (the agent): a worker started from the forkserver imports this module, not the
agent's machinery.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator

from etj_contract import env as etj_env


def worker_entry() -> None:
    """What each worker process runs (RANK, WORLD_SIZE, MASTER_* come from the agent): the built-in
    trainer, the script of ``ETJ_SCRIPT`` (a JSON argv) written on ``etj_trainer.elastic``, or under
    ``ETJ_LAUNCHER=Torchrun`` that script as a stock torchrun would run it."""
    _recorded(join_in_place=False)


def join_worker_entry(local_rank: int, nproc: int, node: str, elastic_env: dict[str, str]) -> None:
    """A worker of a node that joins the running world in place (started by this agent, not torch's).

    ``elastic_env``: what torch elastic's agent would have set and that no rank assignment changes (run id,
    role, restart count); RANK, WORLD_SIZE and the rest follow when the world admits it (world_env.py)."""
    os.environ.update(
        {
            **elastic_env,
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(nproc),
            etj_env.JOIN_IN_PLACE.name: "1",
            etj_env.JOIN_NODE.name: node,  # the node's ranks are admitted together (join.ask)
        }
    )
    _recorded(join_in_place=True)


def _recorded(join_in_place: bool) -> None:
    from torch.distributed.elastic.multiprocessing.errors import record

    # record: an exception's "Type: message" reaches the agent (its error file), which reports it.
    record(_worker)(join_in_place)


def _worker(join_in_place: bool) -> None:
    from etj_trainer.agent.lifetime import die_with_parent

    die_with_parent()  # first of all: a worker whose forkserver or agent is gone must not train on
    import torch.distributed as dist

    from etj_trainer import elastic
    from etj_trainer.classifier.trainer import EXIT_RESIZE, train
    from etj_trainer.config import TrainConfig
    from etj_trainer.core import devices
    from etj_trainer.resize import group_sockets

    if etj_env.LAUNCHER.get(os.environ, "Etj") == "Torchrun":
        run_stock_script(json.loads(etj_env.SCRIPT.get(os.environ, "[]")))
        return
    stop = elastic.StopFlag().install()  # a SIGTERM during start-up must still end in a checkpoint
    logging.basicConfig(level=etj_env.LOG_LEVEL.get(os.environ, "WARNING"))
    script = etj_env.SCRIPT.get(os.environ, "")
    cfg = None if script else TrainConfig.from_env()  # a bad env value fails here, before the group forms
    devices.bind_this_rank()  # this rank's GPU, before any CUDA call
    if not join_in_place:  # a joiner forms its first group when the world admits it (join.py)
        group_sockets.init_first()
    if cfg is None:
        with refusing_own_process_group():
            run_script(json.loads(script))
    else:
        train(cfg, stop)
    job = elastic.last_job()
    if dist.is_initialized():
        dist.destroy_process_group()
    if job is not None and job.stopped_early:
        if not stop.requested:
            sys.exit(EXIT_RESIZE)  # a peer is leaving: fail fast so our agent re-rendezvouses now
        # We were told to stop (our agent is leaving or restarting us). Returning would block in torch's
        # worker wrapper until the agent reads our return value, which a stopping agent never does; the
        # checkpoint is already fsynced, so leave at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


OWN_GROUP_REFUSED = (
    "this script forms its own process group (torch.distributed.init_process_group), but under "
    "spec.trainer.launcher Etj the worker has formed it already, on etj's sealed store. Run it unchanged "
    "with spec.trainer.launcher: Torchrun (etj-train --launcher Torchrun; every resize restarts it from its "
    "own checkpoint), or port its loop to etj_trainer.elastic for in-place resizes (docs/porting.md)"
)


@contextlib.contextmanager
def refusing_own_process_group() -> Iterator[None]:
    """While a script on the loop API runs, its own ``init_process_group`` is refused with a sentence that
    names the launcher it needs, never torch's bare "initialize the default process group twice"."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from etj_trainer.resize import group_sockets  # noqa: F401  (binds torch's function before the swap)

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError(OWN_GROUP_REFUSED)

    saved = dist.init_process_group, c10d.init_process_group
    dist.init_process_group = c10d.init_process_group = refuse
    try:
        yield
    finally:
        dist.init_process_group, c10d.init_process_group = saved


def run_stock_script(argv: list[str]) -> None:
    """A stock torchrun script, as ``torchrun script.py ARGS`` runs it: torch elastic's environment as the
    agent set it, no process group formed, SIGTERM's default action (or the script's own handler: the
    agent's SIGTERM on a leave is the spot notice, ``ETJ_SIGTERM_GRACE_SECONDS`` before the SIGKILL)."""
    import signal

    if not argv:
        raise ValueError("spec.trainer.launcher Torchrun runs your script: pass --script PATH [ARGS...]")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the forkserver's SIG_IGN is not the script's
    run_script(argv)


def run_script(argv: list[str]) -> None:
    """Run a user's training script as ``python script.py ARGS`` does (``-m pkg.mod`` too): as
    ``__main__``, with ``sys.argv = argv`` and the script's folder first on ``sys.path`` (the current
    directory for ``-m``), so its sibling modules import."""
    import runpy

    saved, saved_path = sys.argv, list(sys.path)
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise  # the script failed: so does the worker
    finally:
        sys.argv = saved
        sys.path[:] = saved_path

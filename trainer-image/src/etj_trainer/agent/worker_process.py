"""What each worker process of an agent runs: the built-in trainer or the user's script, under torch's
error recording, and how it leaves (the exit code its agent reads).

Kept apart from worker.py (the agent): a worker started from the forkserver imports this module, not the
agent's machinery.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from etj_contract import env as etj_env


def worker_entry() -> None:
    """What each worker process runs (RANK, WORLD_SIZE, MASTER_* come from the agent): the built-in
    trainer, or the script of ``ETJ_SCRIPT`` (a JSON argv) written on ``etj_trainer.elastic``."""
    _recorded(join_in_place=False)


def join_worker_entry(local_rank: int, nproc: int, node: str) -> None:
    """A worker of a node that joins the running world in place (started by this agent, not torch's)."""
    os.environ.update(
        {
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

    stop = elastic.StopFlag().install()  # a SIGTERM during start-up must still end in a checkpoint
    logging.basicConfig(level=etj_env.LOG_LEVEL.get(os.environ, "WARNING"))
    script = etj_env.SCRIPT.get(os.environ, "")
    cfg = None if script else TrainConfig.from_env()  # a bad env value fails here, before the group forms
    devices.bind_this_rank()  # this rank's GPU, before any CUDA call
    if not join_in_place:  # a joiner forms its first group when the world admits it (join.py)
        group_sockets.init_first()
    if cfg is None:
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


def run_script(argv: list[str]) -> None:
    """Run a user's training script as ``__main__`` with ``sys.argv = argv`` (``-m pkg.mod`` too)."""
    import runpy

    saved = sys.argv
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise  # the script failed: so does the worker
    finally:
        sys.argv = saved

"""``EtjAgent``: torch's ``LocalElasticAgent`` with etj's hooks (agent/worker.py wires it up).

* each rendezvous round reads the job's bounds first (resize/bounds.py: ``kubectl scale`` after this agent
  started) and waits out a lost store instead of failing (store_link.py);
* a node waiting to join restarts nothing once this node's workers have trained the last step (the
  workers' ``training_done`` marker): a finished job is never restarted, and its result is emitted once;
* a restart tells the workers it *is* a restart (core/stopping.py's agent-state file) before signalling
  them, so they stop instead of re-forming in place;
* crash loops are bounded (crash_budget.py): each crash without progress is counted and its error line
  reported; past the budget, ``CrashLoop``;
* no exit barrier: the store is external and the workers have passed the trainer's final barrier.

Imports torch at module level (the base class): agent/worker.py imports this only once the forkserver has
started, so both processes import at the same time.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Mapping
from typing import Any

from torch.distributed.elastic.agent.server.api import WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

from etj_trainer.agent.agent_config import ROLE, AgentConfig
from etj_trainer.agent.crash_budget import EXIT_RESIZE, CrashCount, after_failure, error_line, stock_progress
from etj_trainer.agent.rendezvous import set_min_nodes
from etj_trainer.agent.store_link import STORE_ERRORS, ReconnectingRendezvous
from etj_trainer.core.stopping import AGENT_RESTARTING, AGENT_RUNNING, training_done, write_agent_state
from etj_trainer.resize import bounds


class CrashLoop(Exception):
    """The workers crashed more often in a row, without progress, than the budget allows."""


class EtjAgent(LocalElasticAgent):
    """torch's local agent with etj's hooks (see the module docstring)."""

    def __init__(
        self, cfg: AgentConfig, handler: ReconnectingRendezvous, state_file: str, start_method: str
    ) -> None:
        from etj_trainer.agent.worker_process import worker_entry

        spec = WorkerSpec(
            role=ROLE,
            local_world_size=cfg.nproc_per_node,
            entrypoint=worker_entry,
            args=(),
            rdzv_handler=handler,
            max_restarts=cfg.max_restarts,
            monitor_interval=cfg.monitor_interval,
        )
        super().__init__(
            spec=spec,
            logs_specs=DefaultLogsSpecs(),
            start_method=start_method,
            shutdown_timeout=cfg.shutdown_timeout,
        )
        # etj_-prefixed: torch's agent keeps private state of its own on self
        self.etj_cfg, self.etj_handler, self.etj_state_file = cfg, handler, state_file
        self.etj_crashes = CrashCount()
        self.last_result: Any = None
        self.etj_join_refused = False  # said once: a node waits, but the training is done
        # A stock script's progress (crash_budget.stock_progress): when its group started, how many ran long.
        self.etj_started = time.monotonic()
        self.etj_long_runs = 0

    def _start_workers(self, worker_group: Any) -> Any:
        self.etj_started = time.monotonic()
        return super()._start_workers(worker_group)

    def _monitor_workers(self, worker_group: Any) -> Any:
        self.last_result = super()._monitor_workers(worker_group)
        return self.last_result

    def _rendezvous(self, worker_group: Any) -> None:
        # The store can go between the round and the rank assignment torch does on it: wait for the
        # new store and join its round (the handler waits), instead of failing the agent.
        cfg, handler = self.etj_cfg, self.etj_handler
        while True:
            # `kubectl scale` since this agent started (bounds.py): every node of a round must agree
            # on the maximum that completes it
            job = bounds.read_from(cfg.progress_url)
            if job is not None:
                bounds.set_rendezvous_nodes(handler.inner, max_nodes=job.max)
            try:
                super()._rendezvous(worker_group)
                break
            except STORE_ERRORS as e:
                handler.store_lost(e)
        # later rounds (the restart path): the job's minimum
        set_min_nodes(handler.inner, job.min if job is not None else cfg.min_nodes)

    def _restart_workers(self, worker_group: Any) -> None:
        # Healthy workers restart only for a node waiting to join (torch's loop). Once they have trained
        # the last step, the world must not re-form: it would restart a finished job from its final
        # checkpoint, train nothing, and report a second result. The joiner's rendezvous closes with ours.
        if worker_group.state == WorkerState.HEALTHY and training_done(self.etj_state_file):
            if not self.etj_join_refused:
                self.etj_join_refused = True
                print(
                    "etj-train worker: a node waits to join, but the training is done: no restart",
                    flush=True,
                )
            return
        if worker_group.state in (WorkerState.FAILED, WorkerState.UNHEALTHY) and self.last_result:
            self.count_crash(self.last_result.failures)
        # Our workers must stop *for a restart*, not survive in place: say so before signalling.
        write_agent_state(self.etj_state_file, AGENT_RESTARTING)
        super()._restart_workers(worker_group)
        write_agent_state(self.etj_state_file, AGENT_RUNNING)

    def _exit_barrier(self) -> None:
        # The barrier keeps an agent that hosts the store alive until everyone is done. Our store is
        # external, every worker has passed the trainer's final barrier, and after an in-process
        # leave the round's size is stale (the barrier would wait its full timeout for a departed node).
        if not self.etj_cfg.external_store:
            super()._exit_barrier()  # type: ignore[no-untyped-call]  # torch's, untyped

    def count_crash(self, failures: Mapping[int, Any]) -> None:
        """Bound crash loops (crash_budget.py): report the error line; past the budget, give up."""
        cfg = self.etj_cfg
        progress: tuple[int, int] | None
        if cfg.launcher == "Torchrun":
            progress = stock_progress(self.etj_long_runs, time.monotonic() - self.etj_started)
            self.etj_long_runs = progress[1]
        else:
            progress = _job_progress(cfg.progress_url)
        verdict = after_failure(
            self.etj_crashes,
            [f.exitcode for f in failures.values()],
            progress,
            store_lost=self.etj_handler.lost,
            max_crashes=cfg.max_crashes,
        )
        self.etj_crashes = verdict.count
        if not verdict.crash:
            return
        failed = [f for f in failures.values() if f.exitcode not in (0, EXIT_RESIZE)]
        line = error_line(failed[0].message if failed else "", cfg.worker_id)
        print(
            f"etj-train worker: crash {self.etj_crashes.in_a_row} without progress: {line}",
            file=sys.stderr,
            flush=True,
        )
        # A restart inside the pod is a crash the operator cannot see otherwise (counted by the store); the
        # last one, which gives up, is counted as the pod's failure instead.
        _report_error(cfg.progress_url, line, crash=not verdict.give_up)
        if verdict.give_up:
            raise CrashLoop(line)


def _job_progress(url: str) -> tuple[int, int] | None:
    """(epoch, step) of the job's progress document; None when it cannot be read."""
    from etj_trainer.core.progress import get_json

    doc = get_json(url, timeout=2.0) if url else None
    if not doc or not isinstance(doc.get("step"), int):
        return None
    epoch = doc.get("epoch")
    return (epoch if isinstance(epoch, int) else 0, doc["step"])


def _report_error(url: str, line: str, *, crash: bool) -> None:
    """Best effort: the operator shows the last error when the job stops advancing, and counts crashes."""
    from etj_trainer.core.progress import post_json

    body: dict[str, object] = {"lastError": line, **({"crash": True} if crash else {})}
    if url:
        with contextlib.suppress(OSError):
            post_json(url, body, timeout=2.0)

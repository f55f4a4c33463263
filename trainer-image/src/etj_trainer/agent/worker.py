"""``etj-train worker``: a torch elastic agent tuned for fast, safe resizes against an external store.

Equivalent to ``torchrun --nnodes=MIN:MAX --nproc-per-node=N --rdzv-backend=c10d
--rdzv-endpoint=$ETJ_RDZV_ENDPOINT --rdzv-id=$ETJ_RDZV_ID --max-restarts=<large> --monitor-interval=0.2
--rdzv-conf is_host=false,last_call_timeout=..,keep_alive_interval=1,keep_alive_max_attempt=3`` with
things torchrun cannot do from flags (which is why the agent is built here from torch's own
``LocalElasticAgent`` rather than by exec'ing torchrun):

* a **graceful leave needs no restart at all**: workers learn at a step boundary who is leaving and the
  survivors re-form the process group in place (regroup.py). The agent tells its workers whether a SIGTERM
  means "your pod is leaving" or "I am restarting you" through ``ETJ_AGENT_STATE_FILE``;
* when a restart is needed (a node joins, a crash), workers are started from a **forkserver that has
  already imported torch, torchvision, DALI and the trainer** -- a fork, not seconds of imports -- and the
  forkserver is warmed before this node first joins, so a joiner does not stall the others with imports;
* rendezvous polls every 0.1 s instead of torch's fixed 1 s, and ``last_call`` may be sub-second (torchrun
  only takes whole seconds). A new round only opens once every old participant has left it, and the nodes
  already waiting join within one poll, so a short last call does not split the world;
* on SIGTERM, after its workers have written their just-in-time checkpoint and exited, the agent **leaves
  the rendezvous explicitly** (torch's own exit operation), so survivors re-form the world at once instead
  of waiting for this node's keep-alive to expire. torchrun deliberately does not do this on a signal: it
  would have to close the rendezvous, which would end the job for everyone;
* a **lost store is waited out** (store_link.py): the workers train on, and the world re-forms on the
  operator's replacement store, instead of every agent exiting 1;
* **crash loops are bounded** (crash_budget.py): crashes without progress are counted and each one's error
  line goes to the progress document; past the budget the agent exits 1 and the job's failure budget decides;
* the just-in-time checkpoint gets the pod's grace period (less a margin), not torch's fixed 30 s.

This module is the wiring: the settings (agent_config.py), the rendezvous (rendezvous.py), torch's agent
with etj's hooks (elastic_agent.py) and what each worker process runs (worker_process.py).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from etj_contract import env as etj_env
from etj_trainer.agent import preflight
from etj_trainer.agent.agent_config import ROLE, AgentConfig
from etj_trainer.agent.rendezvous import (
    first_round_min_nodes,
    leave_rendezvous,
    make_rendezvous_handler,
    patch_rendezvous_poll,
)
from etj_trainer.agent.worker_process import join_worker_entry
from etj_trainer.core.progress import report_error
from etj_trainer.core.stopping import training_done_file

log = logging.getLogger(__name__)

# Preloaded into the forkserver: everything a worker imports before its first step -- and only that, since
# a joiner joins once these imports are done (torchvision alone is ~1.5 s, much more on a busy node).
BASE_PRELOAD = [
    "etj_trainer.agent._forkserver_dies_with_agent",  # first: a SIGKILLed agent takes its forkserver along
    "etj_trainer.agent._forkserver_ignore_sigterm",  # a group-wide SIGTERM must not kill the forkserver
    "torch",
    "torch.distributed",
    # torch.use_deterministic_algorithms() imports it (and with it torch._dynamo): 1.7 s per worker start
    # on an idle 2-core machine, 5 s on a busy one, found by the trainer's "ready in" line.
    "torch._inductor.config",
    "etj_trainer.classifier.trainer",
]
DALI_PRELOAD = ["nvidia.dali", "nvidia.dali.plugin.pytorch", "etj_trainer.data.dali_input"]


def preload_modules(env: Mapping[str, str]) -> list[str]:
    """What this job's workers will import: DALI unless all data is in-memory, the model's module."""
    from etj_trainer.config import TrainConfig

    mods = list(BASE_PRELOAD)
    if any(v.get(env, "") not in ("", "digits-tensor") for v in (etj_env.DATA, etj_env.VAL_DATA)):
        mods += DALI_PRELOAD
    model = etj_env.MODEL.get(env, TrainConfig.model)
    mods.append(model.split(":", 1)[0] if ":" in model else "torchvision")
    return mods


def start_forkserver(env: Mapping[str, str]) -> threading.Thread:
    """Start the forkserver and import ``preload_modules`` in it, in the background; join the thread to wait.

    Started before the agent imports torch itself, so both processes import at the same time.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(preload_modules(env))
    # Spawned here, from the calling (main) thread, not from the warm-up thread: the forkserver dies with
    # the thread that created it (_forkserver_dies_with_agent), and the warm-up thread ends in seconds.
    os.environ[etj_env.AGENT_PID.name] = str(os.getpid())
    from multiprocessing import forkserver

    forkserver.ensure_running()

    def warm() -> None:
        p = ctx.Process(target=_noop)  # start() returns once the forkserver has imported the preload
        p.start()
        p.join()

    t = threading.Thread(target=warm, name="etj-forkserver-warmup", daemon=True)
    t.start()
    return t


def _noop() -> None:
    pass


def joiner_elastic_env(cfg: AgentConfig) -> dict[str, str]:
    """The part of torch elastic's worker environment that a joiner's workers, which torch's agent does not
    start, need from us before the world admits them (RANK and the rest come then: core/world_env.py)."""
    return {
        "ROLE_NAME": ROLE,
        "TORCHELASTIC_RUN_ID": cfg.run_id,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": str(cfg.max_restarts),
    }


def run_joiners(cfg: AgentConfig) -> int | None:
    """This node's workers join the running world in place (join.py); torch elastic's agent is not used,
    so no other agent restarts its workers. Returns the exit code, or None: take the restart path."""
    ctx = multiprocessing.get_context("forkserver")
    node = f"{etj_env.WORKER_ID.get(os.environ, 'worker')}-{os.getpid()}-{time.time_ns()}"  # this attempt
    procs = [
        ctx.Process(target=join_worker_entry, args=(i, cfg.nproc_per_node, node, joiner_elastic_env(cfg)))
        for i in range(cfg.nproc_per_node)
    ]
    stopping: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)  # the pod is leaving: the workers leave at a step boundary (stop code)
        for p in procs:
            if p.pid is not None and p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)

    old = signal.signal(signal.SIGTERM, forward)
    try:
        print(f"etj-train worker: joining the running world in place at {time.time():.3f}", flush=True)
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    finally:
        signal.signal(signal.SIGTERM, old)
    codes = [p.exitcode for p in procs]
    if stopping:
        return 128 + stopping[0]
    if all(c == 0 for c in codes):
        return 0
    print(
        f"etj-train worker: in-place join ended with exit codes {codes}; joining the rendezvous", flush=True
    )
    return None


def run_agent(cfg: AgentConfig) -> int:
    """``etj-train worker``: prepare (state file, forkserver), form the first round, run the agent."""
    # Without this, an agent that stays group rank 0 across rounds does not re-publish MASTER_ADDR for the
    # new round and a joining agent waits forever for it (seen here on a 1->2 scale-up, torch 2.14).
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # The time a leaving node's workers have after their SIGTERM: a stock script's handler reads it.
    os.environ[etj_env.SIGTERM_GRACE_SECONDS.name] = str(cfg.shutdown_timeout)
    state_file = ""
    warmup: threading.Thread | None = None
    if cfg.fast_restart:
        # Read by the workers' SIGTERM handler (core/stopping.py); set before the forkserver starts so
        # that every worker inherits it.
        fd, state_file = tempfile.mkstemp(prefix="etj-agent-", suffix=".state")
        os.close(fd)
        os.environ[etj_env.AGENT_STATE_FILE.name] = state_file
        warmup = start_forkserver(os.environ)
    try:
        first = _first_round(cfg, warmup)
        if isinstance(first, int):
            return first
        return _run(cfg, first, state_file, "spawn" if warmup is None else "forkserver")
    finally:
        _remove_state_files(state_file)


def _remove_state_files(state_file: str) -> None:
    """The agent-state file and the workers' training-done marker beside it (core/stopping.py)."""
    for path in (state_file, training_done_file(state_file)):
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _first_handler(cfg: AgentConfig) -> tuple[Any, Any] | None:
    """The first handler and its store client; None when the store never answered (bounded by the job's
    start-up deadline): a store that starts after this agent is waited for, never an exit 1."""
    from etj_trainer.agent.store_link import StoreNeverAnswered, build_when_store_answers

    try:
        built: tuple[Any, Any] = build_when_store_answers(
            lambda: make_rendezvous_handler(cfg), cfg.endpoint, cfg.store_wait_s
        )
        return built
    except StoreNeverAnswered as e:
        print(f"etj-train worker: {e}: past the job's start-up deadline", file=sys.stderr, flush=True)
        return None


@dataclass(frozen=True)
class Gate:
    """What an agent learns before its first round: are its start-up peers in, is a world running?"""

    complete: bool  # every expected agent arrived (the first round then waits for all of them)
    door_open: bool  # a running world admits joiners in place
    store_lost: bool = False


def startup_gate(
    store: Any,
    run_id: str,
    expected: int,
    bound_s: float,
    door_open: Callable[[], bool],
) -> Gate:
    """The start-up wait and the door check, outliving the store.

    The store can go between the first handler's build and these reads (a store pod killed or drained
    while a replacement worker starts). Raising here ended the agent with exit 1, a counted worker failure
    for what is store loss (seen in the chaos bench: two failures in one run). Now the agent goes on to its
    first round, where the reconnecting handler waits for the new store like any other store loss.
    """
    from etj_trainer.agent.first_round import wait_for_startup_peers
    from etj_trainer.agent.store_link import STORE_ERRORS

    try:
        complete = False
        if expected > 1:
            wait = wait_for_startup_peers(store, run_id, expected, bound_s)
            # A late agent (a joiner after a leave) must not make its first round wait for the start-up's
            # count: a stock script's join, which takes the rendezvous, waited forever for a third node.
            complete = wait.complete and not wait.late
            print(
                f"etj-train worker: start-up: {wait.arrived} of {wait.expected} workers arrived"
                f" after {wait.waited_s:.2f} s",
                flush=True,
            )
        return Gate(complete=complete, door_open=door_open())
    except STORE_ERRORS as e:
        print(f"etj-train worker: rendezvous store lost before the first round ({e}); going on", flush=True)
        return Gate(complete=False, door_open=False, store_lost=True)


def _first_round(cfg: AgentConfig, warmup: threading.Thread | None) -> Any:
    """The first rendezvous handler, or an exit code: the store never answered (1), or this node joined
    the running world in place and is done (run_joiners)."""
    from etj_trainer.resize.join import door_open

    if warmup is None:
        built = _first_handler(cfg)
        return 1 if built is None else built[0]
    warmup.join()  # join the rendezvous only when a worker can start with a fork
    patch_rendezvous_poll(cfg.rdzv_poll_interval)
    built = _first_handler(cfg)
    if built is None:
        return 1
    first, store = built
    # Read once (each read is a store connection): a running world admits joiners at a step boundary.
    gate = startup_gate(
        store,
        cfg.run_id,
        cfg.startup_workers,
        cfg.startup_wait_s,
        lambda: door_open(cfg.endpoint, cfg.run_id, cfg.token),
    )
    if gate.door_open:
        rc = run_joiners(cfg)
        if rc is not None:
            return rc
    elif gate.complete:
        # The first round also waits for all of them (bounded), not the last call only: on a busy
        # node an agent that has arrived can take longer than the last call to join the round.
        first_round_min_nodes(
            first, min(cfg.startup_workers, cfg.max_nodes), cfg.min_nodes, cfg.startup_wait_s
        )
    return first


def _run(cfg: AgentConfig, first: Any, state_file: str, start_method: str) -> int:
    """Run torch's agent loop (EtjAgent) from the first round on; its exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError

    from etj_trainer.agent.elastic_agent import CrashLoop, EtjAgent
    from etj_trainer.agent.store_link import ReconnectingRendezvous

    # Store loss is waited out, never an agent failure (store_link.py): later handlers are built the same way.
    handler = ReconnectingRendezvous(
        lambda: make_rendezvous_handler(cfg)[0], cfg.endpoint, join_timeout=cfg.join_timeout, first=first
    )
    agent = EtjAgent(cfg, handler, state_file, start_method)
    # Wall-clock time: bench/resize_pause.py measures a joiner's pause from this line.
    print(f"etj-train worker: joining the rendezvous at {time.time():.3f}", flush=True)
    try:
        result = agent.run()
    except CrashLoop as e:
        print(
            f"etj-train worker: {cfg.max_crashes + 1} crashes in a row without progress; giving up: {e}",
            file=sys.stderr,
            flush=True,
        )
        if not handler.lost:
            leave_rendezvous(handler.inner)  # the others need not wait for our keep-alive to expire
        # Exit at once: tearing the interpreter down under torch's store threads aborted (SIGABRT, not 1)
        # in one of the first test runs here, and the exit code is what fails the pod.
        _remove_state_files(state_file)
        sys.stdout.flush()
        os._exit(1)
    except RendezvousClosedError:
        # The job finished (its agents closed the rendezvous) before this node got in: a node that
        # arrives as the last step ends has nothing to join, which is not a failure.
        print(
            "etj-train worker: the job's rendezvous is closed (it has finished): nothing to join", flush=True
        )
        return 0
    except SignalException as e:
        # agent.run() has already SIGTERMed the workers and waited for them (they checkpoint first).
        if cfg.fast_restart and not handler.lost:
            leave_rendezvous(handler.inner)
        return 128 + int(e.sigval)
    if result.is_failed():
        for rank, failure in result.failures.items():
            print(f"etj-train worker: rank {rank} failed: exit {failure.exitcode}", file=sys.stderr)
        return 1
    handler.shutdown()  # training finished: close the rendezvous so no one waits for more rounds
    return 0


def main(argv: list[str] | None = None) -> int:
    refused = preflight.check(os.environ, deep=False)  # no torch here before the forkserver's
    if refused:  # before any worker starts: a bad input would only crash-loop them
        for r in refused:
            print(f"etj-train worker: {r.for_env()}", file=sys.stderr, flush=True)
        worker_id = etj_env.WORKER_ID.get(os.environ, "worker")
        report_error(f"{worker_id}: InputRefused: {refused[0].for_env()}")
        return 1
    cfg = AgentConfig.from_env()
    print("etj-train worker: " + " ".join(cfg.torchrun_args()), flush=True)
    # The agent turns SIGTERM into SignalException itself; make sure SIGINT does the same for laptops.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return run_agent(cfg)

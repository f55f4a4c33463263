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

Over ~400 lines: ``run_agent`` is one torch agent subclass and the hooks it needs; the decisions live in
the modules named above, this file is their wiring.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from etj_contract import env as etj_env
from etj_trainer.agent.crash_budget import (
    DEFAULT_MAX_CRASHES,
    EXIT_RESIZE,
    CrashCount,
    after_failure,
    error_line,
)

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


TORCH_SHUTDOWN_TIMEOUT = 30  # torch elastic's default wait for stopping workers
SHUTDOWN_MARGIN_S = 10  # of the pod's grace period, kept for the agent's exit after its workers
MIN_SHUTDOWN_TIMEOUT = 5


@dataclass
class AgentConfig:
    endpoint: str
    run_id: str
    min_nodes: int
    max_nodes: int
    nproc_per_node: int = 1
    max_restarts: int = 1_000_000  # every membership change is a "restart" to torch elastic
    monitor_interval: float = 0.2
    last_call_timeout: float = 1.0  # rounds below max size wait this long for stragglers
    rdzv_poll_interval: float = 0.1  # torch polls the rendezvous state every 1 s (hard-coded)
    keep_alive_interval: int = 1
    keep_alive_max_attempt: int = 3
    join_timeout: int = 600
    external_store: bool = True  # is_host=false: never host the store in a worker (single point of failure)
    fast_restart: bool = True  # forkserver start + explicit leave; False = plain torchrun behaviour
    max_crashes: int = DEFAULT_MAX_CRASHES  # crash restarts without progress before the pod fails
    grace_seconds: int | None = None  # the pod's terminationGracePeriodSeconds, when the operator says
    progress_url: str = ""  # where the agent reads the job's step and reports a crash's error line
    worker_id: str = ""
    startup_workers: int = 0  # wait for this many agents before the first rendezvous (startup.py)
    startup_wait_s: float = 60.0
    # How long to wait for the job's store to answer at start-up (the job's start-up deadline).
    store_wait_s: float = 1800.0
    # The address other workers reach this pod at (the pod IP, from the downward API). torch elastic
    # otherwise publishes socket.getfqdn(): a pod's hostname, which other pods cannot resolve.
    local_addr: str = ""
    # The job's token (its Secret): seals the rendezvous state on the store (sealed_rendezvous.py).
    token: str = field(default="", repr=False)  # never in a log line

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AgentConfig:
        e = os.environ if env is None else env
        cfg = cls(
            endpoint=e[etj_env.RDZV_ENDPOINT.name],
            run_id=etj_env.RDZV_ID.get(e, "etj"),
            min_nodes=etj_env.MIN_WORKERS.get(e, 1),
            max_nodes=etj_env.MAX_WORKERS.get(e, 1),
            nproc_per_node=etj_env.NPROC_PER_WORKER.get(e, 1),
            fast_restart=etj_env.FAST_RESTART.get(e, True),
            max_crashes=etj_env.MAX_CRASH_RESTARTS.get(e, DEFAULT_MAX_CRASHES),
            progress_url=etj_env.PROGRESS_URL.get(e, ""),
            worker_id=etj_env.WORKER_ID.get(e, ""),
            grace_seconds=etj_env.TERMINATION_GRACE_SECONDS.read(e),
            local_addr=e.get("POD_IP", ""),
            token=etj_env.PROGRESS_TOKEN.get(e, ""),
        )
        cfg.last_call_timeout = etj_env.LAST_CALL_TIMEOUT.get(e, cfg.last_call_timeout)
        cfg.rdzv_poll_interval = etj_env.RDZV_POLL_INTERVAL.get(e, cfg.rdzv_poll_interval)
        cfg.keep_alive_interval = etj_env.KEEP_ALIVE_INTERVAL.get(e, cfg.keep_alive_interval)
        cfg.startup_workers = etj_env.STARTUP_WORKERS.get(e, cfg.startup_workers)
        cfg.startup_wait_s = etj_env.STARTUP_WAIT_SECONDS.get(e, cfg.startup_wait_s)
        cfg.store_wait_s = etj_env.STORE_WAIT_SECONDS.get(e, cfg.store_wait_s)
        return cfg

    @property
    def shutdown_timeout(self) -> int:
        """How long the agent waits for its workers' just-in-time checkpoint after a SIGTERM.

        torch's default is 30 s whatever the pod's grace period; the pod's grace (less a margin for the
        agent's own exit: leaving the rendezvous, at most 5 s) is the real limit: the kubelet SIGKILLs then.
        """
        if self.grace_seconds is None:
            return TORCH_SHUTDOWN_TIMEOUT
        return max(MIN_SHUTDOWN_TIMEOUT, self.grace_seconds - SHUTDOWN_MARGIN_S)

    def rdzv_configs(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "join_timeout": self.join_timeout,
            "last_call_timeout": self.last_call_timeout,
            "keep_alive_interval": self.keep_alive_interval,
            "keep_alive_max_attempt": self.keep_alive_max_attempt,
        }
        if self.external_store:
            conf["is_host"] = False
        return conf

    def rendezvous_parameters(self) -> Any:
        """torch's ``RendezvousParameters`` for this agent (c10d on the external store)."""
        from torch.distributed.elastic.rendezvous import RendezvousParameters

        return RendezvousParameters(
            backend="c10d",
            endpoint=self.endpoint,
            run_id=self.run_id,
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            local_addr=self.local_addr or None,
            **self.rdzv_configs(),
        )

    def torchrun_args(self) -> list[str]:
        """The equivalent torchrun command line (printed for users; the agent below is what runs).

        torchrun takes whole seconds for ``last_call_timeout``; the agent uses the exact value.
        """
        conf = ",".join(f"{k}={v}" for k, v in self.rdzv_configs().items())
        return [
            "torchrun",
            f"--nnodes={self.min_nodes}:{self.max_nodes}",
            f"--nproc-per-node={self.nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.endpoint}",
            f"--rdzv-id={self.run_id}",
            f"--rdzv-conf={conf}",
            f"--max-restarts={self.max_restarts}",
            f"--monitor-interval={self.monitor_interval}",
            *([f"--local-addr={self.local_addr}"] if self.local_addr else []),
        ]


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
    from etj_trainer.core.stopping import collective_timeout
    from etj_trainer.resize import group_sockets

    stop = elastic.StopFlag().install()  # a SIGTERM during start-up must still end in a checkpoint
    logging.basicConfig(level=etj_env.LOG_LEVEL.get(os.environ, "WARNING"))
    script = etj_env.SCRIPT.get(os.environ, "")
    cfg = None if script else TrainConfig.from_env()  # a bad env value fails here, before the group forms
    devices.bind_this_rank()  # this rank's GPU, before any CUDA call
    if not join_in_place:  # a joiner forms its first group when the world admits it (join.py)
        group_sockets.init(devices.process_group_backend(), timeout=collective_timeout())
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


def _leave_rendezvous(handler: Any) -> None:
    """Remove this node from the rendezvous participants (torch's exit op; private, hence guarded)."""
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

        handler._stop_heartbeats()
        handler._op_executor.run(_RendezvousExitOp(), time.monotonic() + 5.0)
        print("etj-train worker: left the rendezvous", flush=True)
    except Exception as e:  # the keep-alive expiry (a few seconds) is the fallback
        log.warning("could not leave the rendezvous explicitly: %s", e)


def _noop() -> None:
    pass


class CrashLoop(Exception):
    """The workers crashed more often in a row, without progress, than the budget allows."""


def _job_progress(url: str) -> tuple[int, int] | None:
    """(epoch, step) of the job's progress document; None when it cannot be read."""
    from etj_trainer.core.progress import get_json

    doc = get_json(url, timeout=2.0) if url else None
    if not doc or not isinstance(doc.get("step"), int):
        return None
    epoch = doc.get("epoch")
    return (epoch if isinstance(epoch, int) else 0, doc["step"])


def _report_error(url: str, line: str) -> None:
    """Best effort: the operator shows the last error when the job stops advancing."""
    from etj_trainer.core.progress import post_json

    if url:
        with contextlib.suppress(OSError):
            post_json(url, {"lastError": line}, timeout=2.0)


def patch_rendezvous_poll(interval: float) -> bool:
    """Make torch's rendezvous poll its state every ``interval`` s instead of its hard-coded 1 s.

    torch's op executor calls ``dynamic_rendezvous._delay(seconds=1)`` between polls (a private name,
    hence guarded; tests/trainer/test_agent_rendezvous.py fails if torch renames it). Other delays (the
    random skew before a node's first join) are kept.
    """
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    original = getattr(dr, "_delay", None)
    if original is None:
        log.warning("torch has no dynamic_rendezvous._delay: rendezvous polls stay at 1 s")
        return False
    original = getattr(original, "etj_original", original)

    def delay(seconds: float | tuple[float, float]) -> None:
        original(interval if seconds == 1 else seconds)

    delay.etj_original = original  # type: ignore[attr-defined]
    dr._delay = delay
    return True


def make_rendezvous_handler(cfg: AgentConfig) -> tuple[Any, Any]:
    """torch's DynamicRendezvousHandler on the job's store, built directly so ``last_call`` can be
    sub-second and so its state is sealed with the job's token (sealed_rendezvous.py: torch's own c10d
    backend unpickles whatever any client of the store wrote).

    Returns the handler and its store client (the start-up wait counts agents on it).
    """
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    from etj_trainer.agent.sealed_rendezvous import SealedC10dBackend

    if not cfg.token:
        log.warning("no %s: the rendezvous state is not authenticated", etj_env.PROGRESS_TOKEN.name)
    # torch's store client (its timeouts, is_host=false); torch's backend object is not used
    _, store = create_backend(cfg.rendezvous_parameters())
    handler = DynamicRendezvousHandler.from_backend(
        cfg.run_id,
        store,
        SealedC10dBackend(store, cfg.run_id, cfg.token),
        cfg.min_nodes,
        cfg.max_nodes,
        timeout=RendezvousTimeout(
            join=timedelta(seconds=cfg.join_timeout), last_call=timedelta(seconds=cfg.last_call_timeout)
        ),
        keep_alive_interval=cfg.keep_alive_interval,
        keep_alive_max_attempt=cfg.keep_alive_max_attempt,
        local_addr=cfg.local_addr or None,
    )
    return handler, store


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


def _set_min_nodes(handler: Any, n: int) -> bool:
    from etj_trainer.resize.bounds import (
        set_rendezvous_nodes,  # imports torch: not before the forkserver starts
    )

    return set_rendezvous_nodes(handler, min_nodes=n)  # guarded: else the last call alone decides


def first_round_min_nodes(handler: Any, n: int, job_min: int, bound_s: float) -> None:
    """The first round completes only with ``n`` nodes, for at most ``bound_s`` (then the job's minimum)."""
    if n > job_min and _set_min_nodes(handler, n):
        timer = threading.Timer(bound_s, _set_min_nodes, args=(handler, job_min))
        timer.daemon = True
        timer.start()


def run_joiners(cfg: AgentConfig) -> int | None:
    """This node's workers join the running world in place (join.py); torch elastic's agent is not used,
    so no other agent restarts its workers. Returns the exit code, or None: take the restart path."""
    ctx = multiprocessing.get_context("forkserver")
    node = f"{etj_env.WORKER_ID.get(os.environ, 'worker')}-{os.getpid()}-{time.time_ns()}"  # this attempt
    procs = [
        ctx.Process(target=join_worker_entry, args=(i, cfg.nproc_per_node, node))
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
    # Without this, an agent that stays group rank 0 across rounds does not re-publish MASTER_ADDR for the
    # new round and a joining agent waits forever for it (seen here on a 1->2 scale-up, torch 2.14).
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    state_file = ""
    warmup: threading.Thread | None = None
    if cfg.fast_restart:
        # Read by the workers' SIGTERM handler (regroup.py); set before the forkserver starts so that
        # every worker inherits it.
        fd, state_file = tempfile.mkstemp(prefix="etj-agent-", suffix=".state")
        os.close(fd)
        os.environ[etj_env.AGENT_STATE_FILE.name] = state_file
        warmup = start_forkserver(os.environ)

    from torch.distributed.elastic.agent.server.api import WorkerSpec, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from etj_trainer.agent.store_link import (
        STORE_ERRORS,
        ReconnectingRendezvous,
        StoreNeverAnswered,
        build_when_store_answers,
    )
    from etj_trainer.core.stopping import AGENT_RESTARTING, AGENT_RUNNING, write_agent_state
    from etj_trainer.resize import bounds
    from etj_trainer.resize.join import door_open

    def first_handler() -> tuple[Any, Any] | None:
        """The first handler and its store client; None when the store never answered (bounded by the
        job's start-up deadline): a store that starts after this agent is waited for, never an exit 1."""
        try:
            built: tuple[Any, Any] = build_when_store_answers(
                lambda: make_rendezvous_handler(cfg), cfg.endpoint, cfg.store_wait_s
            )
            return built
        except StoreNeverAnswered as e:
            print(f"etj-train worker: {e}: past the job's start-up deadline", file=sys.stderr, flush=True)
            return None

    start_method = "spawn"
    if warmup is not None:
        warmup.join()  # join the rendezvous only when a worker can start with a fork
        start_method = "forkserver"
        patch_rendezvous_poll(cfg.rdzv_poll_interval)
        built = first_handler()
        if built is None:
            return 1
        first, store = built
        if cfg.startup_workers > 1:
            from etj_trainer.agent.first_round import wait_for_startup_peers

            wait = wait_for_startup_peers(store, cfg.run_id, cfg.startup_workers, cfg.startup_wait_s)
            print(
                f"etj-train worker: start-up: {wait.arrived} of {wait.expected} workers arrived"
                f" after {wait.waited_s:.2f} s",
                flush=True,
            )
        # Read once (each read is a store connection): a running world admits joiners at a step boundary.
        if door_open(cfg.endpoint, cfg.run_id):
            rc = run_joiners(cfg)
            if rc is not None:
                return rc
        elif cfg.startup_workers > 1 and wait.complete:
            # The first round also waits for all of them (bounded), not the last call only: on a busy
            # node an agent that has arrived can take longer than the last call to join the round.
            first_round_min_nodes(
                first, min(cfg.startup_workers, cfg.max_nodes), cfg.min_nodes, cfg.startup_wait_s
            )
    else:
        built = first_handler()
        if built is None:
            return 1
        first = built[0]
    # Store loss is waited out, never an agent failure (store_link.py): later handlers are built the same way.
    handler = ReconnectingRendezvous(
        lambda: make_rendezvous_handler(cfg)[0],
        cfg.endpoint,
        join_timeout=cfg.join_timeout,
        first=first,
    )

    crashes = CrashCount()

    class EtjAgent(LocalElasticAgent):
        last_result: Any = None

        def _monitor_workers(self, worker_group: Any) -> Any:
            self.last_result = super()._monitor_workers(worker_group)
            return self.last_result

        def _rendezvous(self, worker_group: Any) -> None:
            # The store can go between the round and the rank assignment torch does on it: wait for the
            # new store and join its round (the handler waits), instead of failing the agent.
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
            _set_min_nodes(handler.inner, job.min if job is not None else cfg.min_nodes)

        def _restart_workers(self, worker_group: Any) -> None:
            if worker_group.state in (WorkerState.FAILED, WorkerState.UNHEALTHY) and self.last_result:
                count_crash(self.last_result.failures)
            # Our workers must stop *for a restart*, not survive in place: say so before signalling.
            write_agent_state(state_file, AGENT_RESTARTING)
            super()._restart_workers(worker_group)
            write_agent_state(state_file, AGENT_RUNNING)

        def _exit_barrier(self) -> None:
            # The barrier keeps an agent that hosts the store alive until everyone is done. Our store is
            # external, every worker has passed the trainer's final barrier, and after an in-process
            # leave the round's size is stale (the barrier would wait its full timeout for a departed node).
            if not cfg.external_store:
                super()._exit_barrier()  # type: ignore[no-untyped-call]  # torch's, untyped

    def count_crash(failures: Mapping[int, Any]) -> None:
        """Bound crash loops (crash_budget.py): report the error line; past the budget, give up."""
        nonlocal crashes
        verdict = after_failure(
            crashes,
            [f.exitcode for f in failures.values()],
            _job_progress(cfg.progress_url),
            store_lost=handler.lost,
            max_crashes=cfg.max_crashes,
        )
        crashes = verdict.count
        if not verdict.crash:
            return
        failed = [f for f in failures.values() if f.exitcode not in (0, EXIT_RESIZE)]
        line = error_line(failed[0].message if failed else "", cfg.worker_id)
        print(
            f"etj-train worker: crash {crashes.in_a_row} without progress: {line}",
            file=sys.stderr,
            flush=True,
        )
        _report_error(cfg.progress_url, line)
        if verdict.give_up:
            raise CrashLoop(line)

    spec = WorkerSpec(
        role="trainer",
        local_world_size=cfg.nproc_per_node,
        entrypoint=worker_entry,
        args=(),
        rdzv_handler=handler,
        max_restarts=cfg.max_restarts,
        monitor_interval=cfg.monitor_interval,
    )
    agent = EtjAgent(
        spec=spec,
        logs_specs=DefaultLogsSpecs(),
        start_method=start_method,
        shutdown_timeout=cfg.shutdown_timeout,
    )
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
            _leave_rendezvous(handler.inner)  # the others need not wait for our keep-alive to expire
        # Exit at once: tearing the interpreter down under torch's store threads aborted (SIGABRT, not 1)
        # in one of the first test runs here, and the exit code is what fails the pod.
        if state_file:
            with contextlib.suppress(OSError):
                os.unlink(state_file)
        sys.stdout.flush()
        os._exit(1)
    except SignalException as e:
        # agent.run() has already SIGTERMed the workers and waited for them (they checkpoint first).
        if cfg.fast_restart and not handler.lost:
            _leave_rendezvous(handler.inner)
        return 128 + int(e.sigval)
    finally:
        if state_file:
            with contextlib.suppress(OSError):
                os.unlink(state_file)
    if result.is_failed():
        for rank, failure in result.failures.items():
            print(f"etj-train worker: rank {rank} failed: exit {failure.exitcode}", file=sys.stderr)
        return 1
    handler.shutdown()  # training finished: close the rendezvous so no one waits for more rounds
    return 0


def main(argv: list[str] | None = None) -> int:
    cfg = AgentConfig.from_env()
    print("etj-train worker: " + " ".join(cfg.torchrun_args()), flush=True)
    # The agent turns SIGTERM into SignalException itself; make sure SIGINT does the same for laptops.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return run_agent(cfg)

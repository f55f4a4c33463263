"""The agent's settings (``etj-train worker``): the job's rendezvous, restart and shutdown parameters from
the environment the operator sets, and the torchrun command line they amount to."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from etj_contract import env as etj_env
from etj_trainer.agent.crash_budget import DEFAULT_MAX_CRASHES

TORCH_SHUTDOWN_TIMEOUT = 30  # torch elastic's default wait for stopping workers
ROLE = "trainer"  # torch elastic's ROLE_NAME for every worker (joiners too: worker.joiner_elastic_env)
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
    startup_workers: int = 0  # wait for this many agents before the first rendezvous (first_round.py)
    startup_wait_s: float = 60.0
    # How long to wait for the job's store to answer at start-up (the job's start-up deadline).
    store_wait_s: float = 1800.0
    # The address other workers reach this pod at (the pod IP, from the downward API). torch elastic
    # otherwise publishes socket.getfqdn(): a pod's hostname, which other pods cannot resolve.
    local_addr: str = ""
    launcher: str = "Etj"  # Torchrun: a stock script (worker_process.run_stock_script, docs/porting.md)
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
            launcher=etj_env.LAUNCHER.get(e, "Etj"),
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

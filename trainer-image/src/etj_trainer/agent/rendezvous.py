"""The agent's rendezvous with torch elastic: torch's handler built on the job's store and sealed with the
job's token, a faster poll, the first round's size, and leaving explicitly."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

from etj_contract import env as etj_env
from etj_trainer.agent.agent_config import AgentConfig

log = logging.getLogger(__name__)

RDZV_READ_TIMEOUT_S = 60  # torch's c10d rendezvous backend's default read_timeout


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
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    from etj_trainer.agent.sealed_rendezvous import SealedC10dBackend
    from etj_trainer.core import store_client

    if not cfg.token:
        log.warning("no %s: the rendezvous state is not authenticated", etj_env.PROGRESS_TOKEN.name)
    # The client torch's c10d backend would make (create_backend: multi-tenant, its 60 s read timeout), made
    # here so that it works on a torch without libuv too (core/store_client.py)
    store = store_client.connect(cfg.endpoint, timedelta(seconds=RDZV_READ_TIMEOUT_S), multi_tenant=True)
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


def set_min_nodes(handler: Any, n: int) -> bool:
    from etj_trainer.resize.bounds import (
        set_rendezvous_nodes,  # imports torch: not before the forkserver starts
    )

    return set_rendezvous_nodes(handler, min_nodes=n)  # guarded: else the last call alone decides


def first_round_min_nodes(handler: Any, n: int, job_min: int, bound_s: float) -> None:
    """The first round completes only with ``n`` nodes, for at most ``bound_s`` (then the job's minimum)."""
    if n > job_min and set_min_nodes(handler, n):
        timer = threading.Timer(bound_s, set_min_nodes, args=(handler, job_min))
        timer.daemon = True
        timer.start()


def leave_rendezvous(handler: Any) -> None:
    """Remove this node from the rendezvous participants (torch's exit op; private, hence guarded)."""
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

        handler._stop_heartbeats()
        handler._op_executor.run(_RendezvousExitOp(), time.monotonic() + 5.0)
        print("etj-train worker: left the rendezvous", flush=True)
    except Exception as e:  # the keep-alive expiry (a few seconds) is the fallback
        log.warning("could not leave the rendezvous explicitly: %s", e)

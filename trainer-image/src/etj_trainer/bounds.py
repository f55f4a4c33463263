"""The job's replica bounds as the operator last set them, for processes started before the change.

``kubectl scale`` (or any edit of ``spec.replicas``) reaches new pods through their environment, and the
running ones through the job's store (etj_contract.replicas): each agent reads the bounds before every
rendezvous round and puts them into torch's rendezvous settings, rank 0 reads them before it admits
joiners in place. Without that, 2 -> 4 never grew the world: the old agents completed every round at their
start-time maximum of 2 and rank 0 turned the new pods away.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from etj_contract.replicas import KeyStore, Replicas, read

log = logging.getLogger(__name__)


READ_TIMEOUT_S = 2.0  # a lost store must not hold up the rendezvous that waits for its replacement


def read_from(endpoint: str) -> Replicas | None:
    """The bounds on the job's store at ``endpoint`` (host:port); None when not set or not reachable (the
    store's own loss is store_link.py's business: the environment's bounds apply meanwhile)."""
    host, _, port = endpoint.rpartition(":")
    try:
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=READ_TIMEOUT_S))
        return read(store)
    except (dist.DistError, RuntimeError, ValueError) as e:
        log.info("replica bounds not read: %s", e)
        return None


def max_workers(store: KeyStore | None, default: int) -> int:
    """The job's maximum in pods: the operator's latest word, else ``default`` (the environment's, also
    when the store does not answer: admitting fewer joiners is safe, failing the step is not)."""
    try:
        bounds = read(store) if store is not None else None
    except (dist.DistError, RuntimeError) as e:
        log.info("replica bounds not read: %s", e)
        bounds = None
    return bounds.max if bounds is not None else default


def set_rendezvous_nodes(handler: Any, *, min_nodes: int | None = None, max_nodes: int | None = None) -> bool:
    """torch's rendezvous settings are frozen and private; its join op reads them on every poll (the
    handler, its state holder and its op executor share the one settings object)."""
    try:
        for name, value in (("min_nodes", min_nodes), ("max_nodes", max_nodes)):
            if value is not None:
                object.__setattr__(handler._settings, name, value)
        return True
    except Exception as e:  # guarded: the environment's bounds stay
        log.warning("could not set the rendezvous' bounds: %s", e)
        return False

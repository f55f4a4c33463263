"""The job's replica bounds as the operator last set them, for processes started before the change.

``kubectl scale`` (or any edit of ``spec.replicas``) reaches new pods through their environment, and the
running ones through the job's store pod (etj_contract.replicas): each agent reads the bounds before every
rendezvous round and puts them into torch's rendezvous settings, rank 0 reads them before it admits
joiners in place. Without that, 2 -> 4 never grew the world: the old agents completed every round at their
start-time maximum of 2 and rank 0 turned the new pods away.

They are read over the store pod's HTTP endpoint with the job's token (``GET /replicas``), never from the
TCPStore: a TCPStore has no authentication, so any client reaching its port could set the bounds there
(docs/operator.md, "Threat model").
"""

from __future__ import annotations

import logging
from typing import Any

from etj_contract.replicas import Replicas, replicas_url

log = logging.getLogger(__name__)


READ_TIMEOUT_S = 2.0  # a lost store must not hold up the rendezvous that waits for its replacement


def read_from(progress_url: str, token: str | None = None) -> Replicas | None:
    """The bounds the operator last set on the job's store pod (``progress_url``: its progress endpoint;
    ``token`` defaults to the environment's); None when not set, not reachable or refused: the
    environment's bounds apply meanwhile (the store's own loss is agent/store_link.py's business)."""
    from etj_trainer.core.progress import get_json

    if not progress_url:
        return None
    return Replicas.from_json(get_json(replicas_url(progress_url), timeout=READ_TIMEOUT_S, token=token))


def max_workers(progress_url: str, default: int) -> int:
    """The job's maximum in pods: the operator's latest word, else ``default`` (the environment's, also
    when the store does not answer: admitting fewer joiners is safe, failing the step is not)."""
    bounds = read_from(progress_url)
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

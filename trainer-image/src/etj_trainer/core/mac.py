"""The job's token as a MAC key: every value a rank acts on from the job's store is authenticated.

A TCPStore has no authentication: any client that reaches its port and knows the job's uid (``ETJ_RDZV_ID``
is in every pod's environment) can read and write any key it can name. So the values the resize protocols
act on (join queue entries, tickets, admissions, sizes, recovery records) are *sealed*: ``<hmac>.<value>``,
the HMAC-SHA256 keyed from the job's token over the key's name and the value, so a value is good only under
the name it was written for (the names carry the membership and step, so a value cannot be replayed into
another round either). A reader ``open``s what it reads and treats a bad or missing MAC as absent.

The names themselves live under a namespace derived from the token (``Sealer.name``): a client without the
token cannot even find the keys, so it can neither bump the protocols' counters (the join queue, the
heartbeats: ``add`` carries no MAC) nor occupy a ticket's key before rank 0 writes it. The rendezvous
state (agent/sealed_rendezvous.py) uses the same key derivation and MAC, for its own purpose.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from etj_contract import env as etj_env

log = logging.getLogger(__name__)

_NAMES = b"etj store names v1"
_VALUES = b"etj store values v1"
MAX_SEALED_BYTES = 1 << 20  # a sealed record is a few hundred bytes; anything far bigger is not ours


def derive_key(token: str, purpose: bytes) -> bytes:
    """A key for one use of the job's token (a MAC made for one purpose is no good for another)."""
    return hmac.new(token.encode(), purpose, hashlib.sha256).digest()


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 (hex) over ``parts`` joined by NUL bytes."""
    return hmac.new(key, b"\x00".join(parts), hashlib.sha256).hexdigest().encode()


@dataclass
class Sealer:
    """Seals and opens one job's store values with its token; counts what it refused."""

    namespace: str  # derived from the token and the run id: the store names of this job's protocols
    _key: bytes = field(repr=False)
    refused: int = 0
    _last_warning: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def for_job(cls, token: str, run_id: str) -> Sealer:
        names = mac(derive_key(token, _NAMES), run_id.encode())[:32].decode()
        return cls(names, derive_key(token, _VALUES + b"\x00" + run_id.encode()))

    def name(self, protocol: str, suffix: str = "") -> str:
        """The store key of ``protocol``'s ``suffix`` (``etj-join``, ``etj-hb``...) in the job's namespace."""
        return f"{protocol}/{self.namespace}" + (f"/{suffix}" if suffix else "")

    def seal(self, name: str, value: str) -> str:
        return f"{mac(self._key, name.encode(), value.encode()).decode()}.{value}"

    def open(self, name: str, raw: bytes | str) -> str | None:
        """The value sealed under ``name``; None (counted and logged) when ``raw`` is not."""
        data = raw.encode() if isinstance(raw, str) else raw
        tag, dot, value = data.partition(b".")
        if (
            dot
            and len(data) <= MAX_SEALED_BYTES
            and hmac.compare_digest(tag, mac(self._key, name.encode(), value))
        ):
            try:
                return value.decode()
            except UnicodeDecodeError:
                pass
        self.refuse(name)
        return None

    def refuse(self, name: str) -> None:
        with self._lock:
            self.refused += 1
            now = time.monotonic()
            if now - self._last_warning < 10.0:
                return
            self._last_warning = now
        log.warning(
            "store value %s failed its check (not sealed with the job's token); ignored (%d so far)",
            name,
            self.refused,
        )


_job: dict[tuple[str, str], Sealer] = {}


def job_sealer() -> Sealer:
    """This worker's sealer for its job ($ETJ_PROGRESS_TOKEN, $ETJ_RDZV_ID): one per process, so its
    ``refused`` counts every refusal of the process."""
    token = etj_env.PROGRESS_TOKEN.get(os.environ, "")
    run_id = etj_env.RDZV_ID.get(os.environ, "etj")
    if (token, run_id) not in _job:
        if not token:
            log.warning("no %s: the job's store values are not authenticated", etj_env.PROGRESS_TOKEN.name)
        _job[(token, run_id)] = Sealer.for_job(token, run_id)
    return _job[(token, run_id)]

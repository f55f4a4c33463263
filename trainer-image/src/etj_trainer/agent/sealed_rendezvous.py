"""Nothing from the store runs as code: torch's rendezvous state, sealed with the job's token.

torch's c10d rendezvous backend keeps the rendezvous state in the TCPStore as a base64 *pickle*, and every
agent ``pickle.loads`` it on each sync (``num_nodes_waiting()`` every monitor interval). A TCPStore has no
authentication, so any client that reaches the store's port and knows the job's uid (``ETJ_RDZV_ID`` is in
every pod's environment) could write a pickle of its choosing there and run code inside every agent: the
pods that hold the job's S3 credentials.

``SealedC10dBackend`` is torch's ``RendezvousBackend`` interface over the same store, with each state
written as ``etj1.<version>.<hmac>.<base64 state>``: the HMAC-SHA256 (keyed from the job's token, over the
run id, the version and the base64 text) is checked *before* anything is decoded, so unauthenticated bytes
are never base64-decoded, let alone unpickled. The version grows with every write (compare-and-set makes
the chain linear), so an old sealed state replayed by a tokenless client is refused too.

A value that fails the check is not an error (an error would escape into torch's agent loop and count as a
worker failure): the agent keeps its last verified state (or a fresh one, before it has seen any) and the
store's current bytes as the compare-and-set token, so the next legitimate write -- the keep-alive, every
``keep_alive_interval`` -- replaces the forgery. A tokenless client can at worst delay the rendezvous.
Pure sealing (``seal``/``unseal``) is separate from the store I/O so the format is table-tested.
"""

from __future__ import annotations

import binascii
import hmac
import logging
import pickle
import time
from base64 import b64decode, b64encode
from typing import Any

from torch.distributed import Store
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token, _RendezvousState

from etj_trainer.core.mac import derive_key, mac

log = logging.getLogger(__name__)

FORMAT = b"etj1"
# torch's own sentinel for "no state yet" (a store read blocks on a missing key, so the key always exists).
NULL_SENTINEL = b"Y2FuaW1hZGFt"
# A sealed state is a few KB per hundred nodes; anything far bigger is not ours and is not even parsed.
MAX_SEALED_BYTES = 16 * 1024 * 1024
_MAX_VERSION_DIGITS = 19


def state_key(token: str) -> bytes:
    """The HMAC key for rendezvous state, derived from the job's token (its own purpose: a MAC made for
    one use of the token is no good for another)."""
    return derive_key(token, b"etj rendezvous state v1")


def _mac(key: bytes, run_id: str, version: int, text: bytes) -> bytes:
    return mac(key, run_id.encode(), b"%d" % version, text)


def seal(key: bytes, run_id: str, version: int, state: bytes) -> bytes:
    text = b64encode(state)
    return b".".join((FORMAT, str(version).encode(), _mac(key, run_id, version, text), text))


def unseal(key: bytes, run_id: str, raw: bytes) -> tuple[int, bytes] | None:
    """(version, state) when ``raw`` was sealed with ``key`` for ``run_id``; None otherwise. The MAC is
    checked before the state is base64-decoded."""
    if len(raw) > MAX_SEALED_BYTES:
        return None
    parts = raw.split(b".", 3)
    if len(parts) != 4 or parts[0] != FORMAT:
        return None
    _, version_text, tag, text = parts
    if not version_text.isdigit() or len(version_text) > _MAX_VERSION_DIGITS:
        return None
    version = int(version_text)
    if not hmac.compare_digest(tag, _mac(key, run_id, version, text)):
        return None
    try:
        return version, b64decode(text, validate=True)
    except binascii.Error:  # sealed by a token holder, so a bug of ours: refused all the same
        return None


class SealedC10dBackend(RendezvousBackend):
    """torch's c10d rendezvous backend with sealed state (see the module docstring)."""

    def __init__(self, store: Store, run_id: str, token: str) -> None:
        if not run_id:
            raise ValueError("The run id must be a non-empty string.")
        self._store = store
        self._run_id = run_id
        self._mac_key = state_key(token)
        # Not torch's key: an agent of an older image (plain pickles) and this one must never share a state.
        self._key = "etj.rendezvous." + run_id
        self._highest = 0  # the newest version verified here; older ones are replays
        self._last_good: bytes | None = None
        self.refused = 0  # values that failed the check (the operator's status may show it)
        self._last_warning = 0.0
        self._call("compare_set", self._key, "", NULL_SENTINEL.decode())

    @property
    def name(self) -> str:
        return "c10d"

    def _call(self, op: str, *args: Any) -> Any:
        try:
            return getattr(self._store, op)(*args)
        except (ValueError, RuntimeError, TimeoutError) as exc:  # as torch's backend: a lost store
            raise RendezvousConnectionError("The connection to the C10d store has failed.") from exc

    def _accept(self, raw: bytes) -> tuple[bytes, Token] | None:
        """The state to hand torch for the store's current ``raw`` value (its token is ``raw`` itself)."""
        if raw == NULL_SENTINEL and self._highest == 0:
            return None  # nobody has written yet
        opened = unseal(self._mac_key, self._run_id, raw) if raw != NULL_SENTINEL else None
        if opened is not None and opened[0] >= self._highest:
            self._highest, self._last_good = opened
            return opened[1], raw
        self.refused += 1
        now = time.monotonic()
        if now - self._last_warning > 10.0:
            self._last_warning = now
            log.warning(
                "rendezvous state on the store failed its check (not sealed with the job's token, or a "
                "replay); ignored (%d so far)",
                self.refused,
            )
        # Our own bytes, never the store's: torch unpickles what we return.
        trusted = self._last_good if self._last_good is not None else pickle.dumps(_RendezvousState())
        return trusted, raw

    def get_state(self) -> tuple[bytes, Token] | None:
        return self._accept(self._call("get", self._key))

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        if token is not None and not isinstance(token, bytes):
            # Not a token of ours (torch's own shortcut): read the current state, the write did not happen.
            current = self.get_state()
            return None if current is None else (*current, False)
        expected = token if token else NULL_SENTINEL
        desired = seal(self._mac_key, self._run_id, self._highest + 1, state)
        # Bytes, not text: the value replaced may be anyone's bytes (not UTF-8), and decoding them would
        # raise into torch's agent loop.
        raw: bytes = self._call("compare_set", self._key, expected, desired)
        accepted = self._accept(raw)
        if accepted is None:
            return None
        return accepted[0], accepted[1], raw == desired

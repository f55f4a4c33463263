"""Nothing from the store is trusted (issue 26): a client that reaches the store's port without the job's
token can neither run code in an agent nor change the world's bounds, and cannot exhaust the store.

Real TCPStores and a real ``etj-train store`` process; the attacker is a plain TCPStore client.
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.trainer.polling import wait_for
from torch.distributed import TCPStore

from etj_contract.replicas import REPLICAS_PATH, Replicas
from etj_trainer.agent.agent_config import AgentConfig
from etj_trainer.agent.local_launcher import free_port
from etj_trainer.agent.rendezvous import make_rendezvous_handler
from etj_trainer.agent.sealed_rendezvous import NULL_SENTINEL, SealedC10dBackend, seal, state_key, unseal
from etj_trainer.core.progress import get_json, post_json
from etj_trainer.resize import bounds
from etj_trainer.service.store_http import ProgressState, make_http_server

TOKEN = "the-jobs-token"
RUN_ID = "0f3c-job-uid"  # ETJ_RDZV_ID: in every pod's environment, so known to an attacker


def _wait_for(pred: Callable[[], bool], timeout: float = 30.0) -> None:
    wait_for(pred, timeout, every=0.05)


class _Payload:
    """What an attacker pickles: unpickling it creates ``marker`` (stands in for os.system)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


# ---- the seal: pure ---------------------------------------------------------------------------------

KEY = state_key(TOKEN)
GOOD = seal(KEY, RUN_ID, 3, b"state bytes")
UNSEAL_CASES: dict[str, tuple[bytes, tuple[int, bytes] | None]] = {
    "sealed with the job's token": (GOOD, (3, b"state bytes")),
    "torch's own format (a base64 pickle)": (b64encode(pickle.dumps({"round": 1})), None),
    "a raw pickle": (pickle.dumps({"round": 1}), None),
    "sealed with another token": (seal(state_key("guess"), RUN_ID, 3, b"state bytes"), None),
    "sealed for another job": (seal(KEY, "other-job", 3, b"state bytes"), None),
    "state changed after sealing": (GOOD.replace(b64encode(b"state bytes"), b64encode(b"state bytez")), None),
    "version changed after sealing": (GOOD.replace(b"etj1.3.", b"etj1.9.", 1), None),
    "not a version": (GOOD.replace(b"etj1.3.", b"etj1.x.", 1), None),
    "empty": (b"", None),
}


@pytest.mark.parametrize("case", list(UNSEAL_CASES), ids=list(UNSEAL_CASES))
def test_unseal(case: str) -> None:
    raw, expected = UNSEAL_CASES[case]
    assert unseal(KEY, RUN_ID, raw) == expected


class _DictStore:
    """The two operations the backend uses, with a TCPStore's compare_set semantics."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def get(self, key: str) -> bytes:
        return self.values[key]

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        exp = expected.encode() if isinstance(expected, str) else expected
        want = desired.encode() if isinstance(desired, str) else desired
        current = self.values.get(key)
        if (current is None and exp == b"") or (current is not None and current == exp):
            self.values[key] = want
        return self.values[key]


def test_a_replayed_older_state_is_refused_and_the_next_write_replaces_it() -> None:
    store = _DictStore()
    backend = SealedC10dBackend(store, RUN_ID, TOKEN)  # type: ignore[arg-type]
    key = "etj.rendezvous." + RUN_ID
    assert backend.get_state() is None  # nobody has written yet
    first = backend.set_state(b"round 1")
    assert first is not None and first[0] == b"round 1" and first[2]
    old = store.values[key]
    second = backend.set_state(b"round 2", first[1])
    assert second is not None and second[0] == b"round 2" and second[2]
    store.values[key] = old  # a tokenless client replays the older sealed state
    state, token = backend.get_state() or (None, None)
    assert state == b"round 2" and backend.refused == 1  # the last verified state, not the replay
    third = backend.set_state(b"round 3", token)
    assert third is not None and third[2], "the next write must replace the replay"
    assert unseal(state_key(TOKEN), RUN_ID, store.values[key]) == (3, b"round 3")
    store.values[key] = NULL_SENTINEL  # "no state yet" once there was one is a reset: refused too
    assert (backend.get_state() or (None,))[0] == b"round 3"


# ---- the attack on a real store and torch's real rendezvous handler -----------------------------------


def test_a_pickled_rendezvous_state_from_a_tokenless_client_runs_no_code(tmp_path: Path) -> None:
    """The attack of issue 26: a client with no token writes a pickle as the rendezvous state; the agent's
    next ``num_nodes_waiting()`` must not unpickle it, and the agent must still form its world."""
    port = free_port()
    host = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, use_libuv=True)
    cfg = AgentConfig(
        endpoint=f"127.0.0.1:{port}", run_id=RUN_ID, min_nodes=1, max_nodes=2, last_call_timeout=0.5,
        token=TOKEN,
    )  # fmt: skip
    handler, _ = make_rendezvous_handler(cfg)
    assert handler.num_nodes_waiting() == 0

    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Payload(marker))
    attacker = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    for key in ("torch.rendezvous." + RUN_ID, "etj.rendezvous." + RUN_ID):  # torch's key and ours
        attacker.set(key, b64encode(evil).decode())
    backend = handler._state_holder._backend  # torch-private: where the agent's state comes from

    def read_the_forgery() -> bool:
        handler.num_nodes_waiting()  # what torch's agent loop calls every monitor interval
        return marker.exists() or getattr(backend, "refused", 0) > 0

    _wait_for(read_the_forgery)
    assert not marker.exists(), "the store's bytes ran as code in the agent"

    # Garbage that is not even base64 or UTF-8 must not raise into torch's agent loop (a counted worker
    # failure), neither when read nor when the agent's next write names it as the value it replaces.
    attacker.set("etj.rendezvous." + RUN_ID, b"\xff\xfe not base64 \x00")
    refused = backend.refused
    _wait_for(lambda: handler.num_nodes_waiting() == 0 and backend.refused > refused)

    # At worst a delay: the agent still forms its world on the same store.
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert not marker.exists()
    handler.shutdown()
    del host


# ---- the replica bounds --------------------------------------------------------------------------------


@contextmanager
def _store(*args: str) -> Iterator[tuple[subprocess.Popen[bytes], int, str]]:
    """``etj-train store`` on loopback with ``args``: the process, its TCPStore port, its progress URL."""
    port, http_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "etj_trainer.cli", "store", "--host", "127.0.0.1",
           "--port", str(port), "--http-port", str(http_port), *args]  # fmt: skip
    proc = subprocess.Popen(cmd, env={**os.environ, "ETJ_PROGRESS_TOKEN": TOKEN})
    url = f"http://127.0.0.1:{http_port}/progress"
    try:
        _wait_for(lambda: get_json(url, token=TOKEN) is not None)
        yield proc, port, url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def store_proc() -> Iterator[tuple[subprocess.Popen[bytes], int, str]]:
    with _store("--max-open-files", "128") as running:
        yield running


def test_bounds_written_without_the_token_are_ignored(store_proc: Any) -> None:
    """Issue 26: a tokenless client set ``etj/replicas=1:1`` straight in the TCPStore and every agent
    took it. The bounds now live in the store pod's memory behind the token."""
    _, port, url = store_proc
    attacker = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    attacker.set("etj/replicas", "1:1")  # the old key, as the attack wrote it
    assert bounds.read_from(url, token=TOKEN) is None  # nothing said by the operator: the env's bounds
    replicas = url.replace("/progress", REPLICAS_PATH)
    with pytest.raises(urllib.error.HTTPError) as refused:
        post_json(replicas, {"min": 1, "max": 1}, token="")
    assert refused.value.code == 401
    post_json(replicas, {"min": 1, "max": 4}, token=TOKEN)  # the operator's word
    attacker.set("etj/replicas", "1:1")
    assert bounds.read_from(url, token=TOKEN) == Replicas(1, 4)
    assert bounds.read_from(url, token="guess") is None  # and the bounds are not read without it


def _closed_within(socks: list[socket.socket], seconds: float) -> int:
    """How many of ``socks`` the peer closes within ``seconds`` (poll(): select() ends at descriptor 1024)."""
    poller = select.poll()
    open_ = {s.fileno(): s for s in socks}
    for fd in open_:
        poller.register(fd, select.POLLIN)
    closed = 0
    deadline = time.monotonic() + seconds
    while open_ and time.monotonic() < deadline:
        for fd, _ in poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
            poller.unregister(fd)
            try:
                closed += open_.pop(fd).recv(1) == b""
            except ConnectionResetError:
                closed += 1
    return closed


def _a_new_client_gets(port: int, key: str, value: bytes) -> bool:
    try:
        c = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=2))
        return c.get(key) == value
    except Exception:
        return False


def test_the_store_caps_its_tcpstore_connections_and_serves_on(store_proc: Any) -> None:
    """A client opening connections without end meets the store's descriptor limit (torch's libuv server
    accepts and closes past it); a job's client already connected is served all along, and new ones once
    it ends."""
    _, port, _ = store_proc
    job = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    job.set("k", "v")
    flood: list[socket.socket] = []
    try:
        for _ in range(400):  # over the limit of 128
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            flood.append(s)
        # The ones past the limit are closed by the store: they turn readable with EOF (or a reset).
        closed = _closed_within(flood[200:], seconds=10.0)
        assert closed == 200, "the store kept connections past its limit"
        assert job.get("k") == b"v"  # the job's own connection is served meanwhile
    finally:
        for s in flood:
            s.close()

    _wait_for(lambda: _a_new_client_gets(port, "k", b"v"))


def test_the_poll_server_caps_its_tcpstore_connections_and_serves_on() -> None:
    """torch's poll()-based TCPStore server (the store image's torch has no libuv) aborted the whole store
    when accept() met the descriptor limit: a flood past ``--max-open-files`` killed it (exit 134 here, 139
    in the store image) and every agent lost the world (issue 26). Behind the store's relay the connections
    past the cap are closed at once, and the store serves the job's client and new ones."""
    limit = 512
    with _store("--no-libuv", "--max-open-files", str(limit)) as (proc, port, url):
        job = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        job.set("k", "v")
        flood: list[socket.socket] = []
        try:
            for _ in range(limit + 100):  # past the limit itself, not only the cap under it
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            # Each relayed connection costs the store three descriptors: at most a third of them are kept.
            assert _closed_within(flood, seconds=10.0) >= len(flood) - limit // 3
            assert proc.poll() is None, f"the store exited ({proc.returncode}) under the flood"
            assert job.get("k") == b"v"  # the job's own connection is served meanwhile
        finally:
            for s in flood:
                s.close()
        _wait_for(lambda: _a_new_client_gets(port, "k", b"v"))
        assert get_json(url, token=TOKEN) is not None and proc.poll() is None


def test_the_http_endpoint_caps_its_connections() -> None:
    """Idle connections past the cap get no thread each (the oldest are dropped for the newest, issue 37);
    once they go, requests are served."""
    httpd = make_http_server("127.0.0.1", 0, ProgressState(), TOKEN, max_connections=4, max_pending=4)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
    try:
        _wait_for(lambda: threading.active_count() >= before + 4)
        time.sleep(0.5)  # what is being checked is that nothing more happens: give it the chance
        assert threading.active_count() <= before + 4, "a thread per connection past the cap"
    finally:
        for s in idle:
            s.close()
    ok = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=20).read()
    assert ok == b"ok"
    httpd.shutdown()
    httpd.server_close()

"""Every request of the operator's API client has a timeout (issue 26): a hung apiserver connection fails
the call, which the retry loop handles, instead of stalling the job's loop for good."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client

from etj_operator.k8s.kube_api import TimedApiClient


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An 'apiserver' that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    srv.close()


def _call_in_thread(api: client.ApiClient) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def call() -> None:
        try:
            client.CoreV1Api(api).read_namespaced_pod("p", "ns")
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    return t, raised


def _config(host: str) -> client.Configuration:
    cfg = client.Configuration()
    cfg.host = host
    cfg.retries = False  # urllib3's own retries would only multiply the wait
    return cfg


def test_a_hung_call_times_out(silent_server: str) -> None:
    t, raised = _call_in_thread(TimedApiClient(_config(silent_server), timeout=(1.0, 1.0)))
    t.join(60)  # generous: the point is that it ends at all
    assert not t.is_alive(), "the call hung past its timeout"
    assert raised and "timed out" in str(raised[0]).lower(), raised


def test_the_plain_client_would_hang(silent_server: str) -> None:
    """The control arm: without the wrapper the same call is still waiting well past that timeout."""
    t, raised = _call_in_thread(client.ApiClient(_config(silent_server)))
    t.join(5)
    assert t.is_alive() and not raised


def test_an_explicit_timeout_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []
    monkeypatch.setattr(
        client.ApiClient, "call_api", lambda self, *a, **kw: seen.append(kw["_request_timeout"])
    )
    api = TimedApiClient(_config("http://127.0.0.1:9"), timeout=(1.0, 2.0))
    api.call_api("/x", "GET", _request_timeout=None)
    api.call_api("/x", "GET", _request_timeout=7)
    assert seen == [(1.0, 2.0), 7]

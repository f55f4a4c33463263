"""A torch built without libuv (Debian's python3-torch, which the small store image runs) still serves the
store: ``open_store`` falls back to torch's poll()-based server on the same listening socket (issue 26)."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import DistStoreError, TCPStore

from etj_trainer.service import store_server


def _listener() -> tuple[int, int]:
    sock = socket.create_server(("127.0.0.1", 0))
    return sock.getsockname()[1], sock.detach()


def test_without_libuv_the_store_serves_on_its_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []

    def no_libuv_torch(*args: Any, **kwargs: Any) -> TCPStore:
        asked.append(kwargs["use_libuv"])
        if kwargs["use_libuv"]:  # what Debian's torch says
            raise DistStoreError("use_libuv was requested but PyTorch was built without libuv support")
        return TCPStore(*args, **kwargs)

    monkeypatch.setattr(store_server, "TCPStore", no_libuv_torch)
    port, fd = _listener()
    server = store_server.open_store("127.0.0.1", port, fd)
    assert asked == [True, False]
    client = TCPStore(
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    client.set("k", "v")
    assert server.store.get("k") == b"v" and client.add("n", 2) == 2
    assert server.relay is not None  # the poll()-based server is reached through the relay (issue 26)
    server.close()


def test_other_store_errors_are_not_taken_for_a_missing_libuv(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> TCPStore:
        raise DistStoreError("address in use")

    monkeypatch.setattr(store_server, "TCPStore", broken)
    port, fd = _listener()
    try:
        with pytest.raises(DistStoreError, match="address in use"):
            store_server.open_store("127.0.0.1", port, fd)
    finally:
        socket.socket(fileno=fd).close()

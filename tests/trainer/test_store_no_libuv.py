"""A torch built without libuv (Debian's python3-torch, which the small store image runs) still serves the
store: ``open_store`` falls back to torch's poll()-based server on the same listening socket (issue 26)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
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


# ---- the clients: every TCPStore client the trainer opens works on a torch without libuv -------------


NO_LIBUV = "use_libuv was requested but PyTorch was built without libuv support, run with USE_LIBUV=0"


@pytest.fixture
def no_libuv_torch(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real store on this torch, then TCPStore as Debian's python3-torch behaves: it refuses
    ``use_libuv=True`` (its default) for a client too. Found on kind with the Debian CPU trainer image: every
    agent took that refusal for a store still starting and waited for it until its start-up deadline.
    Yields the store's endpoint."""
    import importlib

    import torch.distributed as dist

    # the module (torch.distributed.rendezvous is also the name of a function in torch.distributed)
    env_rendezvous = importlib.import_module("torch.distributed.rendezvous")

    real = dist.TCPStore
    server = real("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def debian_tcpstore(*args: Any, **kwargs: Any) -> TCPStore:
        if kwargs.get("use_libuv", True):
            raise DistStoreError(NO_LIBUV)
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "TCPStore", debian_tcpstore)
    monkeypatch.setattr(env_rendezvous, "TCPStore", debian_tcpstore)  # init_process_group's env:// client
    yield f"127.0.0.1:{server.port}"
    del server


def test_the_agents_rendezvous_client_needs_no_libuv(no_libuv_torch: str) -> None:
    from etj_trainer.agent.agent_config import AgentConfig
    from etj_trainer.agent.rendezvous import make_rendezvous_handler

    cfg = AgentConfig(endpoint=no_libuv_torch, run_id="nolibuv", min_nodes=1, max_nodes=2)
    handler, store = make_rendezvous_handler(cfg)
    store.set("k", "v")
    assert store.get("k") == b"v" and handler.get_run_id() == "nolibuv"


def test_the_resize_clients_need_no_libuv(no_libuv_torch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from etj_contract import env as etj_env
    from etj_trainer.resize import join, recover

    monkeypatch.setenv(etj_env.RDZV_ENDPOINT.name, no_libuv_torch)
    assert join.door_open(no_libuv_torch, "nolibuv") is False
    join._client().set("j", "1")
    assert recover._client().get("j") == b"1"


@pytest.mark.parametrize("agent_store", [True, False], ids=["agent-store", "rank0-hosts"])
def test_a_workers_first_group_needs_no_libuv(
    no_libuv_torch: str, monkeypatch: pytest.MonkeyPatch, agent_store: bool
) -> None:
    """torch elastic's workers meet through env://: on the agent's store (TORCHELASTIC_USE_AGENT_STORE, which
    torch's env:// opens with TCPStore's default), or on one rank 0 hosts."""
    import torch.distributed as dist

    from etj_contract import env as etj_env
    from etj_trainer.resize import group_sockets, regroup

    host, _, port = no_libuv_torch.rpartition(":")
    if not agent_store:
        port = str(_listener_port())
    for name, value in {"MASTER_ADDR": host, "MASTER_PORT": port, "RANK": "0", "WORLD_SIZE": "1",
                        "TORCHELASTIC_USE_AGENT_STORE": str(agent_store)}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(etj_env.RDZV_ENDPOINT.name, no_libuv_torch)
    group_sockets.init_first()
    try:
        assert dist.get_world_size() == 1
        regroup.reform("nolibuv-1", new_rank=0, new_world=1)  # a regroup's client, same store
        assert dist.get_world_size() == 1
    finally:
        dist.destroy_process_group()


def _listener_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])

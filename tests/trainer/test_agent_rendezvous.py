"""The etj agent's rendezvous tuning: sub-second polls and last call on torch's own c10d handler."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous import utils as rdzv_utils

from etj_trainer.agent import AgentConfig, make_rendezvous_handler, patch_rendezvous_poll


@pytest.fixture
def restore_delay() -> Iterator[None]:
    original = dr._delay
    yield
    dr._delay = original


def test_rendezvous_polls_use_the_configured_interval(
    restore_delay: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(rdzv_utils.time, "sleep", slept.append)
    assert patch_rendezvous_poll(0.1)
    assert patch_rendezvous_poll(0.05)  # patching twice wraps torch's original, not our wrapper
    dr._delay(seconds=1)  # what torch's op executor calls between state polls
    dr._delay(seconds=0.25)  # any other delay is left alone
    assert slept == [0.05, 0.25]


def test_handler_takes_a_sub_second_last_call() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    cfg = AgentConfig(
        endpoint=f"127.0.0.1:{store.port}", run_id="t", min_nodes=1, max_nodes=4, last_call_timeout=0.5
    )
    handler = make_rendezvous_handler(cfg)
    assert handler.settings.timeout.last_call.total_seconds() == 0.5
    assert (handler.settings.min_nodes, handler.settings.max_nodes) == (1, 4)
    assert handler.settings.keep_alive_interval.total_seconds() == cfg.keep_alive_interval

"""The etj agent's rendezvous tuning: sub-second polls and last call on torch's own c10d handler."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous import utils as rdzv_utils

from etj_trainer.agent.agent_config import AgentConfig
from etj_trainer.agent.rendezvous import make_rendezvous_handler, patch_rendezvous_poll
from etj_trainer.agent.worker import preload_modules


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
    handler, _ = make_rendezvous_handler(cfg)
    assert handler.settings.timeout.last_call.total_seconds() == 0.5
    assert (handler.settings.min_nodes, handler.settings.max_nodes) == (1, 4)
    assert handler.settings.keep_alive_interval.total_seconds() == cfg.keep_alive_interval


PRELOADS = {
    "in-memory data, etj model: no DALI, no torchvision": (
        {"ETJ_DATA": "digits-tensor", "ETJ_MODEL": "etj_trainer.classifier.models:tiny_mlp"},
        {"etj_trainer.classifier.models"},
        {"nvidia.dali", "torchvision"},
    ),
    "JPEG folders and a torchvision model": (
        {"ETJ_DATA": "/data/train", "ETJ_MODEL": "resnet50"},
        {"nvidia.dali", "etj_trainer.data.dali_input", "torchvision"},
        set(),
    ),
    "defaults (no env): the default model's module": ({}, {"etj_trainer.classifier.models"}, {"torchvision"}),
    "only validation data on disk still needs DALI": (
        {"ETJ_DATA": "digits-tensor", "ETJ_VAL_DATA": "digits"},
        {"nvidia.dali"},
        set(),
    ),
}


@pytest.mark.parametrize("case", list(PRELOADS), ids=list(PRELOADS))
def test_preload_follows_the_job(case: str) -> None:
    env, present, absent = PRELOADS[case]
    mods = preload_modules(env)
    assert mods[:2] == [
        "etj_trainer.agent._forkserver_dies_with_agent",
        "etj_trainer.agent._forkserver_ignore_sigterm",
    ]
    assert "etj_trainer.classifier.trainer" in mods
    assert present <= set(mods) and not (absent & set(mods))


def test_the_first_round_waits_for_every_warm_agent_then_the_job_minimum_is_back() -> None:
    """first_round_min_nodes sets torch's (frozen, private) min_nodes, which its join op reads on every
    poll, and the bound puts the job's minimum back (a guard: this fails if torch renames the setting)."""
    import threading

    from etj_trainer.agent.rendezvous import first_round_min_nodes

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    cfg = AgentConfig(endpoint=f"127.0.0.1:{store.port}", run_id="t2", min_nodes=1, max_nodes=4)
    handler, _ = make_rendezvous_handler(cfg)
    restored = threading.Event()
    first_round_min_nodes(handler, 3, cfg.min_nodes, bound_s=0.05)
    assert handler.settings.min_nodes == 3
    while handler.settings.min_nodes != 1:  # the bound's timer puts the job's minimum back
        restored.wait(0.01)
    first_round_min_nodes(handler, 1, cfg.min_nodes, bound_s=0.05)  # alone: nothing to wait for
    assert handler.settings.min_nodes == 1

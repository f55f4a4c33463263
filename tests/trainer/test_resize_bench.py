"""bench/resize_pause.py's arms really differ where they claim to (regression: -noshare was the default)."""

from __future__ import annotations

from pathlib import Path

from bench.resize_pause import _joined_at, arm_env


def test_noshare_arm_disables_the_shared_agent_store_and_others_do_not() -> None:
    assert arm_env("torchrun-defaults-noshare") == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert arm_env("torchrun-defaults") == {} and arm_env("etj") == {}


def test_join_time_is_read_from_the_agent_log(tmp_path: Path) -> None:
    log = tmp_path / "worker-2.log"
    log.write_text("etj-train worker: torchrun\netj-train worker: joining the rendezvous at 1795388237.125")
    assert _joined_at(log) == 1795388237.125
    log.write_text("torchrun output only\n")
    assert _joined_at(log) is None


def test_an_in_place_joiners_time_is_read_too(tmp_path: Path) -> None:
    log = tmp_path / "worker-3.log"
    log.write_text("etj-train worker: joining the running world in place at 1795473635.267\n")
    assert _joined_at(log) == 1795473635.267

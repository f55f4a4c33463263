"""In-process resize (regroup.py): the decision table, the SIGTERM stop codes, and the real thing.

The last test runs the real trainer in 3 gloo ranks; rank 2 leaves gracefully at step 30 and the other
two re-form the world in place (no restart, no checkpoint restore) and train on to step 110. With the
fixed global batch that run must end with the same parameters as a fixed 2-worker run.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from etj_testbed.worldsim import run_world
from etj_trainer.checkpoint.store import load_latest
from etj_trainer.classifier.trainer import StopFlag
from etj_trainer.config import TrainConfig
from etj_trainer.core import world
from etj_trainer.core.stopping import StopCode
from etj_trainer.resize.regroup import Regroup, decide

R, L, X, A = StopCode.RUN, StopCode.LEAVING, StopCode.RESTARTING, StopCode.ADMIT

DECISIONS = {
    "one of two leaves: the other goes on alone": ([R, L], 1, True, Regroup((0,), True, "graceful leave")),
    "rank 0 leaves: rank 1 becomes rank 0": ([L, R, R], 1, True, Regroup((1, 2), True, "graceful leave")),
    "a whole 2-GPU node leaves": ([R, R, L, L], 2, True, Regroup((0, 1), True, "graceful leave")),
    "a whole 2-process pod leaves though only one of its ranks saw the signal this step": (
        [R, R, R, L],
        2,
        True,
        Regroup((0, 1), True, "graceful leave"),
        2,
    ),
    "one rank of each of two 2-process pods: both pods leave, below the minimum": (
        [L, R, R, L, R, R],
        3,
        True,
        Regroup((4, 5), False, "2 surviving ranks < minimum 3"),
        2,
    ),
    "a joiner is coming: everyone restarts": (
        [X, L, R],
        1,
        True,
        Regroup((2,), False, "an agent is restarting its workers (a node is joining)"),
    ),
    "everyone leaves": ([L, L], 1, True, Regroup((), False, "every rank is leaving")),
    "rank 0 admits joiners: everyone goes on": (
        [A, R, R],
        1,
        True,
        Regroup((0, 1, 2), True, "admit joiners", True),
    ),
    "a leave goes first; the joiners wait one more step": (
        [A, L, R],
        1,
        True,
        Regroup((0, 2), True, "graceful leave"),
    ),
    "a restarting agent wins over an admission": (
        [A, X],
        1,
        True,
        Regroup((0,), False, "an agent is restarting its workers (a node is joining)"),
    ),
    "below the minimum: torch elastic waits for capacity": (
        [R, L, L],
        2,
        True,
        Regroup((0,), False, "1 surviving ranks < minimum 2"),
    ),
    "no etj agent / external store": (
        [R, L],
        1,
        False,
        Regroup((0,), False, "in-process resize disabled (no etj agent or external store)"),
    ),
}


@pytest.mark.parametrize("case", list(DECISIONS), ids=list(DECISIONS))
def test_decide(case: str) -> None:
    codes, min_ranks, enabled, expected, *procs = DECISIONS[case]
    assert decide([int(c) for c in codes], min_ranks, enabled, *procs) == expected


def test_the_choice_is_logged_with_its_reason() -> None:
    assert decide([R, L], 1, True).describe() == "in place (graceful leave)"
    assert decide([X, R], 1, True).describe() == (
        "restart the world (an agent is restarting its workers (a node is joining))"
    )


def test_new_ranks_keep_the_survivors_order() -> None:
    d = decide([L, R, L, R], 1, True)
    assert [d.new_rank(r) for r in d.survivors] == [0, 1] and d.survivors == (1, 3)


@pytest.mark.parametrize(("state", "code"), [("running", L), ("restarting", X), (None, L)])
def test_sigterm_code_follows_the_agent_state_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str | None, code: StopCode
) -> None:
    path = tmp_path / "agent.state"
    if state is not None:
        path.write_text(state)
    monkeypatch.setenv("ETJ_AGENT_STATE_FILE", str(path))
    # install() makes this flag the process's (world.installed()); put the old one back after the test, or a
    # later Job in this process (test_custom_loop's plain script) takes the requested flag and stops at once
    monkeypatch.setattr(world, "_installed", world.installed())
    old = signal.getsignal(signal.SIGTERM)
    try:
        flag = StopFlag()
        flag.install()
        assert flag.code == R and not flag.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.requested and flag.code == code
    finally:
        signal.signal(signal.SIGTERM, old)


def test_graceful_leave_regroups_in_process_and_matches_a_fixed_run(
    tiny_cfg: TrainConfig, tmp_path: Path
) -> None:
    total = 110
    fixed = replace(tiny_cfg, max_steps=total, checkpoint_dir=tmp_path / "fixed", local_checkpoint_dir=None)
    run_world(fixed, 2)

    elastic = replace(
        tiny_cfg, max_steps=total, checkpoint_dir=tmp_path / "elastic", local_checkpoint_dir=tmp_path / "shm"
    )
    done = run_world(elastic, 3, leave_at={2: 30})
    # the leaver stopped at step 30; the two survivors finished the run themselves, as a world of 2
    assert [line.split()[0] for line in done] == [str(total), str(total), "30"]
    assert [line.split()[2] for line in done[:2]] == ["2", "2"]

    loaded = load_latest(tmp_path / "elastic")
    assert loaded is not None and loaded.step == total
    (resize,) = loaded.state["meta"]["resizes"]
    assert (resize["from"], resize["to"], resize["stepsLost"]) == (3, 2, 0)
    a = dict(load_latest(tmp_path / "fixed").state["model"])  # type: ignore[union-attr]
    b = dict(loaded.state["model"])
    num = max(float((a[k] - b[k]).abs().max()) for k in a)
    den = max(float(a[k].abs().max()) for k in a)
    assert num / den <= 1e-4, f"max relative difference {num / den:.3e}"
    assert max(float(v.abs().max()) for v in b.values()) > 0 and torch.isfinite(next(iter(b.values()))).all()

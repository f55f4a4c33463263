"""Rung 0 of the porting ladder (issue 47): a stock torchrun script runs unchanged under etj.

The script (tests/trainer/stock_ddp/multinode.py) is written as pytorch/examples' DDP tutorial is: its own
``init_process_group``, a sibling module, a DistributedSampler, a snapshot file. Under the default launcher
it is refused with a sentence naming the launcher it needs; under ``ETJ_LAUNCHER=Torchrun`` it trains, and
every membership change (a leave, a kill, a join) restarts its workers, which resume from its snapshot.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from etj_contract import env as etj_env
from etj_trainer.agent.local_launcher import ScheduleEvent, local_agents
from etj_trainer.agent.worker_process import OWN_GROUP_REFUSED, refusing_own_process_group, run_script

STOCK = Path(__file__).resolve().parent / "stock_ddp"
SCRIPT = STOCK / "multinode.py"


def test_a_script_runs_as_python_runs_it_with_its_folder_on_the_path(tmp_path: Path) -> None:
    """`python train.py` puts train.py's folder first on sys.path: its sibling modules import (the
    tutorial's `from datautils import ...` failed with ModuleNotFoundError under etj)."""
    (tmp_path / "helper_mod_47.py").write_text("VALUE = 47\n")
    script = tmp_path / "train.py"
    out = tmp_path / "out.txt"
    script.write_text(
        "import sys\nfrom helper_mod_47 import VALUE\n"
        f"open({str(out)!r}, 'w').write(f'{{VALUE}} {{sys.argv[1:]}} {{__name__}}')\n"
    )
    path_before = list(sys.path)
    run_script([str(script), "--epochs", "2"])
    assert out.read_text() == "47 ['--epochs', '2'] __main__"
    assert sys.path == path_before  # the worker's own path is back
    sys.modules.pop("helper_mod_47", None)


def test_a_script_that_forms_its_own_group_under_the_etj_launcher_is_told_which_launcher_it_needs() -> None:
    """Under the loop API's launcher the worker has formed the group: the script's init_process_group is
    refused with a sentence naming trainer.launcher Torchrun, not torch's "initialize ... twice"."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    original = dist.init_process_group
    with refusing_own_process_group(), pytest.raises(RuntimeError) as refused:
        from torch.distributed import init_process_group  # as the tutorial imports it, after the swap

        init_process_group(backend="gloo")
    assert str(refused.value) == OWN_GROUP_REFUSED
    assert "launcher: Torchrun" in OWN_GROUP_REFUSED and "docs/porting.md" in OWN_GROUP_REFUSED
    assert dist.init_process_group is original and distributed_c10d.init_process_group is original


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait(what: str, predicate: Any, cluster: Any, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if not cluster.alive():
            break
        time.sleep(0.2)
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted(cluster.log_dir.glob("worker-*")))
    raise AssertionError(f"timed out waiting for {what}; worker logs:\n{logs}")


@pytest.mark.slow
def test_the_ddp_tutorial_runs_unchanged_through_a_leave_a_kill_and_a_join(tmp_path: Path) -> None:
    """3 agents; a graceful leave, a SIGKILL and a join, each once the world before it has trained two
    epochs. Every change restarts the script (torch elastic's behaviour: a new restart count, the world's
    new size in RANK and WORLD_SIZE), it resumes from its own snapshot each time, the spot notice's grace
    reaches it as ETJ_SIGTERM_GRACE_SECONDS, and the job finishes with every agent exiting 0."""
    record, snapshot = tmp_path / "record.jsonl", tmp_path / "snapshot.pt"
    epochs = 40
    argv = [str(SCRIPT), str(epochs), "1", "--batch_size", "16", "--snapshot", str(snapshot)]
    argv += ["--record", str(record), "--batch-seconds", "0.1"]
    env = {
        etj_env.LAUNCHER.name: "Torchrun",
        etj_env.SCRIPT.name: json.dumps(argv),
        etj_env.MAX_WORKERS.name: "3",
    }

    def starts(world: int) -> list[dict[str, Any]]:
        return [r for r in _records(record) if r["event"] == "start" and r["world"] == world]

    def trained(world: int, after: int, epochs_at_world: int = 2) -> bool:
        """Rank 0 of a world of ``world`` has trained ``epochs_at_world`` epochs past record ``after``."""
        rows = _records(record)[after:]
        return sum(1 for r in rows if r["event"] == "epoch" and r["world"] == world and r["rank"] == 0) >= (
            epochs_at_world
        )

    with local_agents(3, env, tmp_path / "logs") as cluster:
        _wait("3 ranks training", lambda: trained(3, 0), cluster)
        for action, world in (("-", 2), ("!", 1), ("+", 2)):
            mark = len(_records(record))
            cluster.apply(ScheduleEvent(0, action, 1))
            _wait(f"{action}1: a world of {world} trains", lambda w=world, m=mark: trained(w, m), cluster)
        codes = [a.wait(timeout=300) for a in cluster.agents]

    rows = _records(record)
    # every world of the schedule started, each new one from the script's own snapshot
    for world in (3, 2, 1):
        assert starts(world), f"no world of {world}: {rows}"
    first, *later = [r for r in rows if r["event"] == "start" and r["rank"] == 0]
    assert first["resumed"] is None and all(r["resumed"] is not None for r in later), rows
    restarts = [int(r["env"]["TORCHELASTIC_RESTART_COUNT"]) for r in [first, *later]]
    assert restarts == sorted(restarts) and restarts[-1] >= 1, restarts
    for r in (r for r in rows if r["event"] == "start"):
        assert r["env"]["WORLD_SIZE"] == str(r["world"]) and int(r["env"]["RANK"]) == r["rank"]
        assert int(r["env"]["ETJ_SIGTERM_GRACE_SECONDS"]) > 0
    # resumed from the snapshot each time: no epoch before the newest snapshot is trained again
    last_epoch = max(r["epoch"] for r in rows if r["event"] == "epoch")
    assert last_epoch == epochs - 1
    # newest first: agent 2 left (its agent's exit after a SIGTERM), agent 1 was killed, agent 3 joined
    assert codes == [0, -signal.SIGKILL, 128 + signal.SIGTERM, 0], codes

"""torch elastic's environment after an in-place resize (issue 47, rung 2): what each rank's RANK,
WORLD_SIZE, GROUP_RANK... must say in the new world (pure), and that forming a group publishes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etj_contract import env as etj_env
from etj_trainer.core.world_env import publish, world_env

ENDPOINT = {"ETJ_RDZV_ENDPOINT": "train-rdzv.ns.svc:29400"}

CASES = {
    # name: (rank, world, LOCAL_WORLD_SIZE, env the agent left, expected)
    "a survivor of a leave, 2 ranks a node": (
        2, 4, "2", {"RANK": "4", "WORLD_SIZE": "6", **ENDPOINT},
        {"RANK": "2", "WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "2",
         "ROLE_WORLD_SIZE": "4", "MASTER_ADDR": "train-rdzv.ns.svc", "MASTER_PORT": "29400"},
    ),
    "a joiner, which torch's agent never started": (
        2, 3, "1", dict(ENDPOINT),
        {"RANK": "2", "WORLD_SIZE": "3", "GROUP_RANK": "2", "GROUP_WORLD_SIZE": "3", "ROLE_RANK": "2",
         "ROLE_WORLD_SIZE": "3", "MASTER_ADDR": "train-rdzv.ns.svc", "MASTER_PORT": "29400"},
    ),
    "an IPv6 store": (
        0, 1, "1", {"ETJ_RDZV_ENDPOINT": "[fd00::5]:29400"},
        {"RANK": "0", "WORLD_SIZE": "1", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": "0",
         "ROLE_WORLD_SIZE": "1", "MASTER_ADDR": "fd00::5", "MASTER_PORT": "29400"},
    ),
    "no job store (a test's world): MASTER_* stay the agent's": (
        1, 2, "1", {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"},
        {"RANK": "1", "WORLD_SIZE": "2", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "1",
         "ROLE_WORLD_SIZE": "2"},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_world_env(name: str) -> None:
    rank, world, local, env, expected = CASES[name]
    assert world_env(rank, world, {**env, "LOCAL_WORLD_SIZE": local}) == expected


def test_publish_overwrites_the_stale_world_and_keeps_the_rest() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "TORCHELASTIC_RUN_ID": "job", **ENDPOINT}
    publish(1, 2, env)
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "0"
    assert env["LOCAL_RANK"] == "1" and env["TORCHELASTIC_RUN_ID"] == "job"


@pytest.mark.slow
def test_every_rank_reads_the_new_world_from_its_environment_after_each_resize(tmp_path: Path) -> None:
    """A loop-API script on 2 agents through a join (step 10), a graceful leave (step 30) and a SIGKILL
    (step 50), all in place: at every step of every rank, RANK and WORLD_SIZE say what the default group
    says, GROUP_RANK and ROLE_* agree with them, MASTER_* name the job's store after a re-form, and the
    joiner has torch elastic's whole environment (it had no RANK or WORLD_SIZE at all)."""
    from etj_trainer.agent.local_launcher import parse_schedule, run_local

    probe = Path(__file__).resolve().parent / "env_probe.py"
    out = tmp_path / "env"
    env = {
        etj_env.SCRIPT.name: json.dumps([str(probe), str(out)]),
        etj_env.EPOCHS.name: "8",  # 22 steps an epoch: ~176 steps of >= 0.25 s, the joiner's start fits
        etj_env.MIN_STEP_SECONDS.name: "0.25",
        etj_env.MAX_WORKERS.name: "3",
        etj_env.PEER_DEAD_AFTER_S.name: "3",  # a survivor starved of CPU on a loaded machine is not dead
    }
    # wait_whole: each event waits for the world the one before it makes (seen in a loaded clean-clone run:
    # the leave hit the joiner while it was still importing, and the world never grew)
    result = run_local(
        2, parse_schedule("10:+1,30:-1,50:!1"), env, tmp_path / "logs", timeout_s=600, wait_whole=True
    )
    assert result.get("finished") is True, result
    assert [(r["from"], r["to"]) for r in result["resizes"]] == [(2, 3), (3, 2), (2, 1)]  # type: ignore[index]
    rows = [json.loads(line) for f in sorted(tmp_path.glob("env.*")) for line in f.read_text().splitlines()]
    assert {r["world"] for r in rows} == {1, 2, 3}
    endpoint = env_of_logs(tmp_path / "logs")
    for r in rows:
        e = r["env"]
        assert (e["RANK"], e["WORLD_SIZE"]) == (str(r["rank"]), str(r["world"])), r
        assert (e["ROLE_RANK"], e["ROLE_WORLD_SIZE"]) == (e["RANK"], e["WORLD_SIZE"]), r
        assert e["GROUP_RANK"] == e["RANK"] and e["GROUP_WORLD_SIZE"] == e["WORLD_SIZE"], r  # 1 rank a node
        assert e["LOCAL_RANK"] == "0" and e["LOCAL_WORLD_SIZE"] == "1", r
        assert e["ROLE_NAME"] == "trainer" and e["TORCHELASTIC_RUN_ID"], r
    joined = min(r["step"] for r in rows if r["world"] == 3)  # every world from the join on formed in place
    resized = [r for r in rows if r["step"] > joined]
    masters = {f"{r['env']['MASTER_ADDR']}:{r['env']['MASTER_PORT']}" for r in resized}
    assert resized and masters == {endpoint}, masters
    pids = {r["pid"] for r in rows}
    assert len(pids) == 3, "a worker restarted: these resizes are in place"


def env_of_logs(logs: Path) -> str:
    """The job store's endpoint, as etj-train local wrote it for the pods' spec (job.env)."""
    lines = dict(line.split("=", 1) for line in (logs / "job.env").read_text().splitlines() if "=" in line)
    return lines["ETJ_RDZV_ENDPOINT"]

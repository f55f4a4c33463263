"""End to end on loopback: etj-train store + worker agents, scaled 2 -> 1 -> 2 by the local launcher."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from etj_trainer.agent.local_launcher import LocalAgents, ScheduleEvent, parse_schedule, run_local
from etj_trainer.core.sample_log import consumed_per_epoch


def test_parse_schedule() -> None:
    evs = parse_schedule("40:-1, 10:+2,70:!1,5:^4")
    assert [(e.step, e.action, e.count) for e in evs] == [
        (5, "^", 4),
        (10, "+", 2),
        (40, "-", 1),
        (70, "!", 1),
    ]
    with pytest.raises(ValueError):
        parse_schedule("10:*1")


def test_a_hard_kill_after_a_leave_hits_a_node_still_in_the_world(tmp_path: Path) -> None:
    # regression: `10:-1,20:!1` under load SIGKILLed the agent that was still shutting down after its
    # SIGTERM (the newest *alive* one), so no rank of the world died and nothing was recovered
    slow_to_leave = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
        "time.sleep(60)"
    )
    agents = LocalAgents(env={}, log_dir=tmp_path)
    for _ in range(3):
        p = subprocess.Popen(
            [sys.executable, "-c", slow_to_leave], stdout=subprocess.PIPE, start_new_session=True
        )
        assert p.stdout is not None and p.stdout.readline()  # its SIGTERM handler is in place
        agents.agents.append(p)
    try:
        agents.apply(ScheduleEvent(10, "-", 1))
        agents.apply(ScheduleEvent(20, "!", 1))
        newest, middle, oldest = agents.agents[2], agents.agents[1], agents.agents[0]
        assert middle.wait(timeout=10) == -signal.SIGKILL
        assert newest.poll() is None and oldest.poll() is None  # still leaving; still training
    finally:
        for p in agents.agents:
            p.kill()
            p.wait()


@pytest.mark.slow
def test_scale_down_and_up_keeps_exactly_once(tmp_path: Path) -> None:
    # 6 epochs x 45 steps, throttled to >= 0.15 s/step: the joiner started at step 40 has ~30 s to import
    # torch and join before training ends (on a heavily loaded 2-core machine 2 epochs were not enough).
    samples = tmp_path / "samples"
    env = {**_tiny_job(samples, epochs=6, min_step_seconds=0.15), "ETJ_VAL_DATA": "digits-tensor"}
    result = run_local(2, parse_schedule("20:-1,40:+1"), env, tmp_path / "logs", timeout_s=600)
    assert result.get("finished") is True, result
    assert [(r["from"], r["to"]) for r in result["resizes"]] == [(2, 1), (1, 2)]  # type: ignore[index]
    # the graceful 2 -> 1 happened in the survivor's process (regroup.py), the 1 -> 2 too (join.py)
    logs = "".join(f.read_text(errors="replace") for f in (tmp_path / "logs").glob("worker-*.log"))
    assert "resizing 2->1 in process" in logs and "resizing 1->2 in process" in logs
    assert isinstance(result.get("accuracy"), float) and result["accuracy"] > 0.8  # type: ignore[operator]
    _assert_exactly_once(samples, epochs=6)


@pytest.mark.slow
def test_a_hard_kill_takes_the_whole_node_and_the_world_shrinks(tmp_path: Path) -> None:
    # regression (issue 14): `!K` killed only the agent; its forkserver and worker trained on as a full
    # rank, so the world never shrank and the crash path was never exercised
    samples = tmp_path / "samples"
    env = _tiny_job(samples, epochs=3, min_step_seconds=0.1)
    result = run_local(2, parse_schedule("15:!1"), env, tmp_path / "logs", timeout_s=600)
    assert result.get("finished") is True, result
    assert [(r["from"], r["to"]) for r in result["resizes"]] == [(2, 1)]  # type: ignore[index]
    _assert_exactly_once(samples, epochs=3)  # through the crash too


@pytest.mark.slow
def test_the_first_world_waits_for_a_node_that_starts_late(tmp_path: Path) -> None:
    # regression (issue 16, and a clean-clone run on a loaded machine): the second node joined the
    # rendezvous more than last_call (1 s) after the first, so the job started at 1 and restarted at 2
    samples = tmp_path / "samples"
    env = _tiny_job(samples, epochs=1, min_step_seconds=0.0)
    result = run_local(2, [], env, tmp_path / "logs", timeout_s=600, stagger_s=6.0)
    assert result.get("finished") is True, result
    assert result["resizes"] == [] and result["worldSize"] == 2, result  # type: ignore[index]
    logs = (tmp_path / "logs" / "worker-0.log").read_text(errors="replace")
    assert "start-up: 2 of 2 workers arrived" in logs
    _assert_exactly_once(samples, epochs=1)


@pytest.mark.slow
def test_dynamic_sgd_multiplier_is_one_at_the_minimum_with_two_procs_per_node(tmp_path: Path) -> None:
    # regression (issue 14): the batch plan divided globalBatchSize by the minimum in pods and multiplied by
    # the world in ranks, so a pod of 2 processes trained at the minimum with a 2x batch and a 2x LR
    samples = tmp_path / "samples"
    env = {
        **_tiny_job(samples, epochs=1, min_step_seconds=0),
        "ETJ_RESIZE_POLICY": "DynamicSGD",
        "ETJ_MAX_STEPS": "4",
        "ETJ_MAX_WORKERS": "1",
    }
    result = run_local(1, [], env, tmp_path / "logs", timeout_s=600, procs_per_node=2)
    assert result.get("finished") is True, result
    assert result["worldSize"] == 2  # ranks: 1 node x 2 processes, the job's minimum
    assert result["lrMultiplier"] == 1.0
    # globalBatchSize (32) is the batch at the minimum: 4 steps of 32 samples, 16 per rank
    assert sum(len(ids) for ids in consumed_per_epoch(samples).values()) == 4 * 32


# 2 nodes x 2 processes (issue 14): a pod's ranks come and go together. Float64 and FixedGlobalBatch, so
# the run must end where one process training the same steps ends (<= 1e-9 relative), every sample once.


@pytest.mark.slow
def test_two_by_two_a_whole_node_leaves_in_place_and_one_joins(tmp_path: Path) -> None:
    # 6 epochs x 45 steps at >= 0.15 s: the node started at step 30 has ~35 s to join (as the 1x1 test).
    # The trainer counts ranks: both of the leaving pod's ranks went at once, and the joiner brought two.
    result = _two_by_two(tmp_path, "12:-1,30:+1", epochs=6, min_step_seconds=0.15, resizes=[(4, 2), (2, 4)])
    logs = "".join(f.read_text(errors="replace") for f in (tmp_path / "logs").glob("worker-*.log"))
    assert "resizing 4->2 in process" in logs and "resizing 4->3" not in logs
    assert result["worldSize"] == 4 and result["perRankBatch"] == 8 and result["perWorkerBatch"] == 16


@pytest.mark.slow
def test_two_by_two_a_hard_kill_takes_both_ranks_of_the_node(tmp_path: Path) -> None:
    # through the crash and the restore from the local copy
    _two_by_two(tmp_path, "15:!1", epochs=3, min_step_seconds=0.1, resizes=[(4, 2)])


def _two_by_two(
    tmp_path: Path, schedule: str, epochs: int, min_step_seconds: float, resizes: list[tuple[int, int]]
) -> dict[str, object]:
    """2 nodes x 2 processes under ``schedule``: it finishes with these resizes (in ranks), every sample
    once per epoch, and the parameters of one process training the same job."""
    samples = tmp_path / "samples"
    env = {**_tiny_job(samples, epochs, min_step_seconds), "ETJ_DTYPE": "float64"}
    result = run_local(2, parse_schedule(schedule), env, tmp_path / "logs", 600, procs_per_node=2)
    assert result.get("finished") is True, result
    assert [(r["from"], r["to"]) for r in result["resizes"]] == resizes  # type: ignore[index]
    _assert_exactly_once(samples, epochs)
    _assert_matches_one_process(env, tmp_path)
    return result


def _assert_matches_one_process(env: dict[str, str], tmp_path: Path) -> None:
    """The elastic run's final parameters equal those of one process training the same job (float64)."""
    from etj_testbed.worldsim import run_world
    from etj_trainer.checkpoint.store import load_latest
    from etj_trainer.config import TrainConfig

    fixed = TrainConfig.from_env(
        env,
        checkpoint_dir=tmp_path / "fixed",
        local_checkpoint_dir=None,
        sample_log_dir=None,
        min_step_seconds=0.0,
    )
    run_world(fixed, 1)
    a, b = load_latest(tmp_path / "fixed"), load_latest(tmp_path / "logs" / "checkpoints")
    assert a is not None and b is not None and a.step == b.step
    pa, pb = a.state["model"], b.state["model"]
    rel = max(float((pa[k] - pb[k]).abs().max()) for k in pa) / max(float(pa[k].abs().max()) for k in pa)
    assert rel <= 1e-9, f"max relative difference {rel:.3e}"


@pytest.mark.slow
def test_a_join_while_the_world_restarts_below_its_minimum_takes_the_rendezvous(tmp_path: Path) -> None:
    # regression (the replay bed's ckpt_restart arm, replicas 2..2): the leave left 1 rank < minimum 2, the
    # world stopped to restart through the rendezvous, and the replacement found the in-place door still
    # open -- it queued to be admitted by a world that no longer ran, while the survivor waited for it in
    # the rendezvous: the job stood still
    samples = tmp_path / "samples"
    env = {**_tiny_job(samples, epochs=2, min_step_seconds=0.1), "ETJ_MIN_WORKERS": "2"}
    result = run_local(2, parse_schedule("10:-1,10:+1"), env, tmp_path / "logs", timeout_s=600)
    assert result.get("finished") is True, result
    logs = {f.name: f.read_text(errors="replace") for f in (tmp_path / "logs").glob("worker-*.log")}
    assert "restart the world (1 surviving ranks < minimum 2)" in "".join(logs.values())
    # the joiner took the rendezvous: it found the door shut, or saw it shut while it queued
    joiner = logs["worker-2.log"]
    assert "asking to be admitted" not in joiner or "not admitted: the door shut" in joiner, joiner
    _assert_exactly_once(samples, epochs=2)


@pytest.mark.slow
def test_kubectl_scale_grows_the_running_world(tmp_path: Path) -> None:
    # issue 15: a job of at most 2 scaled to 4 while it runs. The running agents and rank 0 started with a
    # maximum of 2 in their environment: without the operator's bounds on the store, rank 0 turned the new
    # nodes away and the old agents completed every rendezvous round at 2, so the world never grew.
    samples = tmp_path / "samples"
    env = _tiny_job(samples, epochs=4, min_step_seconds=0.15)
    result = run_local(2, parse_schedule("10:^4,10:+2"), env, tmp_path / "logs", timeout_s=600)
    assert result.get("finished") is True, result
    sizes = [(r["from"], r["to"]) for r in result["resizes"]]  # type: ignore[index]
    # grown to 4, in one resize or two (the new nodes may come ready apart), and never shrunk
    assert sizes and sizes[-1][1] == 4 and all(b > a for a, b in sizes), sizes
    assert result["agentExitCodes"] == [0, 0, 0, 0], result
    _assert_exactly_once(samples, epochs=4)


def _tiny_job(samples: Path, epochs: int, min_step_seconds: float) -> dict[str, str]:
    """A 2-node digits job small enough for the suite, logging which samples each step used."""
    return {
        "ETJ_DATA": "digits-tensor",
        "ETJ_MODEL": "etj_trainer.classifier.models:tiny_mlp",
        "ETJ_EPOCHS": str(epochs),
        "ETJ_GLOBAL_BATCH_SIZE": "32",
        "ETJ_MICRO_BATCH_SIZE": "16",
        "ETJ_MIN_STEP_SECONDS": str(min_step_seconds),
        "ETJ_SAMPLE_LOG_DIR": str(samples),
        "ETJ_MAX_WORKERS": "2",
    }


def _assert_exactly_once(samples: Path, epochs: int) -> None:
    per_epoch = consumed_per_epoch(samples)
    assert sorted(per_epoch) == list(range(epochs))
    for ids in per_epoch.values():
        assert sorted(ids) == list(range(1438))  # every training sample exactly once per epoch

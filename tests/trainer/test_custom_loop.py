"""Your own training loop (issue 14 item 4): examples/custom-loop/train.py, a plain PyTorch script on
``etj_trainer.elastic``, trains under etj with every guarantee of the built-in trainer."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

from etj_trainer import elastic
from etj_trainer.agent.local_launcher import parse_schedule, run_local
from etj_trainer.checkpoint.store import load_latest
from etj_trainer.config import TrainConfig
from etj_trainer.core.sample_log import consumed_per_epoch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom-loop" / "train.py"
N = 2048  # the example's dataset size


def _tiny(tmp_path: Path, **kw: object) -> TrainConfig:
    return TrainConfig(
        global_batch_size=48,
        micro_batch_size=10,  # 48 over 1 rank: 5 micro-batches of 9-10; over 2: 3 of 8
        epochs=1,
        seed=1,
        lr=0.05,
        dtype="float64",
        local_checkpoint_dir=tmp_path / "shm",
        checkpoint_dir=tmp_path / "ckpt",
        **kw,  # type: ignore[arg-type]
    )


def _loop(job: elastic.Job, x: torch.Tensor, y: torch.Tensor) -> None:
    torch.manual_seed(0)
    model = job.setup_model(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    )
    model.double()
    job.setup_optimizer(elastic.DynamicSGD(model.parameters(), lr=job.config.lr, ramp_steps=5, momentum=0.9))
    for step in job.steps():
        for micro in step.micro_batches():
            ids = torch.from_numpy(micro.ids)
            step.backward(torch.nn.functional.cross_entropy(model(x[ids]), y[ids], reduction="sum"))
        step.optimizer_step()


def test_the_api_trains_exactly_once_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    """One process: a run stopped at step 5 and resumed equals an uninterrupted run, bit for bit, and every
    sample of the epoch is trained on exactly once."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (100,), generator=g)
    with elastic.Job(
        100, _tiny(tmp_path, max_steps=2, sample_log_dir=tmp_path / "log"), stop=elastic.StopFlag()
    ) as job:
        _loop(job, x, y)
    assert job.steps_done == 2 and not job.stopped_early
    with elastic.Job(100, _tiny(tmp_path, sample_log_dir=tmp_path / "log"), stop=elastic.StopFlag()) as job:
        _loop(job, x, y)
    assert job.steps_done == 3  # 48 + 48 + 4: an epoch's short last step
    resumed = load_latest(tmp_path / "ckpt")
    other = tmp_path / "straight"
    with elastic.Job(100, _tiny(other), stop=elastic.StopFlag()) as job:
        _loop(job, x, y)
    straight = load_latest(other / "ckpt")
    assert resumed is not None and straight is not None
    for k, v in straight.state["model"].items():
        torch.testing.assert_close(resumed.state["model"][k], v, rtol=0, atol=0)
    assert sorted(consumed_per_epoch(tmp_path / "log")[0]) == list(range(100))


def test_the_api_refuses_a_plain_optimizer_under_dynamic_sgd(tmp_path: Path) -> None:
    job = elastic.Job(10, _tiny(tmp_path, resize_policy="DynamicSGD"), stop=elastic.StopFlag())
    model = job.setup_model(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="DynamicSGD"):
        job.setup_optimizer(torch.optim.AdamW(model.parameters()))


def test_the_example_runs_as_a_plain_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python train.py` with no etj around: one process, the script's own defaults."""
    monkeypatch.setenv("ETJ_MAX_STEPS", "30")
    monkeypatch.setenv("ETJ_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--hidden", "16"])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("ETJ_RESULT "))
    result = json.loads(line.removeprefix("ETJ_RESULT "))
    assert result["step"] == 30 and result["worldSize"] == 1
    assert result["accuracy"] > 0.5  # four well separated clusters: training worked


@pytest.mark.slow
def test_the_example_is_resized_in_place_and_keeps_exactly_once(tmp_path: Path) -> None:
    """`etj-train local --script examples/custom-loop/train.py` on 3 agents: one leaves at step 10, one is
    SIGKILLed at step 20 (the survivor redoes the step it was in), one joins at step 35 -- all three in
    place, in the script's own processes (rank 0 starts once); every sample of every epoch exactly once,
    read by the example's DataLoader (a worker process per rank, reopened on each resize) and trained with
    PyTorch's default mean loss."""
    samples = tmp_path / "samples"
    env = {
        "ETJ_SCRIPT": json.dumps([str(EXAMPLE), "--hidden", "32"]),
        "ETJ_EPOCHS": "5",  # 160 steps of >= 0.2 s: the joiner started at step 35 has >= 25 s to join
        "ETJ_GLOBAL_BATCH_SIZE": "64",
        "ETJ_MICRO_BATCH_SIZE": "16",
        "ETJ_MIN_STEP_SECONDS": "0.2",
        "ETJ_SAMPLE_LOG_DIR": str(samples),
        "ETJ_MAX_WORKERS": "3",
        "ETJ_PEER_DEAD_AFTER_S": "3",  # a survivor starved of CPU on a loaded machine is not dead
    }
    logs = tmp_path / "logs"
    result = run_local(3, parse_schedule("10:-1,20:!1,35:+1"), env, logs, timeout_s=600)
    assert result.get("finished") is True, result
    assert [(r["from"], r["to"]) for r in result["resizes"]] == [(3, 2), (2, 1), (1, 2)]  # type: ignore[index]
    text = "".join(f.read_text(errors="replace") for f in sorted(logs.glob("worker-*.log")))
    assert text.count("ready at step") == 1, "a worker restarted"
    assert "recovering in place" in text and "joiner warm" in text
    assert "ConfigOverridden" not in text  # the example's keywords agree with the environment given here
    assert isinstance(result.get("accuracy"), float) and result["accuracy"] > 0.5  # type: ignore[operator]
    per_epoch = consumed_per_epoch(samples)
    assert sorted(per_epoch) == list(range(5))
    for ids in per_epoch.values():
        assert sorted(ids) == list(range(N))


def test_progress_reports_samples_total_for_the_deadline_policy(tmp_path: Path) -> None:
    """samplesTotal (epochs x dataset size) goes out with samplesSeen: the operator projects the finish."""
    from etj_trainer.loop.report import progress

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (100,), generator=g)
    with elastic.Job(100, _tiny(tmp_path, max_steps=2), stop=elastic.StopFlag()) as job:
        _loop(job, x, y)
        doc = progress(job._engine)
    assert doc["samplesTotal"] == 100 * job.config.epochs
    assert 0 < doc["samplesSeen"] <= doc["samplesTotal"]

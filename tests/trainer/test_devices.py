"""devices.py (issue 24): which backend carries which tensors, which GPU a rank binds, the CUDA generators
in a step's undo and in checkpoints, no host sync per micro-batch, and one place that spells a backend.

No GPU here: the CUDA calls are stubbed by ``FakeCuda`` (a simulated node), the code paths are the real ones.
The process-group behaviour itself, with real collectives, is in test_gpu_placement.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from etj_trainer import elastic
from etj_trainer.agent.local_launcher import run_local
from etj_trainer.checkpoint.store import decode, encode
from etj_trainer.config import TrainConfig
from etj_trainer.core import devices
from etj_trainer.core.rng import StepUndo, capture_rng, restore_rng

SRC = Path(devices.__file__).parents[1]  # etj_trainer


# ---- the backend -------------------------------------------------------------------------------------------

BACKENDS = {
    "a CPU node: gloo for everything": (None, "gloo"),
    "cpu named explicitly": ("cpu", "gloo"),
    "a GPU node: gloo for control tensors, NCCL for device tensors": ("cuda", "cpu:gloo,cuda:nccl"),
}


@pytest.mark.parametrize("accelerator,want", BACKENDS.values(), ids=BACKENDS.keys())
def test_backend_for(accelerator: str | None, want: str) -> None:
    assert devices.backend_for(accelerator) == want


@pytest.mark.parametrize("accelerator", sorted(devices.ACCELERATOR_BACKENDS))
def test_every_accelerator_group_has_a_cpu_backend_for_the_control_traffic(accelerator: str) -> None:
    pairs = dict(p.split(":") for p in devices.backend_for(accelerator).split(","))
    assert pairs["cpu"] == devices.CONTROL_BACKEND and accelerator in pairs


def test_one_function_spells_the_backend() -> None:
    """Every process group of the trainer comes from devices.process_group_backend (its docstring), by way
    of group_sockets.init."""
    spelled = re.compile(r"""["'](nccl|gloo)["']|init_process_group\(\s*["']""")
    offenders = [
        p.name for p in SRC.rglob("*.py") if p.name != "devices.py" and spelled.search(p.read_text())
    ]
    assert offenders == []


# ---- a simulated GPU node ----------------------------------------------------------------------------------


class FakeCuda:
    """``count`` GPUs, each with a generator state that a draw changes; records set_device."""

    def __init__(self, count: int) -> None:
        self.count, self.current, self.set_calls = count, 0, list[int]()
        self.states = [torch.full((16,), i, dtype=torch.uint8) for i in range(count)]

    def install(self, mp: pytest.MonkeyPatch) -> FakeCuda:
        c = torch.cuda
        mp.setattr(c, "is_available", lambda: True)
        mp.setattr(c, "device_count", lambda: self.count)
        mp.setattr(c, "set_device", self._set_device)
        mp.setattr(c, "current_device", lambda: self.current)
        mp.setattr(c, "get_rng_state_all", lambda: [s.clone() for s in self.states])
        mp.setattr(c, "set_rng_state_all", self._set_all)
        mp.setattr(c, "get_rng_state", lambda device="cuda": self.states[self.current].clone())
        mp.setattr(c, "set_rng_state", self._set_current)
        return self

    def _set_device(self, index: int) -> None:
        self.set_calls.append(index)
        self.current = index

    def _set_all(self, states: list[torch.Tensor]) -> None:
        self.states = [s.clone() for s in states]

    def _set_current(self, state: torch.Tensor, device: Any = "cuda") -> None:
        self.states[self.current] = state.clone()

    def draw(self) -> None:
        """Dropout on every device: each generator moves on."""
        self.states = [s + 1 for s in self.states]


BINDS = {
    "local rank 0 of a 2-GPU pod": (0, 2, "cuda:0", [0]),
    "local rank 1 of a 2-GPU pod": (1, 2, "cuda:1", [1]),
    "local rank 7 of an 8-GPU pod": (7, 8, "cuda:7", [7]),
}


@pytest.mark.parametrize("local_rank,gpus,device,set_calls", BINDS.values(), ids=BINDS.keys())
def test_bind_takes_the_local_ranks_own_gpu(
    monkeypatch: pytest.MonkeyPatch, local_rank: int, gpus: int, device: str, set_calls: list[int]
) -> None:
    cuda = FakeCuda(gpus).install(monkeypatch)
    assert str(devices.bind(local_rank)) == device
    assert cuda.set_calls == set_calls


def test_bind_refuses_a_rank_without_a_gpu_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeCuda(2).install(monkeypatch)
    with pytest.raises(RuntimeError, match=r"procsPerWorker must not exceed resources\.gpu"):
        devices.bind(2)


def test_bind_on_a_cpu_node_touches_no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: pytest.fail("set_device on a CPU node"))
    assert devices.bind(3) == torch.device("cpu")


# ---- the CUDA generators -----------------------------------------------------------------------------------


def test_a_steps_undo_puts_back_every_gpus_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(2).install(monkeypatch)
    before = [s.clone() for s in cuda.states]
    undo = StepUndo.capture(None)
    cuda.draw()  # the failed attempt's dropout
    undo.restore(None)
    assert all(torch.equal(a, b) for a, b in zip(cuda.states, before, strict=True))


def test_the_checkpointed_rng_carries_the_ranks_gpu_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a checkpoint's bytes (weights_only) and back into the restoring rank's own GPU."""
    cuda = FakeCuda(2).install(monkeypatch)
    devices.bind(1)
    saved = cuda.states[1].clone()
    blob = encode({"rng": capture_rng()})
    cuda.draw()
    restore_rng(decode(blob)["rng"])
    assert torch.equal(cuda.states[1], saved)


def test_a_cpu_process_restores_a_gpu_jobs_rng_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeCuda(1).install(monkeypatch)
    rng = decode(encode({"rng": capture_rng()}))["rng"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    restore_rng(rng)  # the CPU generators only; no CUDA call


# ---- no host sync per micro-batch --------------------------------------------------------------------------


class HostCopies(TorchFunctionMode):
    """Counts the calls that copy a tensor to the host (each one a device sync on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in ("cpu", "item", "tolist", "numpy") or (
            name == "to" and any(str(a) == "cpu" for a in (*args[1:], *(kwargs or {}).values()))
        ):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def test_micro_batches_leave_the_loss_on_the_device(tmp_path: Path) -> None:
    """The step's loss crosses to the host once, at the commit: no copy in any micro-batch's backward."""
    cfg = TrainConfig(
        global_batch_size=40, micro_batch_size=10, epochs=1, max_steps=2, seed=1, lr=0.1,
        checkpoint_dir=None, local_checkpoint_dir=None,
    )  # fmt: skip
    x, y = torch.randn(80, 4), torch.randint(0, 3, (80,))
    copies = HostCopies()
    with elastic.Job(80, cfg, stop=elastic.StopFlag()) as job:
        model = job.setup_model(torch.nn.Linear(4, 3))
        job.setup_optimizer(torch.optim.SGD(model.parameters(), lr=cfg.lr))
        for step in job.steps():
            for micro in step.micro_batches():
                ids = torch.from_numpy(micro.ids)
                loss = torch.nn.functional.cross_entropy(model(x[ids]), y[ids], reduction="sum")
                with copies:
                    step.backward(loss)
            step.optimizer_step()
    assert job.steps_done == 2 and job.loss == job.loss  # trained, and the committed loss is a number
    assert copies.calls == []


# ---- nothing deletes what it did not create ----------------------------------------------------------------


def test_local_keeps_a_local_checkpoint_dir_the_caller_named(tmp_path: Path) -> None:
    """`etj-train local` removes only the /dev/shm directory it made itself (it used to rmtree the user's)."""
    mine = tmp_path / "my-local-copies"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    env = {
        "ETJ_DATA": "digits-tensor",
        "ETJ_MODEL": "etj_trainer.classifier.models:tiny_mlp",
        "ETJ_GLOBAL_BATCH_SIZE": "32",
        "ETJ_MICRO_BATCH_SIZE": "32",
        "ETJ_MAX_STEPS": "3",
        "ETJ_LOCAL_CHECKPOINT_DIR": str(mine),
    }
    result = run_local(1, [], env, tmp_path / "logs", timeout_s=300)
    assert result.get("finished") is True, result
    assert (mine / "keep.txt").read_text() == "mine"
    assert any(mine.iterdir())  # and the run's node-local copy is there for the next run

"""The random generators a step draws from, captured and put back in one place.

Two uses, one capture: a step's undo (``StepUndo``, taken by loop/step.py at every step's start: put
back exactly, every visible GPU's generator included, when the step does not commit) and a checkpoint or
a joiner's state (``capture_rng`` and ``restore_rng``: plain containers and tensors only, since
checkpoints are loaded with weights_only=True, and the CUDA generator of this process's own GPU only,
restored into each rank's own GPU).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from etj_trainer.core import devices


@dataclass(frozen=True)
class HostGenerators:
    """torch's CPU generator, numpy's global one and Python's ``random``, as each library returns it."""

    torch: torch.Tensor
    numpy: Any  # np.random.get_state()'s tuple
    python: tuple[Any, ...]  # random.getstate()

    @classmethod
    def capture(cls) -> HostGenerators:
        return cls(torch.get_rng_state(), np.random.get_state(), random.getstate())

    def restore(self) -> None:
        torch.set_rng_state(self.torch)
        np.random.set_state(self.numpy)
        random.setstate(self.python)


def capture_rng() -> dict[str, Any]:
    """The generators as a checkpoint carries them."""
    host = HostGenerators.capture()
    np_state = host.numpy
    version, state, _gauss = host.python
    rng: dict[str, Any] = {
        "torch": host.torch,
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": [*state, version],
    }
    cuda = devices.current_cuda_rng_state()
    if cuda is not None:
        rng["cuda"] = cuda
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    """Put back what ``capture_rng`` returned (from this process or a peer's checkpoint)."""
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    *state, version = rng["python"]
    numpy_state = (kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached)
    HostGenerators(rng["torch"], numpy_state, (version, tuple(state), None)).restore()
    devices.set_current_cuda_rng_state(rng.get("cuda"))


@dataclass
class StepUndo:
    """What a step changes before its commit: the module buffers a forward pass updates (BatchNorm
    statistics, DDP's buffer broadcast) and the RNG. Small next to the parameters; captured every step.
    Here, not in the loop, so benchmarks time and check it alone (bench/step_overhead.py, gpu_check.py)."""

    buffers: list[torch.Tensor]
    rng: HostGenerators
    cuda_rng: list[torch.Tensor]  # every visible GPU's generator (dropout, GPU augmentation)

    @classmethod
    def capture(cls, model: nn.Module | None) -> StepUndo:
        return cls(
            [b.detach().clone() for b in model.buffers()] if model is not None else [],
            HostGenerators.capture(),
            devices.cuda_rng_states(),
        )

    def restore(self, model: nn.Module | None) -> None:
        if model is not None:
            with torch.no_grad():
                for b, saved in zip(model.buffers(), self.buffers, strict=True):
                    b.copy_(saved)
        self.rng.restore()
        devices.set_cuda_rng_states(self.cuda_rng)

"""Where a worker process computes, and which collective backend carries which tensors.

The one place that decides both (no other module spells a backend or picks a device):

* **The process group** always has a CPU backend for the control traffic -- the step's commit (loss and
  stop codes), state agreement and sync to joiners, incarnation ids, object collectives -- which lives in
  host memory. On a GPU node it also has NCCL for the device tensors (DDP's gradient buckets, the model
  state sent to a joiner): ``cpu:gloo,cuda:nccl``, as torchtitan and torchft mix them. A group that is
  NCCL only has no backend for CPU tensors: the first commit would raise "No backend type associated with
  device type cpu", in a world of 1 too. Every resize re-forms the group through ``process_group_backend``,
  so a regrouped, joined or recovered world has the same two backends.
* **One GPU per rank**: ``bind`` makes the local rank's GPU the current CUDA device before any CUDA call,
  so DDP, DALI's ``device_id``, autocast, object collectives and anything allocated without an explicit
  device land on this rank's GPU, not all on cuda:0.
* **The CUDA generators** are part of the RNG state a step's undo, a checkpoint and a joiner's state
  carry: a redone or resumed step draws the same dropout and augmentation randomness as the fixed run.
"""

from __future__ import annotations

import os
from typing import Any

import torch

CONTROL_BACKEND = "gloo"  # CPU tensors: the control traffic
ACCELERATOR_BACKENDS = {"cuda": "nccl"}  # device tensors, per accelerator type


def accelerator_type() -> str | None:
    """The accelerator this process's data-plane collectives run on (None: CPU only)."""
    return "cuda" if torch.cuda.is_available() else None


def backend_for(accelerator: str | None) -> str:
    """The process group's backend string: the control backend for CPU tensors, plus the accelerator's
    own backend for its tensors. Pure."""
    if accelerator is None or accelerator == "cpu":
        return CONTROL_BACKEND
    return f"cpu:{CONTROL_BACKEND},{accelerator}:{ACCELERATOR_BACKENDS[accelerator]}"


def process_group_backend() -> str:
    """What every ``init_process_group`` of a worker uses (first group, regroup, join, recovery)."""
    return backend_for(accelerator_type())


def bind(local_rank: int) -> torch.device:
    """This process's device: the local rank's GPU, made the current CUDA device (idempotent), or the CPU.

    A pod runs ``procsPerWorker`` processes over its ``resources.gpu`` GPUs, one each: a local rank without
    a GPU of its own is a configuration error, said plainly rather than sharing cuda:0.
    """
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise RuntimeError(
            f"local rank {local_rank} has no GPU of its own: {count} visible to this pod; "
            "procsPerWorker must not exceed resources.gpu"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def bind_this_rank() -> torch.device:
    """``bind`` for this process's ``LOCAL_RANK`` (what torch elastic and torchrun set; 0 alone)."""
    return bind(int(os.environ.get("LOCAL_RANK", "0")))


def cuda_rng_states() -> list[torch.Tensor]:
    """Every visible CUDA device's generator state ([] without CUDA): what a step's undo puts back."""
    return list(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else []


def set_cuda_rng_states(states: list[torch.Tensor]) -> None:
    if states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states)


def current_cuda_rng_state() -> torch.Tensor | None:
    """The generator of this process's own GPU: what a checkpoint or a joiner's state carries (rank 0's,
    restored into each rank's own GPU, as the CPU generator's state is)."""
    return torch.cuda.get_rng_state() if torch.cuda.is_available() else None


def set_current_cuda_rng_state(state: Any) -> None:
    """Restore into this process's own GPU; a CPU-only process ignores a GPU job's state (and vice versa)."""
    if state is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state)

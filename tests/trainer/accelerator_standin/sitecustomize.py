"""A GPU node's process group and device binding, stood in for on a CPU machine (test_gpu_placement.py).

Python runs this file at start-up in every process of a test that puts this folder on PYTHONPATH and sets
ETJ_TEST_STANDIN: the store, the agents, their workers, worldsim's ranks. Nothing else loads it.

* The worker asks ``devices.py`` for its backend as on a CUDA node. That node's NCCL is played by gloo
  registered for the ``cuda`` device type only: a CPU tensor given to it raises exactly as under NCCL ("No
  backend type associated with device type cpu"), while the group's own CPU backend serves CPU tensors.
  ``ETJ_TEST_STANDIN=device-only`` gives the group that accelerator backend alone -- what a plain ``nccl``
  group is -- as the control arm that must fail.
* ``devices.bind`` runs for real against a simulated node of ``ETJ_TEST_GPUS`` GPUs (torch.cuda's
  ``is_available``, ``device_count`` and ``set_device`` stubbed for that call only) and appends what it chose
  to ``ETJ_TEST_STANDIN_LOG``: "pid local_rank device set_device-calls group-formed-already". The process
  then computes on the CPU, which is all this machine has.
"""

from __future__ import annotations

import os


def _install(mode: str) -> None:
    import torch
    import torch.distributed as dist

    from etj_trainer.core import devices

    devices.ACCELERATOR_BACKENDS["cuda"] = "gloo"  # NCCL's stand-in: gloo for cuda tensors only
    devices.accelerator_type = lambda: "cuda"
    if mode == "device-only":
        devices.process_group_backend = lambda: "cuda:gloo"

    real_bind, gpus, log = (
        devices.bind,
        int(os.environ.get("ETJ_TEST_GPUS", "1")),
        os.environ.get("ETJ_TEST_STANDIN_LOG", ""),
    )

    def bind(local_rank: int) -> torch.device:
        cuda, calls = torch.cuda, []
        saved = cuda.is_available, cuda.device_count, cuda.set_device
        cuda.is_available, cuda.device_count = (lambda: True), (lambda: gpus)  # type: ignore[assignment]
        cuda.set_device = calls.append  # type: ignore[assignment]
        try:
            chosen = real_bind(local_rank)
        finally:
            cuda.is_available, cuda.device_count, cuda.set_device = saved  # type: ignore[assignment]
        if log:
            with open(log, "a") as f:
                formed = dist.is_available() and dist.is_initialized()
                f.write(f"{os.getpid()} {local_rank} {chosen} {calls} {int(formed)}\n")
        return torch.device("cpu")

    devices.bind = bind


if os.environ.get("ETJ_TEST_STANDIN"):
    _install(os.environ["ETJ_TEST_STANDIN"])

"""What the loop trains and checkpoints, apart from the loop itself: ``TrainState``.

The registered objects (the module, the optimizer and its GradScaler, anything ``job.register``ed), the
sampler, the committed-step counter and the ``meta`` a checkpoint carries, and the last commit's loss and
pace. A step applies its commit here (``TrainState.apply``) and the resize paths sync it (``load_state``),
so neither calls back into the Job or its engine: both hold this object, not the loop.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from etj_trainer.batching.sampler import ElasticSampler
from etj_trainer.core.rng import capture_rng, restore_rng

# Names a checkpoint uses for etj's own state: job.register refuses them.
RESERVED = ("model", "optimizer", "scaler", "sampler", "step", "rng", "meta")


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], /) -> Any: ...


@dataclass
class Pace:
    """The last commit's loss and the training rate: reported. Only the loss outlives a restart (the
    checkpoint's ``meta["last_loss"]``), so that a world restored at the last step reports it, not NaN."""

    loss: float = math.nan
    rate: float = 0.0  # samples a second, smoothed over the last commits
    t_last_commit: float = field(default_factory=time.monotonic)  # the step floor, a failure's timing

    def committed(self, samples: int, loss: float) -> None:
        now = time.monotonic()
        inst = samples / max(now - self.t_last_commit, 1e-9)
        self.rate = 0.8 * self.rate + 0.2 * inst if self.rate else inst
        self.loss, self.t_last_commit = loss, now


@dataclass
class TrainState:
    """See the module docstring. ``steps_done``: committed steps (``Step.number`` is the one in training)."""

    sampler: ElasticSampler
    steps_done: int = 0
    meta: dict[str, Any] = field(default_factory=lambda: {"resizes": [], "samples_seen": 0})
    module: nn.Module | None = None  # the user's module (not its ElasticModule wrapper)
    optimizer: torch.optim.Optimizer | None = None
    scaler: torch.amp.GradScaler | None = None
    extra: dict[str, Stateful] = field(default_factory=dict)  # job.register's
    pace: Pace = field(default_factory=Pace)
    in_commit: bool = False  # the local commit is half done: the state in memory is no step's

    def apply(self, samples: int, lr: float, loss: float) -> None:
        """A step's local commit, after its commit all-reduce: only local work, which no peer's failure
        can interrupt -- the optimizer step, then the counters."""
        assert self.optimizer is not None
        self.in_commit = True
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips the step (and lowers the scale) on inf/nan gradients
            self.scaler.update()
        else:
            self.optimizer.step()
        self.sampler.commit(samples)
        self.steps_done += 1
        self.meta["samples_seen"] = int(self.meta["samples_seen"]) + samples
        self.meta["lr"] = lr
        self.meta["last_loss"] = loss
        self.meta.pop("finished", None)  # a finished job given more steps: its end is another result
        self.in_commit = False
        self.pace.committed(samples, loss)

    def state_dict(self, world_size: int) -> dict[str, Any]:
        """What a checkpoint holds (references to the live tensors: copy before training goes on)."""
        assert self.module is not None and self.optimizer is not None
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            **self.rest_state(world_size),
        }

    def rest_state(self, world_size: int) -> dict[str, Any]:
        """All of the state but the model's and the optimizer's tensors: the same on every rank, so a
        sharded checkpoint (loop/_sharding.py) writes it once beside the shards."""
        state: dict[str, Any] = {
            "sampler": self.sampler.state_dict(),
            "step": self.steps_done,
            "rng": capture_rng(),
            "meta": {**self.meta, "world_size": world_size},
        }
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        state.update({k: v.state_dict() for k, v in self.extra.items()})
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """Put a checkpoint's (or a peer's) state into the registered objects."""
        assert self.module is not None and self.optimizer is not None
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_rest(state)

    def load_rest(self, state: dict[str, Any]) -> None:
        """``rest_state``'s part of a checkpoint into the registered objects."""
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        for k, v in self.extra.items():
            if k in state:
                v.load_state_dict(state[k])
        self.sampler.load_state_dict(state["sampler"])
        restore_rng(state["rng"])
        self.steps_done, self.meta = int(state["step"]), dict(state["meta"])
        self.pace.loss = float(self.meta.get("last_loss", math.nan))

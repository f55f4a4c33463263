"""Dynamic SGD (Lin, Zhang et al. 2019, arXiv:1904.12043) as a ``torch.optim`` optimizer.

When the global batch changes by a factor ``k`` at iteration ``t0``, linear scaling says the LR should be
multiplied by ``k``; jumping there at once destabilises training (the momentum buffer was built at the old
scale). Dynamic SGD instead ramps the multiplier ``gamma_t = 1 + (t - t0)(k - 1)/T`` for ``t0 <= t < t0+T``
and then holds ``k``, keeping the momentum buffer. Generalised here to successive changes: a ramp always
runs from the multiplier in force at ``t0`` to the new target, so a change in the middle of a ramp does
not jump either. Only *increases* ramp: when the batch shrinks the multiplier drops to its new target at
once. A smaller step is never the unstable direction, and ramping down keeps an LR too large for the
smaller batch for T steps -- bench/dynamic_sgd_cnn.py's spot schedule (grow and shrink) measured exactly
that: the jump beat the two-way ramp on final loss (docs/dynamic-sgd.md).

``DynamicSGD`` is a drop-in ``torch.optim.SGD``: use it anywhere, call ``rescale(old_batch, new_batch)``
(or ``set_target``) when the global batch changes. It owns each group's ``lr``: ``base_lr * schedule_factor *
multiplier``. An LR schedule composes through ``set_schedule_factor`` (the trainer sets it before every
step from schedule.py's ``lr_factor`` of the samples seen), not by writing ``lr``: the schedule says where
in training we are, the multiplier how large the batch is now, and the LR in force is their product.

The trainer's targets come from ``batching.plan_step``: the base LR belongs to the batch at the job's
minimum in *ranks* (replicas.min x processes per pod), so the target is ``ranks / min_ranks`` -- exactly 1
at the minimum however many processes a pod runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass
class LinearRamp:
    """Piecewise-linear multiplier schedule; pure arithmetic so it can be tested against the formula."""

    ramp_steps: int
    start_value: float = 1.0
    target: float = 1.0
    t0: int = 0

    def value(self, t: int) -> float:
        if self.ramp_steps <= 0 or t >= self.t0 + self.ramp_steps:
            return self.target
        if t <= self.t0:
            return self.start_value
        return self.start_value + (t - self.t0) * (self.target - self.start_value) / self.ramp_steps

    def retarget(self, t: int, new_target: float) -> None:
        """Ramp from the multiplier in force at ``t`` up to ``new_target``; a lower target applies at once."""
        self.start_value = min(self.value(t), new_target)
        self.target = new_target
        self.t0 = t


class DynamicSGD(torch.optim.SGD):
    """SGD whose LR multiplier ramps linearly after every global-batch change (momentum is kept)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float,
        ramp_steps: int,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
        for group in self.param_groups:
            group.setdefault("base_lr", group["lr"])
        self.ramp = LinearRamp(ramp_steps=ramp_steps)
        self.iteration = 0  # number of completed ``step()`` calls
        self.schedule_factor = 1.0
        self._apply_multiplier()

    @property
    def lr_multiplier(self) -> float:
        """The multiplier the next ``step()`` uses."""
        return self.ramp.value(self.iteration)

    @property
    def lr(self) -> float:
        """The LR the next ``step()`` uses (first group): base LR x schedule factor x multiplier."""
        return float(self.param_groups[0]["base_lr"] * (self.lr_multiplier * self.schedule_factor))

    def set_schedule_factor(self, factor: float) -> None:
        """The LR schedule's factor for the next steps (composes multiplicatively with the ramp)."""
        if factor < 0:
            raise ValueError("schedule factor must not be negative")
        self.schedule_factor = factor
        self._apply_multiplier()

    def set_target(self, target: float) -> None:
        """Ramp from the multiplier in force now to an absolute ``target`` multiplier of ``base_lr``."""
        if target <= 0:
            raise ValueError("target multiplier must be positive")
        if target != self.ramp.target:
            self.ramp.retarget(self.iteration, target)
        self._apply_multiplier()

    def rescale(self, old_global_batch: int, new_global_batch: int) -> None:
        """The global batch changed by ``k = new/old``: ramp towards ``k`` times the current target."""
        self.set_target(self.ramp.target * new_global_batch / old_global_batch)

    def _apply_multiplier(self) -> None:
        m = self.lr_multiplier * self.schedule_factor
        for group in self.param_groups:
            group["lr"] = group["base_lr"] * m

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        self._apply_multiplier()
        loss: float | None = super().step(closure)
        self.iteration += 1
        self._apply_multiplier()
        return loss

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["dynamic_sgd"] = {"iteration": self.iteration, "ramp": asdict(self.ramp)}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sd = dict(state_dict)
        extra = sd.pop("dynamic_sgd", None)
        super().load_state_dict(sd)
        if extra is not None:
            self.iteration = int(extra["iteration"])
            self.ramp = LinearRamp(**extra["ramp"])
        self._apply_multiplier()

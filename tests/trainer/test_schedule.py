"""LR schedules over samples seen (schedule.py) and their composition with the Dynamic SGD multiplier."""

from __future__ import annotations

import math

import pytest
import torch

from etj_trainer.batching.dynamic_sgd import DynamicSGD
from etj_trainer.batching.schedule import LrSchedule, ScheduleType, lr_factor, parse_milestones

RESNET50 = LrSchedule(ScheduleType.STEP, epochs=90, warmup_epochs=5, milestones=(30, 60, 80), gamma=0.1)
COSINE = LrSchedule(ScheduleType.COSINE, epochs=10, warmup_epochs=2, final_lr_fraction=0.1)
POLY = LrSchedule(ScheduleType.POLY, epochs=10, warmup_epochs=0, power=2.0)

# (name, schedule, position before the step, after it, expected factor)
CASES = [
    ("warm-up first step: the position after the step", RESNET50, 0.0, 0.01, 0.01 / 5),
    ("warm-up half way", RESNET50, 2.49, 2.5, 0.5),
    ("warm-up ends exactly at 5 epochs", RESNET50, 4.99, 5.0, 1.0),
    ("after warm-up, before the first milestone", RESNET50, 5.0, 5.01, 1.0),
    ("first milestone: the whole epoch 30 at / 10", RESNET50, 30.0, 30.01, 0.1),
    ("last step of epoch 29 still at full LR", RESNET50, 29.99, 30.0, 1.0),
    ("after the last milestone", RESNET50, 85.0, 85.5, 0.001),
    ("cosine starts at 1 where warm-up ends", COSINE, 2.0, 2.1, 1.0),
    ("cosine half way: (1 + f) / 2", COSINE, 6.0, 6.1, 0.55),
    ("cosine at the end: final fraction", COSINE, 10.0, 10.0, 0.1),
    ("poly half way: (1/2)^2", POLY, 5.0, 5.1, 0.25),
    ("constant", LrSchedule(epochs=3), 1.7, 1.8, 1.0),
]


@pytest.mark.parametrize(("name", "sched", "before", "after", "want"), CASES, ids=[c[0] for c in CASES])
def test_lr_factor(name: str, sched: LrSchedule, before: float, after: float, want: float) -> None:
    assert lr_factor(sched, before, after) == pytest.approx(want, rel=1e-12)


def test_factor_depends_on_samples_seen_not_on_the_step_size() -> None:
    # The same position gives the same factor whatever the batch that got there (a resize under
    # DynamicSGD changes the steps per epoch, not the samples per epoch).
    for before in (0.3, 7.0, 33.3):
        assert lr_factor(RESNET50, before, before + 0.002) == lr_factor(RESNET50, before, before + 0.002)
    assert lr_factor(COSINE, 4.0, 4.01) == lr_factor(COSINE, 4.0, 4.5)  # decay reads the start only


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epochs": 5, "warmup_epochs": 5}, "warmup_epochs"),
        ({"epochs": 10, "milestones": (6, 3)}, "milestones"),
        ({"epochs": 10, "milestones": (3, 3)}, "milestones"),
        ({"epochs": 10, "milestones": (3, 10)}, "milestones"),
        ({"final_lr_fraction": 1.5}, "final_lr_fraction"),
    ],
)
def test_invalid_schedules_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LrSchedule(**kwargs)  # type: ignore[arg-type]


def test_parse_milestones() -> None:
    assert parse_milestones("30,60,80") == (30.0, 60.0, 80.0)
    assert parse_milestones("") == ()
    assert parse_milestones("0.5, 1.5") == (0.5, 1.5)


def test_dynamic_sgd_multiplier_multiplies_the_scheduled_lr() -> None:
    p = torch.nn.Parameter(torch.zeros(2))
    opt = DynamicSGD([p], lr=0.4, ramp_steps=4)
    opt.set_target(2.0)  # the world doubled: ramp 1 -> 2 over 4 steps
    seen = []
    for t in range(6):
        before = t * 0.25
        factor = lr_factor(COSINE, before, before + 0.25)
        opt.set_schedule_factor(factor)
        seen.append(opt.param_groups[0]["lr"])
        assert opt.lr == seen[-1]
        assert seen[-1] == pytest.approx(0.4 * factor * min(2.0, 1 + t / 4), rel=1e-12)
        p.grad = torch.ones(2)
        opt.step()
    assert seen[0] == pytest.approx(0.4 * 0.25 / 2)  # warm-up x multiplier 1
    # the schedule factor is not part of the ramp's state: a restored optimizer gets it from the position
    sd = opt.state_dict()
    opt2 = DynamicSGD([torch.nn.Parameter(torch.zeros(2))], lr=0.4, ramp_steps=4)
    opt2.load_state_dict(sd)
    opt2.set_schedule_factor(0.5)
    assert opt2.lr == pytest.approx(0.4 * 0.5 * 2.0)
    assert not math.isnan(opt2.lr)

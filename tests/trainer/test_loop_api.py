"""The loop API cannot be misused (issue 27 item 5): a mean loss is weighted right or refused, an empty
share is an empty batch etj builds, a DataLoader follows the world, the config has one precedence order
that warns when the environment overrides a script's value, and Dynamic SGD comes from the config in one
call. Issue 40: misuse is refused before it trains wrongly (bad keywords through the config's one
validation, a dataset of another length, a step left early, an optimizer that ignores the config's LR
warned about), ``step.clip_gradients`` and count-weighted micro-batches. Tables of named cases for the pure
parts; the loops in one process and over two gloo ranks."""

from __future__ import annotations

import math
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from etj_trainer import elastic
from etj_trainer.config import TrainConfig
from etj_trainer.core import devices
from etj_trainer.core.sample_log import consumed_per_epoch
from etj_trainer.loop.loader import emptied
from etj_trainer.loop.loss import Reduction, detect, summed

# ---- what a loss is a reduction of -------------------------------------------------------------------------

X = torch.randn(6, 3, dtype=torch.float64)
Y = torch.tensor([0, 1, 2, 0, 1, 2])


def _logits() -> torch.Tensor:
    return X.clone().requires_grad_(True)


DETECTED: dict[str, tuple[Callable[[], torch.Tensor], Reduction | None]] = {
    "cross_entropy, PyTorch's default": (lambda: F.cross_entropy(_logits(), Y), Reduction.MEAN),
    "cross_entropy sum": (lambda: F.cross_entropy(_logits(), Y, reduction="sum"), Reduction.SUM),
    "mse_loss mean": (lambda: F.mse_loss(_logits(), torch.zeros_like(X)), Reduction.MEAN),
    "bce_with_logits sum": (
        lambda: F.binary_cross_entropy_with_logits(_logits(), torch.zeros_like(X), reduction="sum"),
        Reduction.SUM,
    ),
    "Tensor.mean of per-sample losses": (
        lambda: F.cross_entropy(_logits(), Y, reduction="none").mean(),
        Reduction.MEAN,
    ),
    "Tensor.sum": (lambda: F.cross_entropy(_logits(), Y, reduction="none").sum(), Reduction.SUM),
    "two means added": (
        lambda: F.cross_entropy(_logits(), Y) + F.mse_loss(_logits(), torch.zeros_like(X)),
        Reduction.MEAN,
    ),
    "a mean minus a mean": (lambda: _logits().mean() - F.cross_entropy(_logits(), Y), Reduction.MEAN),
    "a mean and a sum added: can't tell": (
        lambda: F.cross_entropy(_logits(), Y) + _logits().pow(2).sum(),
        None,
    ),
    "label smoothing (scaled terms): can't tell": (
        lambda: F.cross_entropy(_logits(), Y, label_smoothing=0.1),
        None,
    ),
    "a mean times the count (a sum written as a mean): can't tell": (
        lambda: F.cross_entropy(_logits(), Y) * len(Y),
        None,
    ),
    "no graph: can't tell": (lambda: torch.tensor(1.0), None),
}


@pytest.mark.parametrize("case", DETECTED)
def test_the_reduction_is_read_from_the_graph_only_where_certain(case: str) -> None:
    make, expected = DETECTED[case]
    assert detect(make()) == expected


def _grad(
    loss_of: Callable[[torch.Tensor], torch.Tensor], samples: int, declared: str | None
) -> torch.Tensor:
    x = _logits()
    summed(loss_of(x), samples, declared).backward()
    assert x.grad is not None
    return x.grad


def _sum_grad() -> torch.Tensor:
    x = _logits()
    F.cross_entropy(x, Y, reduction="sum").backward()
    assert x.grad is not None
    return x.grad


SUM_GRAD = _sum_grad()
TO_SUM: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str | None]] = {
    "a mean, read from the graph": (lambda x: F.cross_entropy(x, Y), None),
    "a sum, read from the graph": (lambda x: F.cross_entropy(x, Y, reduction="sum"), None),
    "per-sample losses": (lambda x: F.cross_entropy(x, Y, reduction="none"), None),
    "a mean, declared": (lambda x: 0.5 * F.cross_entropy(x, Y) + 0.5 * F.cross_entropy(x, Y), "mean"),
    "a sum, declared": (lambda x: F.cross_entropy(x, Y) * len(Y), "sum"),
}


@pytest.mark.parametrize("case", TO_SUM)
def test_every_accepted_loss_gives_the_summed_gradient(case: str) -> None:
    loss_of, declared = TO_SUM[case]
    torch.testing.assert_close(_grad(loss_of, len(Y), declared), SUM_GRAD, rtol=1e-12, atol=1e-12)


REFUSED: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str | None, str]] = {
    "can't tell, not declared": (
        lambda x: F.cross_entropy(x, Y, label_smoothing=0.1),
        None,
        "reduction='mean'",
    ),
    "declared sum, graph says mean": (lambda x: F.cross_entropy(x, Y), "sum", "the loss is a mean"),
    "declared mean, graph says sum": (lambda x: x.sum(), "mean", "the loss is a sum"),
    "neither mean nor sum": (lambda x: F.cross_entropy(x, Y), "max", "not a valid Reduction"),
    "a batch of per-class losses": (lambda x: x.mean(0), None, "scalar loss or one loss per sample"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_loss_etj_cannot_weigh_is_refused_with_what_to_do(case: str) -> None:
    loss_of, declared, message = REFUSED[case]
    with pytest.raises(ValueError, match=message):
        summed(loss_of(_logits()), len(Y), declared)


def test_an_empty_micro_batchs_mean_weighs_nothing_and_leaves_no_nan() -> None:
    lin = torch.nn.Linear(3, 3).double()
    loss = F.cross_entropy(lin(torch.empty(0, 3, dtype=torch.float64)), torch.empty(0, dtype=torch.int64))
    assert loss.isnan()  # what PyTorch gives: the trap
    out = summed(loss, 0)
    out.backward()
    assert float(out.detach()) == 0.0
    assert lin.weight.grad is not None and torch.equal(
        lin.weight.grad, torch.zeros(3, 3, dtype=torch.float64)
    )


# ---- empty batches of the right shape ----------------------------------------------------------------------


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


EMPTIED: dict[str, tuple[Any, Callable[[Any], bool]]] = {
    "a tuple of tensors": (
        (torch.ones(4, 3, 2), torch.ones(4, dtype=torch.int64)),
        lambda e: isinstance(e, tuple) and e[0].shape == (0, 3, 2) and e[1].dtype == torch.int64,
    ),
    "a dict with an array": (
        {"img": torch.ones(2, 5), "mask": np.ones((2, 7))},
        lambda e: (
            e["img"].shape == (0, 5) and isinstance(e["mask"], np.ndarray) and e["mask"].shape == (0, 7)
        ),
    ),
    "a namedtuple": (
        Pair(torch.ones(3, 2), torch.ones(3)),
        lambda e: isinstance(e, Pair) and e.x.shape == (0, 2),
    ),
    "a list of lists": ([[torch.ones(2, 1)]], lambda e: e[0][0].shape == (0, 1)),
}


@pytest.mark.parametrize("case", EMPTIED)
def test_an_empty_batch_keeps_the_structure_shape_and_dtype(case: str) -> None:
    batch, check = EMPTIED[case]
    assert check(emptied(batch))


def test_an_empty_batch_of_something_else_says_what_to_pass() -> None:
    with pytest.raises(TypeError, match="empty="):
        emptied(("a", "b"))


# ---- one precedence order for the config -------------------------------------------------------------------

PRECEDENCE: dict[str, tuple[dict[str, str], dict[str, Any], dict[str, Any], set[str]]] = {
    # name: (environment, Job keywords, expected fields, fields the environment overrode)
    "nothing set: the field defaults": ({}, {}, {"lr": 0.05, "global_batch_size": 64}, set()),
    "a keyword where the environment is silent": ({}, {"lr": 0.2}, {"lr": 0.2}, set()),
    "the environment over a keyword": ({"ETJ_LR": "0.3"}, {"lr": 0.2}, {"lr": 0.3}, {"lr"}),
    "the environment agreeing with a keyword": ({"ETJ_LR": "0.2"}, {"lr": 0.2}, {"lr": 0.2}, set()),
    "operator-set fields too": (
        {"ETJ_GLOBAL_BATCH_SIZE": "128", "ETJ_EPOCHS": "2"},
        {"global_batch_size": 64, "micro_batch_size": 16},
        {"global_batch_size": 128, "micro_batch_size": 16, "epochs": 2},
        {"global_batch_size"},
    ),
    "a path given as text, the same path": (
        {"ETJ_CHECKPOINT_DIR": "/tmp/ck"},
        {"checkpoint_dir": "/tmp/ck"},
        {"checkpoint_dir": Path("/tmp/ck")},
        set(),
    ),
}


@pytest.mark.parametrize("case", PRECEDENCE)
def test_the_environment_comes_before_keywords_before_defaults(case: str) -> None:
    env, keywords, expected, overridden = PRECEDENCE[case]
    cfg, over = TrainConfig.with_defaults(keywords, env)
    assert {k: getattr(cfg, k) for k in expected} == expected
    assert set(over) == overridden


def test_a_keyword_the_environment_overrides_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ETJ_LR", "0.3")
    monkeypatch.setenv("ETJ_LOCAL_CHECKPOINT_DIR", str(tmp_path / "shm"))
    with pytest.warns(elastic.ConfigOverridden, match=r"Job\(lr=0.2\) is overridden by ETJ_LR=0.3"):
        job = elastic.Job(10, lr=0.2, global_batch_size=4, stop=elastic.StopFlag())
    assert job.config.lr == 0.3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same value: nothing to say
        elastic.Job(10, lr=0.3, stop=elastic.StopFlag())


def test_a_config_with_keywords_beside_it_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="used as given"):
        elastic.Job(10, TrainConfig(), lr=0.2, stop=elastic.StopFlag())


# ---- Dynamic SGD from the config ---------------------------------------------------------------------------


def test_dynamic_sgd_comes_from_the_config_in_one_call(tmp_path: Path) -> None:
    cfg = TrainConfig(
        lr=0.2, dsgd_ramp_steps=7, momentum=0.8, nesterov=True, weight_decay=1e-4,
        resize_policy="DynamicSGD", checkpoint_dir=None, local_checkpoint_dir=tmp_path,
    )  # fmt: skip
    job = elastic.Job(10, cfg, stop=elastic.StopFlag())
    model = job.setup_model(torch.nn.Linear(2, 2))
    opt = job.setup_dynamic_sgd(model.parameters())
    assert job._engine.state.optimizer is opt and isinstance(opt, elastic.DynamicSGD)  # registered
    group = opt.param_groups[0]
    assert (group["base_lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (
        0.2,
        0.8,
        True,
        1e-4,
    )
    assert opt.ramp.ramp_steps == 7


# ---- the loops: a mean loss through a DataLoader equals the sum-loss loop ----------------------------------


class Points(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g, dtype=torch.float64)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _cfg(tmp: Path, **kw: Any) -> TrainConfig:
    return TrainConfig(
        global_batch_size=16, micro_batch_size=5, epochs=2, seed=1, lr=0.1, momentum=0.9, dtype="float64",
        checkpoint_dir=tmp / "ckpt", local_checkpoint_dir=tmp / "shm", **kw,
    )  # fmt: skip


def _model(job: elastic.Job, scaler: torch.amp.GradScaler | None = None) -> elastic.ElasticModule:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    model = job.setup_model(net)
    job.setup_dynamic_sgd(model.parameters(), scaler)
    return model


def train_by_ids(job: elastic.Job, data: Points) -> dict[str, torch.Tensor]:
    """The reference: the ids route with a summed loss (what the API took before)."""
    model = _model(job)
    for step in job.steps():
        for micro in step.micro_batches():
            ids = torch.from_numpy(micro.ids)
            step.backward(F.cross_entropy(model(data.x[ids]), data.y[ids], reduction="sum"))
        step.optimizer_step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_by_loader(job: elastic.Job, data: Points, **loader_args: Any) -> dict[str, torch.Tensor]:
    """A PyTorch user's loop: a DataLoader, PyTorch's default (mean) loss, no empty-batch code."""
    model = _model(job)
    loader = job.loader(data, **loader_args)
    for step in job.steps():
        for x, y in step.batches(loader):
            step.backward(F.cross_entropy(model(x), y))
        step.optimizer_step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-9, atol=0)


def test_a_mean_loss_through_a_dataloader_equals_the_summed_loop(tmp_path: Path) -> None:
    """One process, 2 epochs of 49 samples in steps of 16 (each epoch ends in a step of 1), micro-batches
    of at most 5 read by a DataLoader with a worker: the same weights as the ids route with a summed loss,
    within 1e-9, and every sample once per epoch."""
    data = Points(49)
    with elastic.Job(49, _cfg(tmp_path / "ids"), stop=elastic.StopFlag()) as job:
        ref = train_by_ids(job, data)
    cfg = _cfg(tmp_path / "loader", sample_log_dir=tmp_path / "log")
    with elastic.Job(49, cfg, stop=elastic.StopFlag()) as job:
        got = train_by_loader(job, data, num_workers=1)
    assert job.steps_done == 8
    _close(got, ref)
    assert {e: sorted(ids) for e, ids in consumed_per_epoch(tmp_path / "log").items()} == {
        0: list(range(49)),
        1: list(range(49)),
    }


def test_a_stream_out_of_step_with_the_sampler_is_refused(tmp_path: Path) -> None:
    """A pipeline that batches otherwise than the step (here: one sample short) is refused at once."""
    data = Points(49)

    def skipping(micros: Iterator[elastic.Micro]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for m in micros:
            ids = torch.from_numpy(m.ids[1:])
            yield data.x[ids], data.y[ids]

    job = elastic.Job(49, _cfg(tmp_path), stop=elastic.StopFlag())
    model = _model(job)
    loader = job.loader(stream=skipping, empty=lambda: (data.x[:0], data.y[:0]))
    with pytest.raises(RuntimeError, match="a batch of 3 samples for a micro-batch of 4"), job:
        for step in job.steps():
            for x, y in step.batches(loader):
                step.backward(F.cross_entropy(model(x), y))
            step.optimizer_step()


def _rank(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        tmp = Path(out)
        with elastic.Job(49, _cfg(tmp / f"r{rank}"), stop=elastic.StopFlag()) as job:
            params = train_by_loader(job, Points(49))
        if rank == 0:
            torch.save(params, tmp / "params.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_with_empty_shares_equal_one_process(tmp_path: Path) -> None:
    """Two gloo ranks, the mean loss and the DataLoader: each epoch's last step has 1 sample, so rank 1's
    share is empty -- etj hands it an empty batch and the mean of nothing weighs nothing. The weights equal
    the single-process summed loop's within 1e-9."""
    data = Points(49)
    with elastic.Job(49, _cfg(tmp_path / "one"), stop=elastic.StopFlag()) as job:
        ref = train_by_ids(job, data)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as init_dir:
        procs = [
            ctx.Process(target=_rank, args=(r, os.path.join(init_dir, "init"), str(tmp_path))) for r in (0, 1)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    _close(torch.load(tmp_path / "params.pt"), ref)


class _Membership:
    """A stand-in membership: the micro-batches it would train (``upcoming``)."""

    def __init__(self, ids: list[list[int]]) -> None:
        self.ids = ids

    def upcoming(self) -> Iterator[elastic.Micro]:
        return (elastic.Micro(0, np.asarray(i, dtype=np.int64)) for i in self.ids)


class _Step:
    """A stand-in step of a membership: its micro-batches are the membership's next ones."""

    def __init__(self, membership: _Membership, ids: list[list[int]]) -> None:
        self.membership, self.ids = membership, ids

    def micro_batches(self) -> Iterator[elastic.Micro]:
        return (elastic.Micro(0, np.asarray(i, dtype=np.int64)) for i in self.ids)


def test_a_new_membership_opens_a_new_stream_and_closes_the_old() -> None:
    """The stream of the first world is read ahead; a resize's new world gets a stream of its own, fed
    from its own micro-batches, and the old one is closed (its read-ahead dropped)."""
    opened: list[list[list[int]]] = []
    closed: list[int] = []

    def stream(micros: Iterator[elastic.Micro]) -> Iterator[torch.Tensor]:
        seen: list[list[int]] = []
        opened.append(seen)
        try:
            for m in micros:
                seen.append(m.ids.tolist())
                yield torch.tensor(m.ids)
        finally:
            closed.append(len(opened))

    loader = elastic.Loader(stream, lambda: torch.empty(0, dtype=torch.int64))
    a, b = _Membership([[0, 1], [2, 3], [4, 5]]), _Membership([[4], [5], [6, 7]])
    got = [
        t.tolist()
        for step in (_Step(a, [[0, 1], [2, 3]]), _Step(b, [[4], [5], []]))
        for t in loader.feed(step)
    ]  # type: ignore[arg-type]
    assert got == [[0, 1], [2, 3], [4], [5], []]  # the empty share: the empty batch
    assert [s[:2] for s in opened] == [[[0, 1], [2, 3]], [[4], [5]]] and closed == [1]
    loader.close()
    assert closed == [1, 2]


# ---- issue 40: misuse is refused before it trains wrongly --------------------------------------------------

CONFIG_REFUSED: dict[str, tuple[dict[str, str], dict[str, Any], str]] = {
    # name: (environment, Job keywords, the refusal)
    "a schedule's typo": ({}, {"lr_schedule": "cosin"}, "lr_schedule='cosin' is not one of constant, step"),
    "a policy's typo": ({}, {"resize_policy": "Dynamic"}, "resize_policy='Dynamic' is not one of"),
    "a precision etj has not": ({}, {"precision": "fp8"}, "precision='fp8' is not one of fp32, bf16, fp16"),
    "a global batch of 0": ({}, {"global_batch_size": 0}, "global_batch_size=0 must be at least 1"),
    "a negative micro-batch": ({}, {"micro_batch_size": -4}, "micro_batch_size=-4 must be at least 1"),
    "no epochs": ({}, {"epochs": 0}, "epochs=0 must be at least 1"),
    "a micro-batch above the global batch": (
        {},
        {"global_batch_size": 16, "micro_batch_size": 32},
        "micro_batch_size=32 must not be greater than global_batch_size=16",
    ),
    "the environment's global batch of 0, the same check": (
        {"ETJ_GLOBAL_BATCH_SIZE": "0"},
        {},
        "global_batch_size=0 must be at least 1",
    ),
    "the environment's batch below a keyword's micro-batch": (
        {"ETJ_GLOBAL_BATCH_SIZE": "8"},
        {"micro_batch_size": 16},
        "micro_batch_size=16 must not be greater than global_batch_size=8",
    ),
}


@pytest.mark.parametrize("case", CONFIG_REFUSED)
def test_a_bad_keyword_is_refused_by_the_configs_one_validation(case: str) -> None:
    env, keywords, refusal = CONFIG_REFUSED[case]
    with pytest.raises(ValueError, match=re.escape(refusal)):
        TrainConfig.with_defaults(keywords, env)


JOB_REFUSED: dict[str, tuple[int, dict[str, Any], str]] = {
    # name: (dataset_size, Job keywords, the refusal)
    "a schedule's typo": (64, {"lr_schedule": "cosin"}, "lr_schedule='cosin' is not one of"),
    "a global batch of 0": (64, {"global_batch_size": 0}, "global_batch_size=0 must be at least 1"),
    "a warm-up as long as training": (64, {"warmup_epochs": 1.0}, "warmup_epochs must be in [0, epochs)"),
    "an empty dataset": (0, {}, "dataset_size=0 must be positive"),
}


@pytest.mark.parametrize("case", JOB_REFUSED)
def test_job_refuses_bad_input_before_it_binds_a_device_or_joins_a_group(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    size, keywords, refusal = JOB_REFUSED[case]

    def too_late() -> None:
        raise AssertionError("the config was checked after the rank bound its device")

    monkeypatch.setattr(devices, "bind_this_rank", too_late)  # the first thing Job does with the world
    with pytest.raises(ValueError, match=re.escape(refusal)):
        elastic.Job(size, stop=elastic.StopFlag(), **keywords)


MICRO_DEFAULT: dict[str, tuple[dict[str, Any], int]] = {
    "the defaults": ({}, 64),
    "a small global batch alone is not refused: its micro-batch is the batch": (
        {"global_batch_size": 16},
        16,
    ),
    "a large global batch: micro-batches of the default 64": ({"global_batch_size": 256}, 64),
    "a micro-batch given": ({"global_batch_size": 256, "micro_batch_size": 32}, 32),
}


@pytest.mark.parametrize("case", MICRO_DEFAULT)
def test_an_unset_micro_batch_is_at_most_the_global_batch(case: str) -> None:
    keywords, micro = MICRO_DEFAULT[case]
    assert TrainConfig(**keywords).micro_batch_size == micro


@pytest.mark.parametrize("size", [32, 80], ids=["fewer than the dataset", "more than the dataset"])
def test_a_dataset_size_other_than_the_datasets_length_is_refused(tmp_path: Path, size: int) -> None:
    job = elastic.Job(size, _cfg(tmp_path), stop=elastic.StopFlag())
    with pytest.raises(
        ValueError, match=rf"Job\(dataset_size={size}\) but the loader's dataset has 64 samples"
    ):
        job.loader(Points(64))


def _leave_early(step: elastic.Step, loader: elastic.Loader[Any], model: torch.nn.Module, ran: int) -> None:
    for i, (x, y) in enumerate(step.batches(loader)):
        if i == ran:
            break
        step.backward(F.cross_entropy(model(x), y))


LEFT_EARLY: dict[str, tuple[int, Callable[[elastic.Step], Any]]] = {
    # name: (micro-batches run of 4, the call that finds out)
    "a break before the third of 4, then the step": (2, lambda step: step.optimizer_step()),
    "a break before the last of 4, then clipping": (3, lambda step: step.clip_gradients(1.0)),
    "no micro-batch read at all": (0, lambda step: step.optimizer_step()),
}


@pytest.mark.parametrize("case", LEFT_EARLY)
def test_a_step_whose_micro_batches_did_not_all_run_is_refused(tmp_path: Path, case: str) -> None:
    """Global batch 16 in micro-batches of at most 5: 4 of 4 samples. Leaving ``step.batches`` early used
    to commit the step (DDP syncs only in the last micro-batch's backward) and shift the loader's stream."""
    ran, call = LEFT_EARLY[case]
    job = elastic.Job(49, _cfg(tmp_path), stop=elastic.StopFlag())
    model = _model(job)
    loader = job.loader(Points(49))
    with pytest.raises(RuntimeError, match=rf"only {ran} of 4 micro-batches of step 1 ran"), job:
        for step in job.steps():
            _leave_early(step, loader, model, ran)
            call(step)
    assert job.steps_done == 0


OWN_OPTIMIZER: dict[str, tuple[dict[str, Any], Callable[[Any], torch.optim.Optimizer], str | None]] = {
    # name: (config fields, the optimizer, what is warned about; None: nothing)
    "a schedule it does not follow": (
        {"lr": 0.05, "lr_schedule": "cosine"},
        lambda params: torch.optim.SGD(params, lr=0.05),
        "lr_schedule='cosine', warmup_epochs=0.0",
    ),
    "a warm-up it does not follow": (
        {"warmup_epochs": 0.5},
        lambda params: torch.optim.SGD(params, lr=0.05),
        "lr_schedule='constant', warmup_epochs=0.5",
    ),
    "an lr set, and another of its own": (
        {"lr": 0.1},
        lambda params: torch.optim.AdamW(params, lr=1e-3),
        "lr=0.1 (the optimizer's: 0.001)",
    ),
    "the config's lr followed": ({"lr": 0.1}, lambda params: torch.optim.SGD(params, lr=0.1), None),
    "no lr set, its own": ({}, lambda params: torch.optim.AdamW(params, lr=1e-3), None),
    "setup_dynamic_sgd's, which follows both": (
        {"lr": 0.1, "lr_schedule": "cosine"},
        lambda params: elastic.DynamicSGD(params, lr=0.1, ramp_steps=10),
        None,
    ),
}


@pytest.mark.parametrize("case", OWN_OPTIMIZER)
def test_an_optimizer_of_its_own_that_ignores_the_configs_lr_is_warned_about(
    tmp_path: Path, case: str
) -> None:
    fields, make, warned = OWN_OPTIMIZER[case]
    cfg = TrainConfig(checkpoint_dir=None, local_checkpoint_dir=tmp_path, epochs=2, **fields)
    job = elastic.Job(10, cfg, stop=elastic.StopFlag())
    model = job.setup_model(torch.nn.Linear(2, 2))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        job.setup_optimizer(make(model.parameters()))
    said = [str(w.message) for w in seen if issubclass(w.category, elastic.ConfigIgnored)]
    assert len(said) == (warned is not None), said
    if warned is not None:
        assert warned in said[0] and "is not applied to this optimizer" in said[0]


# ---- issue 40: clipping and count-weighted micro-batches ---------------------------------------------------


def _one_step(
    job: elastic.Job, data: Points, max_norm: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One step of the DataLoader loop, clipped; the norm it returned and the weights after it."""
    fp16 = job.config.precision == "fp16"
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if fp16 else None
    model = _model(job, scaler)
    loader = job.loader(data)
    norm = torch.tensor(math.nan)
    for step in job.steps():
        for x, y in step.batches(loader):
            step.backward(F.cross_entropy(model(x), y))
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        norm = step.clip_gradients(max_norm)
        scale = scaler.get_scale() if scaler is not None else 1.0
        torch.testing.assert_close(
            norm, torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) / scale
        )
        step.optimizer_step()
    return norm, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_clip_gradients_returns_the_norm_and_clips_the_same_under_a_grad_scaler(tmp_path: Path) -> None:
    """One step clipped to a tenth of its norm: the norm is the unscaled gradients', and a GradScaler run
    (gradients scaled by 2**10 until the optimizer step) clips to the same weights, bit for bit."""
    data = Points(49)
    with elastic.Job(49, _cfg(tmp_path / "free", max_steps=1), stop=elastic.StopFlag()) as job:
        unclipped, _ = _one_step(job, data, math.inf)
    with elastic.Job(49, _cfg(tmp_path / "fp32", max_steps=1), stop=elastic.StopFlag()) as job:
        norm, clipped = _one_step(job, data, float(unclipped) / 10)
    cfg = _cfg(tmp_path / "scaled", max_steps=1, precision="fp16")
    with elastic.Job(49, cfg, stop=elastic.StopFlag()) as job:
        scaled_norm, scaled = _one_step(job, data, float(unclipped) / 10)
    assert float(norm) == float(unclipped) == float(scaled_norm)
    assert clipped.keys() == scaled.keys()
    for k in clipped:
        assert torch.equal(clipped[k], scaled[k]), k


class Tokens(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sequences of 1 to 6 tokens padded to 6 (label -100: ignored by cross_entropy)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 6, 4, generator=g, dtype=torch.float64)
        lengths = torch.randint(1, 7, (n,), generator=g)
        self.y = torch.randint(0, 3, (n, 6), generator=g)
        self.y[torch.arange(6) >= lengths[:, None]] = -100

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _token_mean(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())  # the mean over the tokens not ignored


def test_a_micro_batch_weighted_by_its_token_count_gives_the_global_batchs_token_mean(tmp_path: Path) -> None:
    """Per-token mean losses over padded sequences, in 4 micro-batches: with ``count=`` tokens the step's
    gradient and loss are the token mean over the whole global batch (the reference: one backward over
    the step's 16 sequences); per sample (the default) they are not -- each sequence weighs the same."""
    data = Tokens(49)

    Run = tuple[elastic.Job, elastic.ElasticModule, dict[str, torch.Tensor], np.ndarray]

    def run(by_tokens: bool) -> Run:
        cfg = _cfg(tmp_path / str(by_tokens), max_steps=1)
        with elastic.Job(49, cfg, stop=elastic.StopFlag()) as job:
            model = _model(job)
            start = {k: v.detach().clone() for k, v in model.state_dict().items()}
            loader = job.loader(data)
            for step in job.steps():
                indices = step.indices
                for x, y in step.batches(loader):
                    tokens = int((y != -100).sum())
                    step.backward(_token_mean(model, x, y), count=tokens if by_tokens else None)
                step.optimizer_step()
        return job, model, start, indices

    job, model, start, indices = run(by_tokens=True)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    ref.load_state_dict(start)
    ids = torch.from_numpy(indices)
    loss = _token_mean(ref, data.x[ids], data.y[ids])
    loss.backward()
    want = {k: start[k] - 0.1 * p.grad for k, p in ref.named_parameters()}  # the first step: momentum is 0
    _close({k: v for k, v in model.state_dict().items()}, want)
    assert job.loss == pytest.approx(float(loss.detach()), rel=1e-12)

    per_sample, _, _, _ = run(by_tokens=False)
    assert per_sample.loss != pytest.approx(float(loss.detach()), rel=1e-6)


def test_a_step_weighted_by_counts_and_by_samples_at_once_is_refused(tmp_path: Path) -> None:
    job = elastic.Job(49, _cfg(tmp_path), stop=elastic.StopFlag())
    model = _model(job)
    loader = job.loader(Tokens(49))
    with (
        pytest.raises(
            ValueError, match=re.escape("weighted all by backward(count=...) or all by their samples")
        ),
        job,
    ):
        for step in job.steps():
            for i, (x, y) in enumerate(step.batches(loader)):
                step.backward(_token_mean(model, x, y), count=int((y != -100).sum()) if i == 0 else None)
            step.optimizer_step()

"""The loop API cannot be misused (issue 27 item 5): a mean loss is weighted right or refused, an empty
share is an empty batch etj builds, a DataLoader follows the world, the config has one precedence order
that warns when the environment overrides a script's value, and Dynamic SGD comes from the config in one
call. Tables of named cases for the pure parts; the loops in one process and over two gloo ranks."""

from __future__ import annotations

import os
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
    assert job.optimizer is opt and isinstance(opt, elastic.DynamicSGD)
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


def _model(job: elastic.Job) -> elastic.ElasticModule:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    model = job.setup_model(net)
    job.setup_dynamic_sgd(model.parameters())
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
    assert job.step == 8
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

"""Exactly-once property of the elastic sampler over random resize schedules."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from etj_trainer.batching.plan import split_counts
from etj_trainer.batching.sampler import ElasticSampler


def _run_schedule(size: int, batch: int, worlds: list[int], resume_every: int) -> dict[int, list[int]]:
    """Simulate ranks drawing their shares; the world size changes every step per ``worlds``; every
    ``resume_every`` steps the sampler is rebuilt from its state dict (a restart after a resize)."""
    sampler = ElasticSampler(size, seed=7)
    seen: dict[int, list[int]] = {}
    step = 0
    while sampler.epoch < 2:
        world = worlds[step % len(worlds)]
        gidx = sampler.next_global_batch(batch)
        for rank in range(world):
            seen.setdefault(sampler.epoch, []).extend(ElasticSampler.rank_slice(gidx, world, rank).tolist())
        sampler.commit(len(gidx))
        step += 1
        if resume_every and step % resume_every == 0:
            fresh = ElasticSampler(size, seed=7)
            fresh.load_state_dict(sampler.state_dict())
            sampler = fresh
    return seen


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 300),
    batch=st.integers(1, 64),
    worlds=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    resume_every=st.integers(0, 7),
)
def test_every_sample_exactly_once_per_epoch(
    size: int, batch: int, worlds: list[int], resume_every: int
) -> None:
    seen = _run_schedule(size, batch, worlds, resume_every)
    assert sorted(seen) == [0, 1]
    for ids in seen.values():
        assert sorted(ids) == list(range(size))


@given(total=st.integers(0, 1000), parts=st.integers(1, 50))
def test_split_counts_is_balanced_and_complete(total: int, parts: int) -> None:
    counts = split_counts(total, parts)
    assert sum(counts) == total and len(counts) == parts
    assert max(counts) - min(counts) <= 1


def test_permutation_depends_on_seed_and_epoch_only() -> None:
    a, b = ElasticSampler(100, seed=1), ElasticSampler(100, seed=1)
    assert np.array_equal(a.permutation(3), b.permutation(3))
    assert not np.array_equal(a.permutation(0), a.permutation(1))
    assert not np.array_equal(a.permutation(0), ElasticSampler(100, seed=2).permutation(0))


def test_mid_epoch_resize_resplits_remaining_samples() -> None:
    s = ElasticSampler(10, seed=0, shuffle=False)
    s.commit(len(s.next_global_batch(4)))  # 4 samples at world size 2
    gidx = s.next_global_batch(4)
    shares = [ElasticSampler.rank_slice(gidx, 3, r).tolist() for r in range(3)]
    assert shares == [[4, 5], [6], [7]]


def test_state_for_another_dataset_is_refused() -> None:
    s = ElasticSampler(10, seed=0)
    other = ElasticSampler(11, seed=0)
    try:
        other.load_state_dict(s.state_dict())
    except ValueError:
        return
    raise AssertionError("loading a state for another dataset size must fail")

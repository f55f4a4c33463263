"""Loading a step's micro-batches ahead of time, following the world's membership (``job.loader``).

A prefetching loader reads ahead, so it must know which samples this rank trains next -- and that changes
when the world does: after a leave, a join or a crash recovery the remaining samples are re-split over
the new ranks (batching/sampler.py). ``Loader`` opens one stream per membership, fed with exactly the
micro-batches this rank will train in it (``Membership.upcoming``), and drops the old one (and its
read-ahead) when a resize starts a new membership. Two kinds of stream:

* a map-style dataset through a standard ``torch.utils.data.DataLoader`` (``num_workers``,
  ``collate_fn``, ``pin_memory``, ... as usual): its ``batch_sampler`` is this rank's micro-batches;
* a pipeline the user owns: a function from an iterator of ``Micro`` (epoch, sample ids) to an iterator
  of batches, one per ``Micro``, in order (the built-in trainer's DALI and in-memory sources).

Every batch's sample count is checked against the micro-batch the step trains, and a stream that ends
early is an error, so a stream out of step with the sampler fails loudly rather than training on other
samples than the step's. An empty share (an epoch's short
last step) is an empty batch of the right shape, which etj builds: for a dataset from one sample collated
and cut to nothing, for a pipeline by ``empty()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from etj_trainer.data.stream import Micro
from etj_trainer.loop.step import Membership, Step

B = TypeVar("B")


def emptied(batch: Any) -> Any:
    """``batch`` (tensors, arrays, in tuples, lists, dicts) cut to zero samples: the same structure,
    shapes, dtypes and devices, without a sample."""
    if isinstance(batch, torch.Tensor | np.ndarray):
        return batch[:0]
    if isinstance(batch, Mapping):
        return type(batch)({k: emptied(v) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(emptied(v) for v in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(emptied(v) for v in batch)
    raise TypeError(f"cannot make an empty batch of {type(batch).__name__}: pass empty= to job.loader")


def samples_in(batch: Any) -> int | None:
    """The sample count of a batch: its first tensor's or array's leading dimension (None: none found)."""
    if isinstance(batch, torch.Tensor | np.ndarray):
        return int(batch.shape[0]) if batch.ndim else None
    values = (
        batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, tuple | list) else ()
    )
    for v in values:
        n = samples_in(v)
        if n is not None:
            return n
    return None


class _Ids:
    """A DataLoader's ``batch_sampler``: the sample ids of each micro-batch of a stream, in order."""

    def __init__(self, micros: Iterator[Micro]) -> None:
        self._micros = micros

    def __iter__(self) -> Iterator[list[int]]:
        return (m.ids.tolist() for m in self._micros)


class Loader(Generic[B]):
    """One stream of batches per membership; see the module docstring. ``step.batches(loader)`` reads it."""

    def __init__(self, open_stream: Callable[[Iterator[Micro]], Iterable[B]], empty: Callable[[], B]) -> None:
        self._open = open_stream
        self._empty = empty
        self._membership: Membership | None = None
        self._stream: Iterator[B] | None = None

    def feed(self, step: Step) -> Iterator[B]:
        """The step's micro-batches, loaded (``Step.batches``); a new membership opens a new stream."""
        if step.membership is not self._membership:
            self.close()
            self._membership = step.membership
            self._stream = iter(self._open(step.membership.upcoming()))
        for micro in step.micro_batches():
            yield self._empty() if len(micro.ids) == 0 else self._next(micro)

    def _next(self, micro: Micro) -> B:
        assert self._stream is not None
        try:
            batch = next(self._stream)
        except StopIteration:
            raise RuntimeError(
                f"the loader's stream ended before micro-batch {micro.ids[:8]}...: it must yield one batch "
                "per Micro"
            ) from None
        n = samples_in(batch)
        if n is not None and n != len(micro.ids):
            raise RuntimeError(
                f"the loader is out of step with the sampler: a batch of {n} samples for a micro-batch of "
                f"{len(micro.ids)}; its stream must yield one batch per Micro, in order"
            )
        return batch

    def close(self) -> None:
        """Drop the stream and its read-ahead (a generator's ``finally`` runs; DataLoader workers stop)."""
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()
        self._stream, self._membership = None, None


def dataset_loader(
    dataset: Dataset[Any], collate_fn: Callable[[list[Any]], Any] | None = None, **loader_args: Any
) -> Loader[Any]:
    """A ``Loader`` over a map-style ``dataset`` through a ``torch.utils.data.DataLoader`` per membership.

    ``loader_args``: the DataLoader's own (``num_workers``, ``pin_memory``, ``prefetch_factor``, ...);
    the batching and the order are etj's (no ``batch_size``, ``shuffle``, ``sampler``).
    """
    taken = {"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"} & set(loader_args)
    if taken:
        raise TypeError(f"{sorted(taken)}: etj picks each rank's samples and micro-batches")
    collate = collate_fn or default_collate
    template: list[Any] = []  # one sample collated and emptied, made when first needed

    def open_stream(micros: Iterator[Micro]) -> Iterator[Any]:
        return iter(DataLoader(dataset, batch_sampler=_Ids(micros), collate_fn=collate, **loader_args))

    def empty() -> Any:
        if not template:
            template.append(emptied(collate([dataset[0]])))
        return template[0]

    return Loader(open_stream, empty)


def make_loader(
    dataset: Dataset[Any] | None,
    stream: Callable[[Iterator[Micro]], Iterable[Any]] | None,
    empty: Callable[[], Any] | None,
    dataloader_args: dict[str, Any],
) -> Loader[Any]:
    """``job.loader``'s arguments checked: a dataset (with DataLoader arguments) or a stream with
    ``empty``, one of them."""
    if (dataset is None) == (stream is None):
        raise TypeError("job.loader takes a dataset or stream=..., one of them")
    if stream is None:
        assert dataset is not None
        return dataset_loader(dataset, **dataloader_args)
    if empty is None or dataloader_args:
        raise TypeError("job.loader(stream=...) needs empty= (an empty batch) and no DataLoader arguments")
    return Loader(stream, empty)

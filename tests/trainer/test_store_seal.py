"""The seal on the resize protocols' store values (core/mac.py) and the pickle-free wire format between
ranks (core/wire.py): pure tables, no store."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

from etj_trainer.core import wire
from etj_trainer.core.mac import Sealer

TOKEN, UID = "the-jobs-token", "3b1e-job-uid"
JOB = Sealer.for_job(TOKEN, UID)
NAME = JOB.name("etj-join", "ticket/pod-b")
GOOD = JOB.seal(NAME, '{"key": "join/1/7", "rank": 2}')

OPEN_CASES: dict[str, tuple[str, bytes | str, str | None]] = {
    "sealed for this key": (NAME, GOOD, '{"key": "join/1/7", "rank": 2}'),
    "replayed under another key (another node, another round)": (
        JOB.name("etj-join", "ticket/pod-c"),
        GOOD,
        None,
    ),
    "sealed with a guessed token": (NAME, Sealer.for_job("a-guess", UID).seal(NAME, "x"), None),
    "sealed for another job": (NAME, Sealer.for_job(TOKEN, "other-uid").seal(NAME, "x"), None),
    "value changed after sealing": (NAME, GOOD.replace('"rank": 2', '"rank": 0'), None),
    "plain value (the protocols before the seal)": (NAME, '{"key": "evil", "rank": 1}', None),
    "no MAC at all": (NAME, b"withdrawn", None),
    "empty": (NAME, b"", None),
    "not UTF-8": (NAME, b"\xff\xfe.\xff", None),
    "far too big": (NAME, GOOD + "x" * (2 << 20), None),
}


@pytest.mark.parametrize("case", list(OPEN_CASES), ids=list(OPEN_CASES))
def test_open(case: str) -> None:
    name, raw, expected = OPEN_CASES[case]
    sealer = Sealer.for_job(TOKEN, UID)
    assert sealer.open(name, raw) == expected
    assert sealer.refused == (expected is None)  # every refusal counted


def test_the_names_depend_on_the_token_and_the_job() -> None:
    names = {Sealer.for_job(t, u).name("etj-join") for t, u in [(TOKEN, UID), ("a-guess", UID), (TOKEN, "x")]}
    assert len(names) == 3 and all(UID not in n for n in names)


def _optimizer_state() -> dict[str, Any]:
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt = torch.optim.Adam([p], lr=0.1, betas=(0.9, 0.99))
    p.grad = torch.ones(3, dtype=torch.float64)
    opt.step()
    return opt.state_dict()


ROUND_TRIPS: dict[str, Any] = {
    "plain values": {"step": 7, "lr": 0.1, "name": "x", "on": True, "none": None, "inf": float("inf")},
    "tuples stay tuples, int keys stay ints": {0: (0.9, 0.99), 1: [1, 2], "k": {2: "v"}},
    "tensor references": {"model": {"w": wire.Ref(0)}, "rng": [wire.Ref(1), 5]},
}


@pytest.mark.parametrize("case", list(ROUND_TRIPS), ids=list(ROUND_TRIPS))
def test_a_skeleton_round_trips(case: str) -> None:
    assert wire.loads(wire.dumps(ROUND_TRIPS[case])) == ROUND_TRIPS[case]


def test_an_optimizers_state_skeleton_round_trips_as_torch_loads_it() -> None:
    """An optimizer's state is keyed by parameter index and its betas are a tuple: JSON alone loses both
    (string keys: the state silently dropped by ``load_state_dict``)."""
    state = _optimizer_state()
    skeleton = {k: v for k, v in state.items() if k != "state"} | {
        "state": {
            i: {n: wire.Ref(0) if isinstance(t, torch.Tensor) else t for n, t in s.items()}
            for i, s in state["state"].items()
        }
    }
    assert wire.loads(wire.dumps(skeleton)) == skeleton


REFUSED: dict[str, bytes] = {
    "a pickle": pickle.dumps({"step": 1}),
    "an unknown tag": b'{"x": [1]}',
    "a tag with two keys": b'{"t": [], "l": []}',
    "a reference that is not an int": b'{"r": "0"}',
    "a dict entry that is not a pair": b'{"d": [[1, 2, 3]]}',
    "a container as a dict key": b'{"d": [[{"l": []}, 1]]}',
    "not JSON": b"\x80\x04K\x01.",
    "nested past the recursion limit": b'{"l": [' * 5000 + b"]}" * 5000,
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_anything_else_is_refused(case: str) -> None:
    with pytest.raises(ValueError):
        wire.loads(REFUSED[case])


def test_what_cannot_be_sent_is_refused_by_the_sender() -> None:
    with pytest.raises(TypeError):
        wire.dumps({"dtype": torch.float32})

"""store_link: what the agent does when its rendezvous store stops answering (pure table + the wrapper
around a stand-in handler; the real store kill is tests/trainer/test_store_loss.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousTimeoutError

from etj_trainer.agent.store_link import Action, LinkState, ReconnectingRendezvous, next_action


@pytest.mark.parametrize(
    ("name", "state", "now", "action"),
    [
        ("connected: ask the store", LinkState(), 10.0, Action.ASK),
        ("just lost, never probed: probe", LinkState(lost_since=9.0), 10.0, Action.PROBE),
        ("probed a moment ago: train on", LinkState(lost_since=5.0, last_probe=9.8), 10.0, Action.WAIT),
        ("probe interval passed: probe again", LinkState(lost_since=5.0, last_probe=9.4), 10.0, Action.PROBE),
        ("a new store is up: re-form", LinkState(reform_pending=True), 10.0, Action.REFORM),
    ],
)
def test_next_action(name: str, state: LinkState, now: float, action: Action) -> None:
    assert next_action(state, now, probe_interval=0.5) is action, name


@dataclass
class FakeStore:
    """Stand-in for the job's store pod: up or down, and which incarnation is up."""

    up: bool = True
    incarnation: int = 0


@dataclass
class FakeHandler:
    """Stand-in for torch's handler: bound to the store incarnation it connected to."""

    store: FakeStore
    waiting: int = 0
    joined: list[int] = field(default_factory=list)
    stopped: bool = False

    def __post_init__(self) -> None:
        if not self.store.up:
            raise RendezvousConnectionError("connect failed")
        self.incarnation = self.store.incarnation

    def _check(self) -> None:
        if not self.store.up or self.store.incarnation != self.incarnation:
            raise RendezvousConnectionError("broken pipe")

    def num_nodes_waiting(self) -> int:
        self._check()
        return self.waiting

    def next_rendezvous(self) -> Any:
        self._check()
        self.joined.append(self.incarnation)
        return f"round on store {self.incarnation}"

    def shutdown(self) -> bool:
        self._check()
        return True

    def _stop_heartbeats(self) -> None:
        self.stopped = True


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _link(store: FakeStore, clock: Clock, **kw: Any) -> tuple[ReconnectingRendezvous, list[FakeHandler]]:
    made: list[FakeHandler] = []

    def factory() -> Any:
        made.append(FakeHandler(store))
        return made[-1]

    link = ReconnectingRendezvous(
        factory, "store:29400", probe_interval=0.5, clock=clock, answers=lambda _: store.up, **kw
    )
    return link, made


def test_a_lost_store_is_waited_out_and_the_world_reforms_on_the_new_one() -> None:
    store, clock = FakeStore(), Clock()
    link, made = _link(store, clock)
    made[0].waiting = 2
    assert link.num_nodes_waiting() == 2 and not link.lost  # connected: torch's answer
    store.up = False
    assert link.num_nodes_waiting() == 0 and link.lost  # lost: train on, no error reaches torch
    clock.t += 0.1
    assert link.num_nodes_waiting() == 0  # probed, nothing there
    store.up, store.incarnation = True, 1  # the operator's replacement, same Service name
    clock.t += 0.1
    assert link.num_nodes_waiting() == 0  # not probed again within the interval
    clock.t += 0.5
    assert link.num_nodes_waiting() == 1 and link.reconnects == 1  # new store: restart the workers
    assert made[0].stopped and link.inner is made[1]  # the old handler's keep-alives stop
    assert link.num_nodes_waiting() == 1  # until the agent re-joins
    assert link.next_rendezvous() == "round on store 1" and not link.lost
    assert link.num_nodes_waiting() == 0  # asks the new store again


def test_the_time_away_includes_the_wait_for_the_new_stores_handler(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # regression: "back after 0.3 s" was printed for a store away for 25 s (e2e drain on process nodes):
    # the handler's factory blocked while torch's TCPStore client retried its connect, and the time away
    # was taken when the probe began
    store, clock = FakeStore(), Clock()
    made: list[FakeHandler] = []

    def factory() -> Any:
        if made:
            clock.t += 20.0  # the client's connect retries until the new store listens
        made.append(FakeHandler(store))
        return made[-1]

    link = ReconnectingRendezvous(
        factory, "store:29400", probe_interval=0.5, clock=clock, answers=lambda _: True
    )
    store.up = False
    assert link.num_nodes_waiting() == 0 and link.lost
    store.up, store.incarnation = True, 1
    clock.t += 0.5
    assert link.num_nodes_waiting() == 1
    assert "rendezvous store back after 20.5 s" in capsys.readouterr().out


def test_next_rendezvous_waits_for_the_store_instead_of_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    store, clock = FakeStore(), Clock()
    link, made = _link(store, clock)
    store.up = False

    def sleep(s: float) -> None:  # the store comes back after 3 s of waiting
        clock.t += s
        if clock.t >= 3.0:
            store.up, store.incarnation = True, 1

    monkeypatch.setattr("etj_trainer.agent.store_link.time.sleep", sleep)
    assert link.next_rendezvous() == "round on store 1"
    assert made[-1].joined == [1] and clock.t >= 3.0


def test_next_rendezvous_gives_up_after_the_join_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    store, clock = FakeStore(), Clock()
    link, _ = _link(store, clock, join_timeout=10.0)
    store.up = False
    monkeypatch.setattr("etj_trainer.agent.store_link.time.sleep", lambda s: setattr(clock, "t", clock.t + s))
    with pytest.raises(RendezvousTimeoutError):
        link.next_rendezvous()


def test_shutdown_on_a_lost_store_is_not_an_error() -> None:
    store, clock = FakeStore(), Clock()
    link, _ = _link(store, clock)
    store.up = False
    assert link.shutdown() is False


def test_a_lost_store_leaves_the_environments_bounds() -> None:
    """kubectl scale's bounds are read from the store pod (bounds.py); a store that is gone must neither
    fail rank 0's admission nor hold the agent's rendezvous for long: the environment's bounds apply."""
    import time

    from etj_trainer.agent.local_launcher import free_port
    from etj_trainer.resize import bounds

    gone = f"http://127.0.0.1:{free_port()}/progress"  # nobody listens there
    started = time.monotonic()
    assert bounds.max_workers(gone, 3) == 3
    assert bounds.read_from(gone) is None
    assert bounds.read_from("") is None  # no store pod at all (a single process)
    assert time.monotonic() - started < 2 * bounds.READ_TIMEOUT_S


def test_the_first_handler_waits_for_a_store_that_starts_late() -> None:
    """build_when_store_answers: no store, then a store that listens but cannot serve yet, then one that
    does; past the start-up bound the wait ends (StoreNeverAnswered), never with a torch store error."""
    from etj_trainer.agent.store_link import StoreNeverAnswered, build_when_store_answers

    now = [0.0]
    probes = iter([False, False, True, True])
    builds = iter([RendezvousConnectionError("not serving yet"), "handler"])

    def answers(_: str) -> bool:
        now[0] += 10.0
        return next(probes)

    def build() -> Any:
        b = next(builds)
        if isinstance(b, Exception):
            raise b
        return b

    got = build_when_store_answers(
        build, "store:29400", within_s=100.0, probe_interval=0.0, clock=lambda: now[0], answers=answers
    )
    assert got == "handler" and now[0] == 40.0

    def never(_: str) -> bool:
        now[0] += 10.0
        return False

    now[0] = 0.0
    with pytest.raises(StoreNeverAnswered):
        build_when_store_answers(
            build, "store:29400", within_s=25.0, probe_interval=0.0, clock=lambda: now[0], answers=never
        )
    assert now[0] == 30.0  # gave up at the first probe past the bound

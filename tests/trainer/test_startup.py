"""The start-up wait (agent/first_round.py) on a real TCPStore: agents count in and wait, bounded, for the
others."""

from __future__ import annotations

import threading

from torch.distributed import TCPStore

from etj_trainer.agent.first_round import arrivals_key, wait_for_startup_peers


def _store() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def test_the_first_agent_waits_until_the_expected_count_arrives() -> None:
    store = _store()
    first_counted = threading.Event()
    results = []

    def first() -> None:
        results.append(wait_for_startup_peers(_Notify(store, first_counted), "r", expected=2, bound_s=120))

    t = threading.Thread(target=first)
    t.start()
    assert first_counted.wait(60)
    assert t.is_alive()  # still waiting: one of two has arrived
    second = wait_for_startup_peers(store, "r", expected=2, bound_s=120)
    t.join(60)
    assert not t.is_alive()
    assert second.complete and second.arrived == 2
    assert results[0].complete and results[0].arrived == 2


def test_a_missing_agent_costs_at_most_the_bound() -> None:
    store = _store()
    clock = _FakeClock()
    wait = wait_for_startup_peers(store, "r", expected=3, bound_s=5.0, clock=clock, sleep=clock.sleep)
    assert not wait.complete and wait.arrived == 1
    assert 5.0 <= wait.waited_s < 5.0 + 0.1  # gave up at the bound, one poll at most after it


def test_later_agents_go_straight_on() -> None:
    # a joiner, a replacement or a restarted container: the count is already reached, nobody waits
    store = _store()
    store.add(arrivals_key("r"), 2)
    clock = _FakeClock()
    wait = wait_for_startup_peers(store, "r", expected=2, bound_s=60, clock=clock, sleep=clock.sleep)
    assert wait.complete and wait.arrived == 3 and wait.waited_s == 0


def test_runs_do_not_share_a_count() -> None:
    store = _store()
    store.add(arrivals_key("other-job"), 5)
    clock = _FakeClock()
    wait = wait_for_startup_peers(store, "r", expected=2, bound_s=1.0, clock=clock, sleep=clock.sleep)
    assert not wait.complete and wait.arrived == 1


class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Notify:
    """The store, telling the test when this agent has counted itself in (its first add)."""

    def __init__(self, store: TCPStore, counted: threading.Event) -> None:
        self.store, self.counted = store, counted

    def add(self, key: str, value: int) -> int:
        n = int(self.store.add(key, value))
        self.counted.set()
        return n

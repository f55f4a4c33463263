"""The start-up wait (agent/first_round.py) on a real TCPStore: agents count in and wait, bounded, for the
others."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta

from torch.distributed import TCPStore

from etj_trainer.agent.first_round import arrivals_key, wait_for_startup_peers
from etj_trainer.agent.worker import startup_gate


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
    assert wait.late  # and it is no start-up agent


def test_a_late_agent_does_not_make_its_first_round_wait_for_the_start_up_count() -> None:
    """Regression: a 4th agent of a job that started with 3 and has shrunk to 1 (a leave and a kill) took
    the start-up's count as its first round's minimum and waited for a third node forever (a stock
    torchrun script's join, which takes the rendezvous path)."""
    store = _store()
    store.add(arrivals_key("r"), 3)
    gate = startup_gate(store, "r", expected=3, bound_s=60, door_open=lambda: False)
    assert not gate.complete and not gate.door_open
    on_time = startup_gate(_store(), "r", expected=1, bound_s=60, door_open=lambda: False)
    assert not on_time.complete  # a single agent has no peers to wait for either


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


STORE_SERVER = """
import sys, time
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(store.port, flush=True)
time.sleep(600)
"""


def test_a_store_lost_before_the_first_round_is_not_an_agent_failure() -> None:
    """Seen in the chaos bench: a replacement worker built its handler, then the store was killed; the
    start-up wait's read raised DistNetworkError, the agent exited 1 and the operator counted a failure."""
    server = subprocess.Popen([sys.executable, "-c", STORE_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        client.add(arrivals_key("r"), 0)  # connected
        server.kill()
        server.wait(30)
        gate = startup_gate(client, "r", expected=2, bound_s=60, door_open=lambda: True)
    finally:
        if server.poll() is None:
            server.kill()
    assert gate.store_lost and not gate.complete and not gate.door_open


def test_the_gate_reports_the_wait_and_the_door() -> None:
    store = _store()
    store.add(arrivals_key("r"), 1)  # one peer already in
    gate = startup_gate(store, "r", expected=2, bound_s=60, door_open=lambda: True)
    assert gate.complete and gate.door_open and not gate.store_lost
    alone = startup_gate(store, "solo", expected=1, bound_s=60, door_open=lambda: False)
    assert not alone.complete and not alone.door_open and not alone.store_lost

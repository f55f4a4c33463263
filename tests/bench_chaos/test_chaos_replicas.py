"""The chaos bench's operator replicas: command lines per identity and the failover record (pure parts).

The replicas themselves run in `bench/chaos.py` against the real apiserver; the Lease election they use is
tested in tests/integration/test_operator_ha.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from bench.chaos_replicas import (
    Failover,
    Replicas,
    args_of,
    identity_of,
    leader_flags,
    lease_holder,
    with_identity,
)

BASE = ["python", "-m", "etj_operator.cli", "operator", "run", "-n", "etj-chaos"]


def test_a_replica_command_names_its_identity_and_a_new_pod_gets_another() -> None:
    first = [*BASE, *leader_flags("etj-chaos", "chaos-op-0")]
    assert identity_of(first) == "chaos-op-0"
    assert "--leader-elect" in first and first[first.index("--leader-election-namespace") + 1] == "etj-chaos"
    second = with_identity(first, "chaos-op-7")
    assert identity_of(second) == "chaos-op-7"
    assert second[: len(BASE)] == BASE and len(second) == len(first)
    assert identity_of(BASE) is None


LEASES = {
    "no lease": (None, None),
    "released": ({"spec": {"holderIdentity": ""}}, None),
    "held": ({"spec": {"holderIdentity": "chaos-op-1"}}, "chaos-op-1"),
}


@pytest.mark.parametrize("case", LEASES)
def test_lease_holder(case: str) -> None:
    lease, want = LEASES[case]
    assert lease_holder(lease) == want


FAILOVERS = {
    # (holders seen at times after a kill at t=100) -> (new leader, seconds)
    "the killed replica still holds it, then a standby": ([("op-1", 105.0), ("op-2", 117.3)], ("op-2", 17.3)),
    "nobody, then a standby": ([(None, 110.0), ("op-3", 120.0)], ("op-3", 20.0)),
    "never taken over": ([("op-1", 130.0), (None, 140.0)], (None, None)),
    "the first new holder counts, not a later one": ([("op-2", 116.0), ("op-3", 150.0)], ("op-2", 16.0)),
}


@pytest.mark.parametrize("case", FAILOVERS)
def test_failover_is_the_time_to_the_first_other_holder(case: str) -> None:
    seen, want = FAILOVERS[case]
    failover = Failover(killed="op-1", at=100.0)
    for holder, now in seen:
        failover.observe(holder, now)
    assert (failover.new_leader, failover.seconds) == want


def test_a_replica_that_exits_by_itself_is_restarted_under_a_new_identity(tmp_path: Path) -> None:
    """A leader that cannot renew its Lease exits by design (seen in a chaos run on a loaded machine: the
    bench then stopped as if the operator had crashed); the kubelet would restart it, so the bench does."""
    exits = [sys.executable, "-c", "import sys; sys.exit(3)", *leader_flags("ns", "chaos-op-0")]
    first = subprocess.Popen(exits)
    first.wait(30)
    procs: list[subprocess.Popen[bytes]] = [first]
    replicas = Replicas(procs, [0], tmp_path / "operator.log", lambda: None)
    assert replicas.restart_exited() == [("chaos-op-0", 3)]
    assert procs[0] is not first and identity_of(args_of(procs[0])) == "chaos-op-1"
    procs[0].wait(30)
    assert replicas.exits == [("chaos-op-0", 3)]
    assert "chaos-op-0 exited (3); restarted" in (tmp_path / "operator.log").read_text()

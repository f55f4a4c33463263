"""The chaos bench's operator replicas: command lines per identity and the failover record (pure parts).

The replicas themselves run in `bench/chaos.py` against the real apiserver; the Lease election they use is
tested in tests/integration/test_operator_ha.py.
"""

from __future__ import annotations

import pytest
from bench.chaos_replicas import Failover, identity_of, leader_flags, lease_holder, with_identity

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

"""Two operator replicas with leader election, against the real apiserver (issue 26).

One replica holds the ``coordination.k8s.io`` Lease and runs; the other stands by. The leader is killed
with SIGKILL (no clean-up at all, like an evicted pod or a lost node); the standby takes the Lease once it
expires and carries on: a job created while nobody led gets its workers, the job that was running keeps
its workers with no failure counted. A SIGTERM'd leader hands the Lease back at once.

The failover time (kill to the standby holding the Lease) is printed; with the short Lease used here
(6 s, renew 4 s, retry 1 s) it is the Lease's expiry plus up to one retry. The chart uses 15/10/2 s.
"""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from etj_operator.k8s import leader
from tests.integration.opbed import Bed, OperatorProcess
from tests.plugins.cluster import Cluster

pytestmark = pytest.mark.cluster

LEASE = ["--lease-seconds=6", "--renew-seconds=4", "--retry-seconds=1"]


def _replica(cluster: Cluster, bed: Bed, tmp_path: Path, name: str, *extra: str) -> OperatorProcess:
    return OperatorProcess(
        Path(cluster.kubeconfig),
        bed.ns,
        tmp_path / f"operator-{name}.log",
        "--leader-elect",
        f"--leader-election-namespace={bed.ns}",
        f"--leader-identity={name}",
        *LEASE,
        *extra,
    ).start()


@contextlib.contextmanager
def _replicas(cluster: Cluster, bed: Bed, tmp_path: Path) -> Iterator[Callable[..., OperatorProcess]]:
    """Start replicas by name; on a failure print every replica's log; kill them all at the end."""
    started: list[tuple[str, OperatorProcess]] = []

    def start(name: str, *extra: str) -> OperatorProcess:
        started.append((name, _replica(cluster, bed, tmp_path, name, *extra)))
        return started[-1][1]

    try:
        yield start
    except (AssertionError, TimeoutError, client.ApiException):
        print("\n".join(f"--- {name} ---\n{proc.logs()}" for name, proc in started))
        raise
    finally:
        for _, proc in started:
            proc.kill()


def test_the_standby_takes_over_a_killed_leader_and_the_jobs_carry_on(
    bed: Bed, cluster: Cluster, tmp_path: Path
) -> None:
    api = cluster.api_client()
    election = leader.Election(namespace=bed.ns, identity="")
    for i in range(4):
        bed.node(f"gpu-{i}", "on-demand")
    with _replicas(cluster, bed, tmp_path) as start:
        a = start("a")
        bed.wait("replica a holding the Lease", lambda: leader.holder(election, api) == "a", 60)
        b = start("b")
        bed.create_job("before", max_workers=2)
        bed.wait("the leader's workers for 'before'", lambda: len(bed.running_workers("before")) == 2, 90)
        bed.wait("replica b standing by", lambda: "stands by" in b.logs(), 60)
        assert leader.holder(election, api) == "a"
        workers_before = {p.metadata.name for p in bed.running_workers("before")}

        a.kill()
        killed = time.monotonic()
        bed.create_job("during", max_workers=2)  # nobody leads for a few seconds: it waits for b
        bed.wait("replica b holding the Lease", lambda: leader.holder(election, api) == "b", 60)
        failover_s = time.monotonic() - killed
        print(f"failover: SIGKILL of the leader -> standby holds the Lease in {failover_s:.1f} s")
        bed.wait("the new leader's workers for 'during'", lambda: len(bed.running_workers("during")) == 2, 90)

        # The running job was not touched by the change of leader: same workers, nothing counted.
        assert {p.metadata.name for p in bed.running_workers("before")} == workers_before
        assert not (bed.status("before").get("failures") or 0)
        assert not (bed.status("during").get("failures") or 0)

        b.stop()  # SIGTERM: stop kopf, hand the Lease back
        bed.wait("the Lease released", lambda: leader.holder(election, api) is None, 30)
        assert b.proc is not None and b.proc.returncode == 0, b.logs()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthz(port: int) -> str | None:
    """The body of a 200 answer on /healthz, else None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.read().decode() if resp.status == 200 else None
    except OSError:
        return None


def test_a_standby_answers_its_health_probe_and_the_leader_after_it(
    bed: Bed, cluster: Cluster, tmp_path: Path
) -> None:
    # The chart probes /healthz for liveness and readiness. A standby without an answer was restarted by
    # its kubelet every minute and never Ready, so a rolling update of the two replicas hung (kind).
    api = cluster.api_client()
    election = leader.Election(namespace=bed.ns, identity="")
    port = _free_port()
    with _replicas(cluster, bed, tmp_path) as start:
        a = start("a")
        bed.wait("replica a holding the Lease", lambda: leader.holder(election, api) == "a", 60)
        b = start("b", f"--liveness-port={port}")
        bed.wait("replica b standing by", lambda: "stands by" in b.logs(), 60)
        bed.wait("the standby's /healthz", lambda: "standby" in (_healthz(port) or ""), 30)
        a.stop()  # SIGTERM: the Lease is handed back, b leads and kopf's endpoint takes the port
        bed.wait("replica b holding the Lease", lambda: leader.holder(election, api) == "b", 60)
        bed.wait("kopf's /healthz on its port", lambda: "standby" not in (_healthz(port) or "standby"), 60)
        assert b.proc is not None and b.proc.poll() is None, b.logs()

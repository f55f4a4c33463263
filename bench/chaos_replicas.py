"""The chaos bench's operator as the chart runs it: replicas that elect a leader through a Lease.

`bench/chaos.py` kills the leader (``leader-kill``) or every replica (``operator-restart``) and measures the
failover: from the SIGKILL to a standby holding the Lease (``etj_operator.k8s.leader``), read on the
apiserver. A killed replica is replaced at once by a new one with a fresh identity, as a Deployment's
ReplicaSet would start a new pod, so two replicas are always there to elect from.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etj_operator.k8s.leader import LEASE_NAME

JSON = dict[str, Any]
IDENTITY_FLAG = "--leader-identity"


def leader_flags(namespace: str, identity: str) -> list[str]:
    """The flags of one replica; the Lease timings stay the operator's (and the chart's) defaults."""
    return ["--leader-elect", "--leader-election-namespace", namespace, IDENTITY_FLAG, identity]


def identity_of(args: list[str]) -> str | None:
    """The ``--leader-identity`` in a replica's command line (None for a replica without one)."""
    if IDENTITY_FLAG in args and args.index(IDENTITY_FLAG) + 1 < len(args):
        return args[args.index(IDENTITY_FLAG) + 1]
    return None


def with_identity(args: list[str], identity: str) -> list[str]:
    """The same command line with another identity (a new pod of the same Deployment)."""
    i = args.index(IDENTITY_FLAG)
    return [*args[: i + 1], identity, *args[i + 2 :]]


def args_of(proc: subprocess.Popen[bytes]) -> list[str]:
    return [str(a) for a in proc.args]  # type: ignore[union-attr]


def lease_holder(lease: JSON | None) -> str | None:
    return ((lease or {}).get("spec") or {}).get("holderIdentity") or None


@dataclass
class Failover:
    """One leader kill: who held the Lease, when it was killed, and when another replica took it."""

    killed: str
    at: float  # monotonic time of the SIGKILL
    new_leader: str | None = None
    seconds: float | None = None

    def observe(self, holder: str | None, now: float) -> bool:
        """Record a new holder; True once the failover is over."""
        if self.seconds is None and holder is not None and holder != self.killed:
            self.new_leader, self.seconds = holder, round(now - self.at, 1)
        return self.seconds is not None


@dataclass
class Replicas:
    """The operator processes of a demo (``procs`` is the demo's list; replicas sit at ``slots``)."""

    procs: list[subprocess.Popen[bytes]]
    slots: list[int]
    log_path: Path
    read_lease: Callable[[], JSON | None]
    serial: int = field(default=0)
    failovers: list[Failover] = field(default_factory=list)
    exits: list[tuple[str, int]] = field(default_factory=list)  # replicas that exited by themselves

    def holder(self) -> str | None:
        return lease_holder(self.read_lease())

    def add(self, template: list[str]) -> int:
        """Start one more replica from ``template``'s command with a fresh identity; its slot in procs."""
        self.procs.append(self._spawn(template))
        self.slots.append(len(self.procs) - 1)
        return self.slots[-1]

    def kill(self, slot: int, why: str) -> str:
        """SIGKILL the replica at ``slot`` (no clean shutdown: the Lease is not released) and replace it."""
        old = self.procs[slot]
        old.send_signal(signal.SIGKILL)
        old.wait(30)
        identity = identity_of(args_of(old)) or "?"
        self._mark(f"chaos: {why}: replica {identity} (pid {old.pid}) SIGKILLed")
        self.procs[slot] = self._spawn(args_of(old))
        return identity

    def restart_exited(self) -> list[tuple[str, int]]:
        """Start again every replica that exited by itself, as the kubelet restarts a container: a leader
        that cannot renew its Lease (an apiserver too slow to answer) exits by design. (identity, code)."""
        exited: list[tuple[str, int]] = []
        for slot in self.slots:
            old = self.procs[slot]
            if old.poll() is not None:
                exited.append((identity_of(args_of(old)) or "?", old.returncode))
                self._mark(f"chaos: replica {exited[-1][0]} exited ({old.returncode}); restarted")
                self.procs[slot] = self._spawn(args_of(old))
        self.exits.extend(exited)
        return exited

    def kill_leader(self, now: float) -> str | None:
        """Kill the replica holding the Lease; None when no replica holds it (an election in progress)."""
        holder = self.holder()
        slot = next((s for s in self.slots if identity_of(args_of(self.procs[s])) == holder), None)
        if holder is None or slot is None:
            return None
        self.kill(slot, "leader-kill")
        self.failovers.append(Failover(killed=holder, at=now))
        return holder

    def kill_all(self) -> list[str]:
        return [self.kill(slot, "operator-restart") for slot in self.slots]

    def observe(self, now: float) -> Failover | None:
        """Check the pending failover against the Lease; the failover when it just completed."""
        pending = next((f for f in self.failovers if f.seconds is None), None)
        if pending is not None and pending.observe(self.holder(), now):
            self._mark(f"chaos: {pending.new_leader} leads {pending.seconds} s after the leader's kill")
            return pending
        return None

    def _spawn(self, template: list[str]) -> subprocess.Popen[bytes]:
        self.serial += 1
        args = with_identity(template, f"chaos-op-{self.serial}")
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _mark(self, line: str) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== {line} ====\n".encode())


def lease_path(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE_NAME}"

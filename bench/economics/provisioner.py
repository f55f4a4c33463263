"""The bed's on-demand autoscaler: a stand-in for Karpenter (or the cluster autoscaler scaling an on-demand
node group), pure.

What the deadline policy relies on is the autoscaler's contract, not its code: a pod that only on-demand
capacity can take, pending, gets an on-demand node some time later; a node left empty goes (Karpenter's
consolidation of empty nodes). This module decides exactly that, once per poll; bench/spot_replay.py
creates and deletes the process-backed nodes it names.

Why a stand-in and not Karpenter's kwok provider: Karpenter's kwok provider creates kwok nodes, and kwok
fakes the pods bound to them; the replay's workers must run the real trainer, which only the bed's
process-backed nodes do. tests/integration/test_operator_deadline.py uses the same rule (a kwok node a few
seconds after a pending on-demand-pinned pod appears) with fake pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Scaling:
    launch: int = 0  # new on-demand nodes that come up now
    remove: tuple[str, ...] = ()  # empty on-demand nodes that go now


@dataclass
class OnDemandProvisioner:
    """Brings on-demand nodes ``delay_s`` after pods pinned to on-demand are pending, removes them
    ``idle_s`` after they were last busy. Time is whatever clock the caller uses (seconds)."""

    delay_s: float
    idle_s: float
    launching: list[float] = field(default_factory=list)  # when each node asked for comes up
    idle_since: dict[str, float] = field(default_factory=dict)

    def step(self, now: float, pending: int, nodes: Mapping[str, bool]) -> Scaling:
        """``pending``: pods pinned to on-demand with no node; ``nodes``: this provisioner's nodes, each
        True while a worker is bound to it."""
        due = [t for t in self.launching if t <= now]
        self.launching = [t for t in self.launching if t > now]
        empty = [n for n, busy in nodes.items() if not busy]
        # Supply the pending pods will find: empty nodes (a pod not bound yet) and nodes still coming.
        short = pending - len(empty) - len(self.launching) - len(due)
        self.launching += [now + self.delay_s] * max(0, short)
        for name, busy in nodes.items():
            if busy:
                self.idle_since.pop(name, None)
            else:
                self.idle_since.setdefault(name, now)
        # Consolidation: an empty node goes after idle_s, unless a pending pod may still take it.
        spare = max(0, len(empty) - pending)
        remove = sorted(
            (n for n in empty if now - self.idle_since[n] >= self.idle_s), key=lambda n: self.idle_since[n]
        )[:spare]
        for name in remove:
            del self.idle_since[name]
        return Scaling(launch=len(due), remove=tuple(remove))

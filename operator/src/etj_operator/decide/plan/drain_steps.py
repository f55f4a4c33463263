"""The planner's steps that drain workers: what is going away, what crashed, and which workers stop.

Each takes only what it reads and returns a ``StepResult`` (its drains, and when to look again); the planner
merges it and takes the survivors after it (``model.remaining``). None does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from etj_operator.api.models import Phase
from etj_operator.decide.plan.interruptions import interruption_of, not_ready_wait
from etj_operator.decide.plan.model import Observed, StepResult
from etj_operator.decide.types import Drain
from etj_operator.observe.pods import PodInfo
from etj_operator.observe.signals import Reason


def drain_interrupted(active: Sequence[PodInfo], obs: Observed) -> StepResult:
    """Drain every active worker whose node (or the pod itself) is going away."""
    drains = []
    for pod in active:
        sig = interruption_of(pod, obs)
        if sig is not None:
            drains.append(Drain(pod.name, sig.reason, sig.message, pod.node, sig.since))
    return StepResult(drains=tuple(drains))


def recheck_not_ready(active: Sequence[PodInfo], obs: Observed) -> StepResult:
    """Look again when a NotReady node's grace period ends, even if no event arrives by then."""
    waits = []
    for pod in active:
        node = obs.nodes.get(pod.node) if pod.node else None
        if node is not None and node.signal is not None and node.signal.reason == Reason.NODE_NOT_READY:
            wait = not_ready_wait(node.signal, obs.now)
            if wait > 0:
                waits.append(wait)
    return StepResult(wake_in=min(waits, default=None))


@dataclass(frozen=True, kw_only=True)
class Crashed(StepResult):
    new_failures: int = 0  # crashed workers (an interrupted node's pods are not crashes)


def drain_crashed(workers: Sequence[PodInfo], obs: Observed, phase: Phase | None) -> Crashed:
    """Crashed workers count against the budget and are deleted so their slot is refilled. ``phase``: the
    job's phase as last written (a finished job counts nothing)."""
    if phase in (Phase.SUCCEEDED, Phase.FAILED):
        return Crashed()
    drains, crashes = [], 0
    for pod in workers:
        if pod.terminating or pod.phase != "Failed":
            continue
        sig = interruption_of(pod, obs)
        if sig is None:
            crashes += 1
            how = f"{pod.exit_reason}, exit code" if pod.exit_reason not in (None, "Error") else "exit code"
            reason, msg = Reason.WORKER_FAILED, f"worker {pod.name} failed ({how} {pod.exit_code})"
            if pod.last_line:
                msg += f": {pod.last_line}"  # the trainer's last log line names the cause
        else:
            # The node went away under it: an interruption, not a crash of the trainer.
            reason, msg = sig.reason, f"worker {pod.name} stopped: {sig.message}"
        drains.append(Drain(pod.name, reason, msg, pod.node))
    return Crashed(drains=tuple(drains), new_failures=crashes)


def stop_workers(stop_reason: Reason | None, survivors: Sequence[PodInfo]) -> StepResult:
    """A finished, failed or suspended job keeps no worker."""
    if stop_reason is None:
        return StepResult()
    return StepResult(
        drains=tuple(
            Drain(pod.name, stop_reason, f"worker {pod.name} stopped: {stop_reason}", pod.node)
            for pod in survivors
        )
    )


def trim_to_max(
    most: int, desired_before: int | None, stop_reason: Reason | None, survivors: Sequence[PodInfo]
) -> StepResult:
    """Scaled down by the user (or the scale subresource) to ``most`` (replicas.max): drop pending workers
    first, then the highest slots, so the lowest, longest-running ranks stay.

    Without a lower max than ``desired_before`` (status.desiredReplicas) it is an excess worker: an index
    that lagged past the expectation TTL let one more pod be created (rare, and corrected here).
    """
    if stop_reason is not None or len(survivors) <= most:
        return StepResult()
    why = Reason.SCALED_BY_USER if (desired_before or 0) > most else Reason.EXCESS_WORKER
    extra = sorted(survivors, key=lambda p: (p.phase == "Running", -(p.slot or 0)))
    return StepResult(
        drains=tuple(
            Drain(pod.name, why, f"replicas.max is {most}", pod.node)
            for pod in extra[: len(survivors) - most]
        )
    )


def recreate_stale_avoiders(
    stop_reason: Reason | None, avoid_nodes: Sequence[str], survivors: Sequence[PodInfo]
) -> StepResult:
    """A Pending worker created to avoid a node that is no longer avoided is recreated: its affinity is fixed
    at creation, and it may be waiting for exactly that node (a small pool whose nodes all crashed once)."""
    if stop_reason is not None:
        return StepResult()
    allowed, drains = set(avoid_nodes), []
    for pod in survivors:
        stale = sorted(set(pod.avoids) - allowed)
        if pod.phase == "Pending" and pod.node is None and stale:
            msg = f"pending worker {pod.name} recreated: node {', '.join(stale)} no longer avoided"
            drains.append(Drain(pod.name, Reason.AVOIDANCE_EXPIRED, msg))
    return StepResult(drains=tuple(drains))

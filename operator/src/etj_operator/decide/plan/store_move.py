"""Where the job's store runs, and how it moves: make before break (issue 26, item 5). Pure.

The job's Service selects one store index (``etj.dev/store``): the serving store, the one the agents
resolve. When its node is being emptied (a cordon, a drain's or Karpenter's taint, a spot or maintenance
notice) the store is not deleted at once: a replacement starts under the next index, outside the Service,
and only once it is Ready the Service is switched to it and the old store deleted. The agents, whose
client still talks to the old store, lose it then, resolve the name again and find the new one already
listening (etj_trainer.agent.store_link): the store is away for the agents' probe interval, not for a
pod's scheduling, image pull and start. Until then the store's PodDisruptionBudget keeps the drain's
eviction waiting (decide/objects/dataplane.py); the operator's delete is what lets it finish.

A node that is gone (deleted, NotReady past its grace) has no store to keep: that one is replaced at
once, as is a store pod that exited. A replacement that is not Ready after ``MOVE_TIMEOUT`` stops
holding the old store back (a drain must not wait for ever on a store that cannot schedule). A move
whose reason went away (the node was uncordoned) is called off: the old store stays and the
replacement goes, so an undone cordon costs the job nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from etj_operator.decide.objects.names import rendezvous_index
from etj_operator.decide.plan.interruptions import STORE_STAYS_ON, interruption_of
from etj_operator.decide.plan.model import Observed
from etj_operator.decide.types import Drain, KubeEvent
from etj_operator.observe.pods import TERMINAL_PHASES, PodInfo
from etj_operator.observe.signals import Reason, Signal

# How long a leaving store waits for its replacement to be Ready. Scheduling, a new node from the
# autoscaler and the image pull take a few minutes on EKS; a spot notice gives two, and then the node is
# deleted anyway (a node loss: no wait). Past this the move is break-before-make, as before issue 26.
MOVE_TIMEOUT = timedelta(minutes=5)
# The store is gone with its node: nothing to keep, replace it now. Deleted and NotReady nodes never
# confirm a graceful delete, so those pods are removed with grace 0.
GONE = frozenset({Reason.NODE_DELETED, Reason.NODE_NOT_READY, Reason.NODE_LOST})
FORCED = frozenset({Reason.NODE_DELETED, Reason.NODE_NOT_READY})
STORE_MOVING = "StoreMoving"
STORE_MOVED = "StoreMoved"


@dataclass
class StorePlan:
    drains: list[Drain] = field(default_factory=list)
    create: int | None = None  # index of a new store pod to create now
    serve: int | None = None  # the index the Service selects; None: leave the Service as it is
    events: list[KubeEvent] = field(default_factory=list)
    requeue: float | None = None  # seconds until a replacement's wait times out


def _index(job: str, pod: PodInfo) -> int:
    return rendezvous_index(job, pod.name) or 0


def _signal(pod: PodInfo, obs: Observed) -> Signal | None:
    sig = interruption_of(pod, obs)
    return None if sig is None or sig.reason in STORE_STAYS_ON else sig


def _drain(pod: PodInfo, reason: Reason, message: str, since: datetime | None = None) -> Drain:
    return Drain(pod.name, reason, message, pod.node, since, role="rendezvous", force=reason in FORCED)


def _leave(pod: PodInfo, sig: Signal) -> Drain:
    return _drain(pod, sig.reason, sig.message, sig.since)


def plan_store(job: str, rdzv: Sequence[PodInfo], obs: Observed, next_index: int) -> StorePlan:
    """Which store pods to delete, whether to start one, which one the Service selects."""
    out = StorePlan()
    live: list[PodInfo] = []
    leaving: dict[str, Signal] = {}
    for pod in rdzv:
        sig = _signal(pod, obs)
        gone = sig is not None and sig.reason in GONE
        if sig is not None and gone and (not pod.terminating or sig.reason in FORCED):
            # A pod on a lost node stays Terminating until its kubelet confirms, which never happens:
            # removing it (grace 0) is what the pod garbage collector would do minutes later.
            out.drains.append(_leave(pod, sig))
        elif pod.terminating or gone:
            continue  # being deleted on a live node: left to finish, never served again
        elif pod.phase in TERMINAL_PHASES:
            out.drains.append(_drain(pod, Reason.WORKER_FAILED, "store pod exited"))
        else:
            live.append(pod)
            if sig is not None:
                leaving[pod.name] = sig
    live.sort(key=lambda p: _index(job, p))
    if not live:
        out.create = out.serve = next_index
        return out
    serving, others = live[0], live[1:]  # the oldest serves: replacements always take a higher index
    staying = [p for p in others if p.name not in leaving]
    sig = leaving.get(serving.name)
    if sig is None:
        _keep(job, serving, others, leaving, out)
    elif serving.store is None:
        # Started by an operator older than these moves: its Service selects every store pod of the job,
        # so no replacement can be kept out of it. Moved as before: deleted now, replaced at once.
        out.drains.append(_leave(serving, sig))
        if staying:
            _keep(job, staying[0], [p for p in others if p is not staying[0]], leaving, out)
        else:
            out.drains += [_leave(p, leaving[p.name]) for p in others]
            out.create = out.serve = next_index
    elif not staying:
        _start_replacement(job, serving, sig, others, leaving, next_index, out)
    else:
        _switch(job, serving, sig, staying[0], others, leaving, obs, out)
    return out


def _keep(
    job: str, serving: PodInfo, others: list[PodInfo], leaving: dict[str, Signal], out: StorePlan
) -> None:
    """The serving store stays: any other store pod is a replacement no longer needed."""
    # An older operator's store has no index label: its Service must keep selecting job and role.
    out.serve = _index(job, serving) if serving.store is not None else None
    for pod in others:
        sig = leaving.get(pod.name)
        if sig is not None:
            out.drains.append(_leave(pod, sig))
        else:
            msg = f"store move called off: {serving.name} stays (its node is no longer being emptied)"
            out.drains.append(_drain(pod, Reason.STORE_NOT_NEEDED, msg))


def _start_replacement(
    job: str,
    serving: PodInfo,
    sig: Signal,
    others: list[PodInfo],
    leaving: dict[str, Signal],
    next_index: int,
    out: StorePlan,
) -> None:
    """The serving store must go and nothing can take over: start one, outside the Service."""
    out.serve = _index(job, serving)
    out.create = next_index
    # Replacements whose own node is being emptied too.
    out.drains += [_leave(pod, leaving[pod.name]) for pod in others]
    msg = (
        f"store {serving.name} is moving ({sig.message}): its replacement starts first, "
        "and the agents are switched to it once it is ready"
    )
    out.events.append(KubeEvent("Normal", STORE_MOVING, msg))
    out.requeue = MOVE_TIMEOUT.total_seconds()


def _switch(
    job: str,
    serving: PodInfo,
    sig: Signal,
    new: PodInfo,
    others: list[PodInfo],
    leaving: dict[str, Signal],
    obs: Observed,
    out: StorePlan,
) -> None:
    """A replacement exists: switch the Service to it and let the old store go once it is Ready."""
    for pod in others:
        if pod is new:
            continue
        s = leaving.get(pod.name)
        extra = f"a second replacement for {serving.name}"
        out.drains.append(_leave(pod, s) if s else _drain(pod, Reason.STORE_NOT_NEEDED, extra))
    waited = obs.now - (new.created or obs.now)
    if not (new.running and new.ready) and waited < MOVE_TIMEOUT:
        out.serve = _index(job, serving)
        out.requeue = (MOVE_TIMEOUT - waited).total_seconds()
        return
    out.serve = _index(job, new)
    if new.running and new.ready:
        msg = f"store moved to {new.name} ({sig.message})"
    else:
        msg = f"store moved to {new.name}, not ready after {int(waited.total_seconds())} s ({sig.message})"
    out.drains.append(_drain(serving, sig.reason, msg, sig.since))
    out.events.append(KubeEvent("Normal", STORE_MOVED, msg))

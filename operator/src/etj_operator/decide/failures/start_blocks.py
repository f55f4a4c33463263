"""Pods that never start (pure): a job says why it is not running, and stops waiting after a deadline.

A pod the kubelet cannot start (an image it cannot pull, a Secret that does not exist) or no node can take
(the scheduler's Unschedulable) used to leave the job Pending with nothing said, and a bad store image
showed up 30 minutes later as workers failing with a message about the store. Here every such pod is found
from the state the kubelet and the scheduler write on it (observe/pods.pod_blocker), and:

- the PodsBlocked condition and the Ready condition's reason name the cause with the kubelet's or the
  scheduler's own words, and one Warning Event per distinct cause says it (decide/status/conditions.py);
- after ``failurePolicy.podStartDeadlineSeconds`` the job is Failed with that cause.

What counts, and what is transient:

- Only pods that never ran (``PodInfo.never_started``): a container that ran and then waits again (a
  restart whose image pull fails) is a crash, judged by the failure budget and the crash loop.
- The clock runs only while the job is not Ready (fewer than replicas.min workers running, or no store
  running), from the later of the pod's creation and the job losing Ready (the Ready condition's
  lastTransitionTime, so the judgement is level-based: a restarted operator resumes the same clock). An
  elastic job training at min with extras pending for capacity is working as intended: the scheduler's
  Unschedulable on those extras is not even reported (pending extras are the autoscaler's demand signal).
  A kubelet error on an extra is reported, but fails nothing while the job trains.
- ErrImagePull/ImagePullBackOff (a registry down, rate limits, credentials late), ErrImageNeverPull (the
  image may be on another node), CreateContainerConfigError (a Secret or ConfigMap created after the job, as
  GitOps tools often do), CreateContainerError (the runtime) and Unschedulable (an autoscaler bringing a
  node) may all recover by themselves: they get the deadline. InvalidImageName never does (the reference
  does not parse; a pod's image cannot change), so it fails the job at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from etj_operator.api.models import Condition, ConditionStatus, ConditionType
from etj_operator.observe.pods import KUBELET_BLOCKERS, UNSCHEDULABLE, Blocker, PodInfo

# Waiting reasons no retry can clear: the job fails on first sight (unless the deadline is 0, off).
PERMANENT = frozenset({"InvalidImageName"})
# One failing pull shows as ErrImagePull and ImagePullBackOff in turn (the kubelet's retry, then its
# back-off): one cause, one Warning Event.
_SAME_CAUSE = {"ErrImagePull": "ImagePullBackOff"}
DEADLINE_FIELD = "failurePolicy.podStartDeadlineSeconds"


def cause(reason: str | None) -> str | None:
    """The cause a reason belongs to, for telling a new cause from the same one seen again."""
    return _SAME_CAUSE.get(reason, reason) if reason is not None else None


@dataclass(frozen=True)
class BlockedPod:
    pod: str
    role: str  # "worker" or "rendezvous"
    blocker: Blocker
    waited: float  # seconds the job has waited for it (0 while the job is Ready: the clock is stopped)

    def describe(self) -> str:
        """Which pod, which container, and the kubelet's or scheduler's reason and message, quoted: e.g.
        'store pod j-rdzv-0 (container store): ImagePullBackOff: Back-off pulling image "x"'."""
        what = "store" if self.role == "rendezvous" else self.role
        where = f" (container {self.blocker.container})" if self.blocker.container else ""
        words = f": {self.blocker.message}" if self.blocker.message else ""
        return f"{what} pod {self.pod}{where}: {self.blocker.reason}{words}"


@dataclass(frozen=True)
class StartBlocks:
    """This reconcile's blocked pods (most telling first) and the verdict on them."""

    blocked: tuple[BlockedPod, ...] = ()
    failure: BlockedPod | None = None  # the pod whose wait fails the job now; None: the job waits on
    deadline: int = 0
    wake_in: float | None = None  # seconds until the deadline passes for the longest waiter

    @property
    def reason(self) -> str | None:
        return self.blocked[0].blocker.reason if self.blocked else None

    @property
    def message(self) -> str:
        if not self.blocked:
            return ""
        more = len(self.blocked) - 1
        return self.blocked[0].describe() + (f" (and {more} more pods blocked)" if more else "")

    @property
    def failure_message(self) -> str:
        if self.failure is None:
            return ""
        why = (
            f"{self.failure.blocker.reason} never recovers"
            if self.failure.blocker.reason in PERMANENT
            else f"not started after {self.failure.waited:.0f} s ({DEADLINE_FIELD} {self.deadline})"
        )
        return f"{self.failure.describe()}; {why}"


def _rank(p: BlockedPod) -> tuple[bool, bool, bool, str]:
    # What to name first: a cause that never recovers, then the kubelet's (a fix to make) before the
    # scheduler's (often just a wait), the store (no store, no job) before workers, then by name.
    return (
        p.blocker.reason not in PERMANENT,
        p.blocker.reason == UNSCHEDULABLE,
        p.role != "rendezvous",
        p.pod,
    )


def not_ready_since(conditions: Sequence[Condition]) -> datetime | None:
    """When the job lost Ready, from its Ready condition; None while it is Ready or has none yet."""
    was = next((c for c in conditions if c.type == ConditionType.READY), None)
    return was.last_transition_time if was is not None and was.status == ConditionStatus.FALSE else None


def judge_start(
    pods: Sequence[PodInfo],
    job_ready: bool,
    not_ready_since: datetime | None,
    now: datetime,
    deadline: int,
    started: bool = False,
) -> StartBlocks:
    """The blocked pods among ``pods`` (the job's active workers and live stores) and whether the job fails.

    ``not_ready_since``: when the job last lost Ready (None: it has not been seen Ready=False yet, the
    clock starts now). ``deadline``: failurePolicy.podStartDeadlineSeconds, 0 never fails. ``started``: the
    job has trained (status.startTime); its pods waiting for a node are then a capacity drought, said but
    never failed for: a spot job below min waits for spot to come back, which is what it is for.
    """
    blocked: list[BlockedPod] = []
    for pod in pods:
        if not pod.never_started or pod.blocker is None:
            continue
        if job_ready and pod.blocker.reason == UNSCHEDULABLE:
            continue  # an elastic extra waiting for capacity beside a training job: by design
        waited = 0.0
        if not job_ready:
            # Not seen not-Ready before (it was Ready, or is new): the job's wait starts now, however old
            # the pod (an elastic extra pending for hours beside a training job).
            since = max(pod.created or now, not_ready_since or now)
            waited = max(0.0, (now - since).total_seconds())
        blocked.append(BlockedPod(pod.name, pod.role, pod.blocker, waited))
    blocked.sort(key=_rank)
    if job_ready or deadline <= 0 or not blocked:
        return StartBlocks(tuple(blocked), deadline=deadline)
    timed = [p for p in blocked if not (started and p.blocker.reason == UNSCHEDULABLE)]
    over = [p for p in timed if p.blocker.reason in PERMANENT or p.waited >= deadline]
    if over:
        return StartBlocks(tuple(blocked), failure=over[0], deadline=deadline)
    wake = min((deadline - p.waited for p in timed), default=None)
    return StartBlocks(tuple(blocked), deadline=deadline, wake_in=None if wake is None else wake + 1.0)


def failed_as(start: StartBlocks, conditions: Sequence[Condition], failed: bool) -> tuple[str, str] | None:
    """The reason and message of a job Failed because a pod never started: decided this round, or kept from
    the Failed condition once written (its pods are drained after that, their blockers with them). None for
    a job failed by its failure budget, whose condition is worked out every time, as before."""
    if start.failure is not None:
        return start.failure.blocker.reason, start.failure_message
    was = next((c for c in conditions if c.type == ConditionType.FAILED), None)
    start_reasons = KUBELET_BLOCKERS | {UNSCHEDULABLE}
    if failed and was is not None and was.status == ConditionStatus.TRUE and was.reason in start_reasons:
        return was.reason, was.message
    return None

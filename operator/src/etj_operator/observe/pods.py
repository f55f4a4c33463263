"""What the operator needs to know about a pod, parsed once when the pod index sees it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from etj_operator.constants import (
    ANNOTATION_AVOIDED_NODES,
    LABEL_CAPACITY,
    LABEL_JOB,
    LABEL_KUEUE_SEAT,
    LABEL_ROLE,
    LABEL_SLOT,
    LABEL_STORE,
)
from etj_operator.observe.signals import Signal, pod_signal
from etj_operator.quantity import MILLI_RESOURCES, parse_count, parse_milli
from etj_operator.timeutil import parse_time

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
MAX_LINE = 512  # of a failed container's last log line, quoted in Events
MAX_BLOCKER_MESSAGE = 1024  # of the kubelet's or scheduler's words, quoted in a condition and an Event

# Waiting reasons of a container that is not coming up by itself soon: the kubelet retries some of them
# (a registry that was down, a Secret created late) and not others (decide/failures/start_blocks.py judges
# which).
# "ContainerCreating" and "PodInitializing" are the normal way up and are not here; "CrashLoopBackOff" is
# a container that ran (crash_loop.py's business).
KUBELET_BLOCKERS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
UNSCHEDULABLE = "Unschedulable"  # PodScheduled=False's reason when no node can take the pod


@dataclass(frozen=True)
class Blocker:
    """Why a pod that never ran does not start: the scheduler's or the kubelet's reason and its words."""

    reason: str  # "Unschedulable", or a container's waiting reason (KUBELET_BLOCKERS)
    message: str
    container: str | None = None  # the container that waits (None: the scheduler's)


def pod_blocker(status: Mapping[str, Any]) -> Blocker | None:
    """The kubelet's blocking waiting reason of a container (init containers first: they run first), else
    the scheduler's Unschedulable, else None (a pod on its normal way up, or one that runs)."""
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in KUBELET_BLOCKERS:
                message = str(waiting.get("message") or "")[:MAX_BLOCKER_MESSAGE]
                return Blocker(str(waiting["reason"]), message, cs.get("name"))
    for cond in status.get("conditions") or []:
        scheduled = cond.get("type") == "PodScheduled"
        if scheduled and cond.get("status") == "False" and cond.get("reason") == UNSCHEDULABLE:
            return Blocker(UNSCHEDULABLE, str(cond.get("message") or "")[:MAX_BLOCKER_MESSAGE])
    return None


def containers_ran(status: Mapping[str, Any]) -> bool:
    """Has any of the pod's (main) containers ever run? A container that ran and then waits (a restart
    whose image pull fails) belongs to the failure budget and crash loops, not to start-up."""
    for cs in status.get("containerStatuses") or []:
        state, last = cs.get("state") or {}, cs.get("lastState") or {}
        if "running" in state or "terminated" in state or "terminated" in last or cs.get("restartCount"):
            return True
    return False


@dataclass(frozen=True)
class PodInfo:
    name: str
    job: str = ""
    role: str = ""
    slot: int | None = None
    uid: str = ""
    phase: str = "Pending"
    node: str | None = None
    terminating: bool = False
    ip: str | None = None
    signal: Signal | None = None
    exit_code: int | None = None
    # The kubelet's word for how the container ended ("OOMKilled", "Error", "ContainerCannotRun"): an OOM kill
    # leaves exit code 137 and no message, so only this names the cause.
    exit_reason: str | None = None
    created: datetime | None = None
    scheduled_at: datetime | None = None
    finished_at: datetime | None = None  # when the (last) container terminated
    # The last line of the terminated container's message: with terminationMessagePolicy
    # FallbackToLogsOnError (worker pods) the kubelet puts the log's tail there when the container failed.
    last_line: str | None = None
    requests: Mapping[str, int] = field(default_factory=dict)
    owner_uid: str = ""  # uid of the controlling ElasticTrainingJob
    pinned: str | None = None  # the capacity type the pod is pinned to (etj.dev/capacity), if any
    avoids: tuple[str, ...] = ()  # the nodes it was created to avoid (etj.dev/avoided-nodes)
    # spec.priorityClassName: fixed at creation, it says whether a worker is one of the job's min workers
    # or an elastic extra (decide/plan/sharing.py).
    priority_class: str | None = None
    # The Kueue Workload the worker runs under (etj.dev/kueue-seat), if the job goes through Kueue.
    seat: str | None = None
    ready: bool = False  # the Ready condition is True (a store: its TCPStore accepts connections)
    # A store pod's etj.dev/store label (its index), which the Service selects; None on store pods made by
    # operators before make-before-break moves (their Service selects job and role only).
    store: str | None = None
    # What holds the pod back while it waits (observe.pod_blocker), and whether a container of it ever ran:
    # decide/failures/start_blocks.py reports, and after failurePolicy.podStartDeadlineSeconds fails, jobs
    # whose pods
    # never start (a missing image or Secret, no node that fits).
    blocker: Blocker | None = None
    ran: bool = False

    @property
    def active(self) -> bool:
        """Counts toward the job's workers: not terminating and not finished."""
        return not self.terminating and self.phase not in TERMINAL_PHASES

    @property
    def exited_ok(self) -> bool:
        """Exited 0 by itself (not a pod we are deleting): for a worker, training has finished."""
        return self.phase == "Succeeded" and not self.terminating

    @property
    def running(self) -> bool:
        return self.active and self.phase == "Running"

    @property
    def never_started(self) -> bool:
        """Active, still Pending, and no container of it has run yet."""
        return self.active and self.phase == "Pending" and not self.ran


def countable_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """What a pod's containers request, summed: whole-unit extended resources (GPUs), and cpu and memory
    in milli-units (the same units as ``NodeInfo.allocatable``). A resource without a request counts its
    limit, as the apiserver defaults the request to it."""
    out: dict[str, int] = {}
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for key, raw in wanted.items():
            count = parse_milli(raw) if key in MILLI_RESOURCES else parse_count(raw) if "/" in key else None
            if count:
                out[key] = out.get(key, 0) + count
    return out


def pod_info(body: Mapping[str, Any]) -> PodInfo:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    labels = meta.get("labels") or {}
    slot_raw = labels.get(LABEL_SLOT)
    exit_code, exit_reason, finished_at, last_line = None, None, None, None
    for cs in status.get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated is not None:
            exit_code = terminated.get("exitCode")
            exit_reason = terminated.get("reason") or exit_reason
            finished_at = parse_time(terminated.get("finishedAt")) or finished_at
            lines = [ln.strip() for ln in str(terminated.get("message") or "").splitlines() if ln.strip()]
            last_line = lines[-1][:MAX_LINE] if lines else last_line
    scheduled_at, ready = None, False
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "True":
            scheduled_at = parse_time(cond.get("lastTransitionTime"))
        if cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
    return PodInfo(
        name=meta.get("name", ""),
        job=labels.get(LABEL_JOB, ""),
        role=labels.get(LABEL_ROLE, ""),
        slot=int(slot_raw) if slot_raw and slot_raw.isdigit() else None,
        pinned=labels.get(LABEL_CAPACITY) or None,
        seat=labels.get(LABEL_KUEUE_SEAT) or None,
        avoids=tuple(
            n for n in ((meta.get("annotations") or {}).get(ANNOTATION_AVOIDED_NODES) or "").split(",") if n
        ),
        uid=meta.get("uid", ""),
        phase=status.get("phase") or "Pending",
        node=spec.get("nodeName") or None,
        terminating=bool(meta.get("deletionTimestamp")),
        ip=status.get("podIP") or None,
        signal=pod_signal(body),
        exit_code=exit_code,
        exit_reason=exit_reason,
        created=parse_time(meta.get("creationTimestamp")),
        scheduled_at=scheduled_at,
        ready=ready,
        store=labels.get(LABEL_STORE),
        finished_at=finished_at,
        last_line=last_line,
        blocker=pod_blocker(status),
        ran=containers_ran(status),
        requests=countable_requests(spec),
        priority_class=spec.get("priorityClassName") or None,
        owner_uid=next(
            (o.get("uid", "") for o in meta.get("ownerReferences") or [] if o.get("controller")), ""
        ),
    )

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
    LABEL_ROLE,
    LABEL_SLOT,
    LABEL_STORE,
)
from etj_operator.observe.signals import Signal, pod_signal
from etj_operator.quantity import MILLI_RESOURCES, parse_count, parse_milli
from etj_operator.timeutil import parse_time

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
MAX_LINE = 512  # of a failed container's last log line, quoted in Events


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
    # or an elastic extra (decide/sharing.py).
    priority_class: str | None = None
    ready: bool = False  # the Ready condition is True (a store: its TCPStore accepts connections)
    # A store pod's etj.dev/store label (its index), which the Service selects; None on store pods made by
    # operators before make-before-break moves (their Service selects job and role only).
    store: str | None = None

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
        requests=countable_requests(spec),
        priority_class=spec.get("priorityClassName") or None,
        owner_uid=next(
            (o.get("uid", "") for o in meta.get("ownerReferences") or [] if o.get("controller")), ""
        ),
    )

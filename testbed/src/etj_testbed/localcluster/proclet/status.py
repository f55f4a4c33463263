"""The status a process-backed pod reports, in the shape the kubelet writes it.

`ContainerRun` tracks one container's process across restarts; `pod_status` turns the runs into the
`status` of a strategic-merge patch (conditions merge by type; container status lists are written whole).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from etj_testbed.localcluster.proclet.kube import now_rfc3339

JSON = dict[str, Any]
FALLBACK_TO_LOGS = "FallbackToLogsOnError"
START_MARK = "--- proclet: start"  # the line each container start writes to its log (pod.py)
Prober = Callable[[str, JSON, dict[str, int]], bool]


def exit_code(returncode: int) -> int:
    """Popen's -N for "killed by signal N" becomes 128+N, as container runtimes report it."""
    return 128 - returncode if returncode < 0 else returncode


def last_run(log_text: str) -> str:
    """What the container's last run wrote: the log after its last start line."""
    if START_MARK not in log_text:
        return log_text
    return log_text.rsplit(START_MARK, 1)[-1].partition("\n")[2]


@dataclass
class ContainerRun:
    spec: JSON
    init: bool = False
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exit_code: int | None = None
    started_at: str | None = None
    terminated: JSON | None = None
    last_terminated: JSON | None = None
    restart_at: float | None = None  # monotonic time of the next restart, while backing off
    start_error: bool = False  # the last start failed (no process to wait for)
    ready: bool = False
    _next_probe: float = 0.0
    _failures: int = 0
    ports: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ports = {
            p["name"]: int(p["containerPort"]) for p in self.spec.get("ports") or [] if p.get("name")
        }

    def started(self, at: str) -> None:
        if self.terminated is not None:
            self.last_terminated = self.terminated
        self.terminated, self.exit_code, self.started_at, self.start_error = None, None, at, False
        probe = self.spec.get("readinessProbe")
        self.ready = probe is None
        if probe is not None:
            self._next_probe = time.monotonic() + float(probe.get("initialDelaySeconds", 0))
            self._failures = 0

    def exited(self, returncode: int, at: str, log_tail: Callable[[], str] | None = None) -> None:
        """``log_tail``: what this run wrote to its log, read only when the kubelet would read it."""
        code = exit_code(returncode)
        self.proc, self.exit_code, self.ready = None, code, False
        self.terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": self.started_at or at,
            "finishedAt": at,
        }
        # The kubelet's FallbackToLogsOnError: a failed container's last log lines (at most 80 lines and
        # 2048 bytes) become its termination message, which the operator's WorkerFailed Event quotes.
        if (
            code != 0
            and log_tail is not None
            and self.spec.get("terminationMessagePolicy") == FALLBACK_TO_LOGS
        ):
            tail = "\n".join(log_tail().rstrip("\n").splitlines()[-80:]).encode()[-2048:]
            if tail:
                self.terminated["message"] = tail.decode(errors="replace")
        if returncode < 0:
            self.terminated["signal"] = -returncode

    def start_failed(self, message: str, at: str) -> None:
        if self.terminated is not None:
            self.last_terminated = self.terminated
        self.proc, self.exit_code, self.ready, self.start_error = None, 128, False, True
        self.terminated = {
            "exitCode": 128,
            "reason": "StartError",
            "message": message[:1000],
            "startedAt": at,
            "finishedAt": at,
        }

    def probe_due(self) -> bool:
        return "readinessProbe" in self.spec and time.monotonic() >= self._next_probe

    def probe(self, ip: str, prober: Prober) -> bool:
        """Run the readiness probe; True if readiness changed."""
        probe = self.spec["readinessProbe"]
        self._next_probe = time.monotonic() + float(probe.get("periodSeconds", 10))
        was = self.ready
        if prober(ip, probe, self.ports):
            self._failures = 0
            self.ready = True
        else:
            self._failures += 1
            if self._failures >= int(probe.get("failureThreshold", 3)) or not self.ready:
                self.ready = False
        return was != self.ready

    def status(self) -> JSON:
        state: JSON
        if self.proc is not None:
            state = {"running": {"startedAt": self.started_at}}
        elif self.restart_at is not None:
            state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off restarting failed container {self.spec['name']}",
                }
            }
        elif self.terminated is not None:
            state = {"terminated": self.terminated}
        else:
            state = {"waiting": {"reason": "PodInitializing" if not self.init else "ContainerCreating"}}
        status: JSON = {
            "name": self.spec["name"],
            "image": self.spec.get("image") or "proclet",
            "imageID": "",
            "ready": self.ready and self.proc is not None,
            "started": self.proc is not None,
            "restartCount": self.restarts,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        if self.started_at is not None:
            status["containerID"] = f"proclet://{self.spec['name']}-{self.restarts}"
        return status


def _condition(existing: list[JSON], ctype: str, ok: bool, reason: str | None, now: str) -> JSON:
    """A pod condition whose lastTransitionTime only moves when its status does."""
    status = "True" if ok else "False"
    old = next((c for c in existing if c.get("type") == ctype), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else now
    # reason is always written (null deletes it): the patch merges conditions by type, so an omitted
    # reason would leave the old "ContainersNotReady" on a condition that turned True.
    return {
        "type": ctype,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": since or now,
        "reason": reason if reason and not ok else None,
    }


def pod_status(pod: JSON, phase: str, ip: str, host_ip: str, runs: list[ContainerRun]) -> JSON:
    now = now_rfc3339()
    old: JSON = pod.get("status") or {}
    existing: list[JSON] = old.get("conditions") or []
    inits = [r for r in runs if r.init]
    mains = [r for r in runs if not r.init]
    terminal = phase in ("Succeeded", "Failed")
    initialized = all(r.exit_code == 0 for r in inits)
    ready = not terminal and bool(mains) and all(r.proc is not None and r.ready for r in mains)
    not_ready = "PodCompleted" if terminal else "ContainersNotReady"
    status: JSON = {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": old.get("startTime") or now,
        "conditions": [
            _condition(existing, "PodReadyToStartContainers", bool(ip), None, now),
            _condition(existing, "Initialized", initialized, "ContainersNotInitialized", now),
            _condition(existing, "ContainersReady", ready, not_ready, now),
            _condition(existing, "Ready", ready, not_ready, now),
        ],
        "containerStatuses": [r.status() for r in mains],
    }
    if ip:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    if inits:
        status["initContainerStatuses"] = [r.status() for r in inits]
    return status

"""The chaos bench's second job: bad data, so it must end Failed, with the trainer's error reported.

A job whose data path does not exist runs beside the chaos job from its submission: every start fails the
same way, so the operator's crash-loop bound and failure budget end it Failed, and the trainer's error
line reaches the user (the store's progress document, or the WorkerFailed Event quoting the pod).
"""

from __future__ import annotations

import base64
import time
from typing import Any

import yaml

from etj_contract.ports import PROGRESS_PORT
from etj_operator.decide.objects.names import TOKEN_KEY
from etj_operator.decide.objects.pod_env import token_secret_of
from etj_testbed.demo.local import Demo
from etj_testbed.demo.script import GROUP_PATH
from etj_trainer.core.progress import get_json

JSON = dict[str, Any]
BAD_JOB = "chaos-bad"


class BadJob:
    """The bad-data job's submission and what became of it (`record`: the bench's summary of it)."""

    def __init__(self) -> None:
        self.record: JSON = {
            "submitted_at": None,
            "failed_after_s": None,
            "error_after_s": None,
            "error": None,
        }

    def cleanup(self, demo: Demo) -> None:
        demo.kubectl(
            "delete", "etj", BAD_JOB, "-n", demo.ns, "--ignore-not-found", "--wait=false", check=False
        )

    def submit(self, demo: Demo) -> None:
        """A job whose data path does not exist: a deterministic trainer error on every start."""
        job = demo.job_manifest()
        job["metadata"]["name"] = BAD_JOB
        spec = job["spec"]
        spec["replicas"] = {"min": 1, "max": 1}
        spec["trainer"]["resources"] = {"gpu": 0, "cpu": "100m", "memory": "256Mi"}  # no GPU slot taken
        spec["trainer"]["env"] = [
            {"name": "ETJ_DATA", "value": "/nonexistent/chaos-bad-data"},
            *(e for e in spec["trainer"]["env"] if e["name"] not in ("ETJ_DATA", "ETJ_SAMPLE_LOG_DIR")),
        ]
        spec["checkpoint"]["path"] = str(demo.run_dir / "bad-checkpoints")
        demo.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(job))
        self.record["submitted_at"] = time.monotonic()
        demo.event(f"submitted {BAD_JOB} (data path /nonexistent/chaos-bad-data)")

    def watch(self, demo: Demo) -> None:
        t0 = self.record["submitted_at"]
        if t0 is None or (self.record["failed_after_s"] is not None and self.record["error"] is not None):
            return
        path = f"{GROUP_PATH}/namespaces/{demo.ns}/elastictrainingjobs/{BAD_JOB}"
        status = (demo.kube.get_or_none(path) or {}).get("status") or {}
        if self.record["error"] is None:
            token = progress_token(demo, BAD_JOB)
            for pod in pods_of(demo, BAD_JOB, "rendezvous"):
                ip = (pod.get("status") or {}).get("podIP")
                url = f"http://{ip}:{PROGRESS_PORT}/progress"
                doc = get_json(url, timeout=1.0, token=token) if ip and token else None
                if doc and doc.get("lastError"):
                    self.record["error"] = doc["lastError"]
                    self.record["error_after_s"] = round(time.monotonic() - t0, 1)
                    demo.event(f"{BAD_JOB} reports: {doc['lastError']}")
        if self.record["error"] is None:
            # The trainer refuses bad input before its agent starts (agent/preflight.py), often before the
            # store answers: then the refusal reaches the user as the failed pod's termination message,
            # which the WorkerFailed Warning quotes.
            events = demo.kube.get(
                f"/api/v1/namespaces/{demo.ns}/events",
                fieldSelector=f"involvedObject.name={BAD_JOB},reason=WorkerFailed",
            )
            quoted = [
                e.get("message") or ""
                for e in events.get("items") or []
                if "chaos-bad-data" in (e.get("message") or "")
            ]
            if quoted:
                self.record["error"] = quoted[0]
                self.record["error_after_s"] = round(time.monotonic() - t0, 1)
                demo.event(f"{BAD_JOB} WorkerFailed: {quoted[0]}")
        if self.record["failed_after_s"] is None and status.get("phase") == "Failed":
            self.record["failed_after_s"] = round(time.monotonic() - t0, 1)
            self.record["failures"] = status.get("failures")
            self.record["message"] = status.get("message")
            demo.event(f"{BAD_JOB} Failed after {self.record['failed_after_s']} s")


def progress_token(demo: Demo, job: str) -> str | None:
    """The job's progress token, from the Secret the operator made (the store refuses a GET without),
    found by the name the store pod's env gives (it is derived from the operator's key)."""
    name = next(filter(None, map(token_secret_of, pods_of(demo, job, "rendezvous"))), None)
    if name is None:
        return None
    secret = demo.kube.get_or_none(f"/api/v1/namespaces/{demo.ns}/secrets/{name}")
    raw = ((secret or {}).get("data") or {}).get(TOKEN_KEY)
    return base64.b64decode(raw).decode() if raw else None


def pods_of(demo: Demo, job: str, role: str) -> list[JSON]:
    sel = f"etj.dev/job={job},etj.dev/role={role}"
    items = demo.kube.get(f"/api/v1/namespaces/{demo.ns}/pods", labelSelector=sel).get("items") or []
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]

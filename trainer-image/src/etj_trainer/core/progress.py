"""Progress channel of docs/contract.md: rank 0 POSTs JSON to ``ETJ_PROGRESS_URL``.

Posting happens on a background thread with latest-value-wins semantics so a slow or absent progress
server never stalls a training step; ``report(force=True)`` (resizes) bypasses the ~1/s limit. The end is
different: ``finish`` POSTs the final report synchronously and retries until the store acknowledges it,
because the operator marks the job Succeeded from that report (etj_contract.progress says why nothing else
the operator must see can be lost: the store merges reports).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.request
from typing import Any

from etj_contract import env as etj_env
from etj_contract.progress import FINAL_REPORT_DEADLINE_S, MAX_ERROR_CHARS, auth_header

log = logging.getLogger(__name__)


def _headers(token: str | None) -> dict[str, str]:
    """The job's token (default ``$ETJ_PROGRESS_TOKEN``, which the operator sets from the job's Secret)."""
    return auth_header(etj_env.PROGRESS_TOKEN.read(os.environ) if token is None else token)


def post_json(url: str, payload: dict[str, Any], timeout: float = 2.0, token: str | None = None) -> None:
    headers = {"Content-Type": "application/json", **_headers(token)}
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        resp.read()


def get_json(url: str, timeout: float = 2.0, token: str | None = None) -> dict[str, Any] | None:
    try:
        req = urllib.request.Request(url, headers=_headers(token))
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read() or b"null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def report_error(line: str, url: str | None = None, token: str | None = None, *, crash: bool = False) -> bool:
    """Best effort: tell the operator why a training process died (``lastError`` in the progress doc).

    For the agent, when a worker process exits non-zero: the operator names this line when the step stops
    advancing (the job's Progressing condition). ``crash``: the agent restarts its workers after this
    crash, and the store counts it (the progress doc's ``crashes``: the operator's CrashLooping
    condition sees crashes the pod never shows). ``url`` defaults to ``$ETJ_PROGRESS_URL``; the token comes
    from the environment. Whether the store took it.
    """
    target = url or etj_env.PROGRESS_URL.read(os.environ)
    if not target or not line.strip():
        return False
    try:
        body: dict[str, object] = {"lastError": line.strip().splitlines()[-1][:MAX_ERROR_CHARS]}
        if crash:
            body["crash"] = True
        post_json(target, body, token=token)
    except OSError as e:
        log.debug("error report to %s failed: %s", target, e)
        return False
    return True


class ProgressReporter:
    def __init__(self, url: str, min_interval_s: float = 1.0) -> None:
        self.url = url
        self.min_interval_s = min_interval_s
        self._last_sent = 0.0
        self._pending: dict[str, Any] | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        if url:
            self._thread = threading.Thread(target=self._loop, name="etj-progress", daemon=True)
            self._thread.start()

    def report(self, payload: dict[str, Any], force: bool = False) -> None:
        if not self.url:
            return
        now = time.monotonic()
        if not force and now - self._last_sent < self.min_interval_s:
            return
        self._last_sent = now
        with self._cond:
            self._pending = dict(payload)
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                payload, self._pending = self._pending, None
                if payload is None:
                    return
            try:
                post_json(self.url, payload)
            except OSError as e:  # the channel is best effort; training must go on without it
                log.debug("progress POST to %s failed: %s", self.url, e)

    def finish(self, payload: dict[str, Any], deadline_s: float = FINAL_REPORT_DEADLINE_S) -> bool:
        """Flush what is pending, then POST the final report until the store acknowledges it.

        Returns whether it was acknowledged within ``deadline_s``. A store that is away for a moment (a
        dropped connection, a restart) costs a retry, not the job's accuracy in status.
        """
        self.close()
        if not self.url:
            return False
        deadline = time.monotonic() + deadline_s
        delay = 0.1
        while True:
            try:
                post_json(self.url, payload)
                return True
            except OSError as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("final progress report to %s not acknowledged: %s", self.url, e)
                    return False
                log.info("final progress report to %s failed (%s); retrying", self.url, e)
                time.sleep(min(delay, left))
                delay = min(delay * 2, 2.0)

    def close(self, timeout: float = 5.0) -> None:
        """Flush the last pending report and stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

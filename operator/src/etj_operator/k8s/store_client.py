"""HTTP to a job's store pod (docs/contract.md): read its progress document, tell it the replica bounds.

Not the Kubernetes API: the store is the trainer's, reached at its pod IP with the job's token. Kept
apart from client.py so the reconciler's Kubernetes writes and these reads are separate concerns, and
``StoreLink`` holds the little state one job's loop keeps about its store.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import aiohttp

from etj_contract.ports import PROGRESS_PORT
from etj_contract.progress import auth_header
from etj_contract.replicas import REPLICAS_PATH, Replicas
from etj_operator.constants import ROLE_RENDEZVOUS, ROLE_WORKER
from etj_operator.decide.objects.names import rendezvous_index
from etj_operator.observe.pods import PodInfo
from etj_operator.timeutil import utcnow

log = logging.getLogger(__name__)


class StoreClient:
    """One aiohttp session for every job's store (created on first use, closed with the operator)."""

    def __init__(self) -> None:
        self._http: aiohttp.ClientSession | None = None

    def _session(self, timeout: float) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout))
        return self._http

    async def fetch_progress(
        self, ip: str, port: int = PROGRESS_PORT, timeout: float = 2.0, token: str | None = None
    ) -> dict[str, Any] | None:
        """GET http://<store pod IP>:29401/progress with the job's token (docs/contract.md); None when
        unreachable or refused."""
        http = self._session(timeout)
        try:
            async with http.get(f"http://{ip}:{port}/progress", headers=auth_header(token)) as resp:
                if resp.status != 200:
                    if resp.status in (401, 403):
                        log.warning("the store at %s refused the job's token (%s)", ip, resp.status)
                    return None
                data = json.loads(await resp.text())
                return data if isinstance(data, dict) else None
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError):
            return None

    async def post_replicas(
        self,
        ip: str,
        bounds: Replicas,
        port: int = PROGRESS_PORT,
        timeout: float = 2.0,
        token: str | None = None,
    ) -> bool:
        """POST the job's replica bounds to its store (etj_contract.replicas); whether it took them."""
        http = self._session(timeout)
        try:
            async with http.post(
                f"http://{ip}:{port}{REPLICAS_PATH}", json=bounds.to_json(), headers=auth_header(token)
            ) as resp:
                return resp.status == 204
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


def running_store(pods: Iterable[PodInfo]) -> PodInfo | None:
    """The job's store pod that answers now (running, with an address), if any: the serving one while a
    replacement runs beside it (the lowest index, as decide/plan/store_move.py serves), whose progress is the
    job's; the replacement's is empty until the agents move to it."""
    running = [p for p in pods if p.role == ROLE_RENDEZVOUS and p.running and p.ip]
    return min(running, key=lambda p: rendezvous_index(p.job, p.name) or 0, default=None)


class StoreLink:
    """What one job's loop knows of its store: the progress last read, and the bounds it has taken."""

    def __init__(self, http: StoreClient, port: int, token: Callable[[], str]) -> None:
        self.http, self.port, self.token = http, port, token
        self.progress: dict[str, Any] | None = None
        self.progress_time: datetime | None = None
        # (store pod uid, bounds) the store has taken. The uid, not the name: a replacement store pod may
        # reuse a force-deleted one's name (decide/plan/slots.py next_rendezvous_index) and knows no bounds
        # yet.
        self.bounds_told: tuple[str, Replicas] | None = None

    async def refresh(self, pods: Iterable[PodInfo]) -> bool:
        """Read the store's progress document; whether it changed."""
        store = running_store(pods)
        if store is None or store.ip is None:
            return False
        data = await self.http.fetch_progress(store.ip, self.port, token=self.token())
        if data is None or data == self.progress:
            return False
        self.progress, self.progress_time = data, utcnow()
        return True

    def awaiting_final_report(self, pods: Iterable[PodInfo]) -> bool:
        """Workers exited 0 and the progress read says nothing of the end yet: the final report is in the
        store now, and must be read before the planner may stop the store."""
        finished = (self.progress or {}).get("finished")
        return not finished and any(p.role == ROLE_WORKER and p.exited_ok for p in pods)

    async def tell_bounds(self, bounds: Replicas, pods: Iterable[PodInfo]) -> None:
        """The job's replica bounds to its store, for the agents and rank 0 that started before a change
        (``kubectl scale``; etj_contract.replicas); once per store pod (by uid) and value."""
        store = running_store(pods)
        if store is None or store.ip is None:
            return
        if self.bounds_told == (store.uid, bounds):
            return
        if await self.http.post_replicas(store.ip, bounds, self.port, token=self.token()):
            self.bounds_told = (store.uid, bounds)

"""The operator's two views of the cluster's pods, kept up to date one watch event at a time.

``UsageLedger``: what the pods bound to each node request, summed (the planner's free capacity). Every pod
of the cluster can hold a node's GPUs, so every pod's events reach it; each event costs a comparison, and
only a pod that was bound, finished, deleted or resized changes a sum. The sums are kept, not recomputed
on read: a plan reads the usage of hundreds of nodes.

``JobPods``: etj's own pods by (namespace, job), the pods a job's plan reads.

Both are plain data with no I/O (k8s/pod_watch.py feeds them), so they are tested with tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from etj_operator.observe.pods import TERMINAL_PHASES, PodInfo, countable_requests

# uid → (node, requests): what one pod contributes to one node's usage.
Contribution = tuple[str, Mapping[str, int]]


def pod_contribution(body: Mapping[str, Any]) -> Contribution | None:
    """What a pod adds to its node's usage: nothing unless it is bound and not finished."""
    spec = body.get("spec") or {}
    node = spec.get("nodeName")
    if not node or (body.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return None  # unbound pods hold nothing; finished pods hold no devices
    requests = countable_requests(spec)
    return (node, requests) if requests else None


def pod_uid(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    # The uid, or namespace/name for bodies without one (hand-made test objects).
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


class _Sums(Mapping[str, Mapping[str, int]]):
    """Read-only view of the ledger's per-node sums (a plan must not change them)."""

    def __init__(self, sums: dict[str, dict[str, int]]) -> None:
        self._sums = sums

    def __getitem__(self, key: str) -> Mapping[str, int]:
        return self._sums[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sums)

    def __len__(self) -> int:
        return len(self._sums)


class UsageLedger:
    """Node → resources requested by the pods bound there, updated incrementally."""

    def __init__(self) -> None:
        self._pods: dict[str, Contribution] = {}
        self._sums: dict[str, dict[str, int]] = {}
        self.view: Mapping[str, Mapping[str, int]] = _Sums(self._sums)

    def apply(self, uid: str, contribution: Contribution | None) -> bool:
        """Set what pod ``uid`` contributes (None: nothing, e.g. deleted). True if a sum changed."""
        old = self._pods.get(uid)
        if old == contribution:
            return False  # the common case: a status update of a pod whose placement did not change
        if old is not None:
            self._add(old, -1)
            del self._pods[uid]
        if contribution is not None:
            self._pods[uid] = contribution
            self._add(contribution, 1)
        return True

    def replace_all(self, contributions: Mapping[str, Contribution]) -> None:
        """Start over from a fresh listing (after a watch could not resume)."""
        self._pods.clear()
        self._sums.clear()
        for uid, c in contributions.items():
            self.apply(uid, c)

    def _add(self, contribution: Contribution, sign: int) -> None:
        node, requests = contribution
        total = self._sums.setdefault(node, {})
        for res, n in requests.items():
            left = total.get(res, 0) + sign * n
            if left:
                total[res] = left
            else:
                total.pop(res, None)
        if not total:
            del self._sums[node]

    def __len__(self) -> int:
        return len(self._pods)


class JobPods:
    """etj's pods: (namespace, job) → pod name → PodInfo."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], dict[str, PodInfo]] = {}

    def put(self, namespace: str, job: str, info: PodInfo) -> None:
        self._jobs.setdefault((namespace, job), {})[info.name] = info

    def remove(self, namespace: str, job: str, name: str) -> None:
        pods = self._jobs.get((namespace, job))
        if pods is not None:
            pods.pop(name, None)
            if not pods:
                del self._jobs[(namespace, job)]

    def get(self, namespace: str, job: str) -> list[PodInfo]:
        return list(self._jobs.get((namespace, job), {}).values())

    def items(self) -> Iterable[tuple[tuple[str, str], Iterable[PodInfo]]]:
        return ((key, pods.values()) for key, pods in self._jobs.items())

    def keys(self) -> set[tuple[str, str]]:
        return set(self._jobs)

    def clear(self) -> None:
        self._jobs.clear()

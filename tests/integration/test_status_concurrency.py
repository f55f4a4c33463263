"""Status writes with optimistic concurrency, against the real apiserver (issue 26): a status computed from
an older version of the job is refused, so two writers (two operator replicas, or one racing a user's
edit) cannot lose or double-count the absolute counters the status holds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from etj_operator.k8s.client import KubeClient
from tests.integration.opbed import Bed
from tests.plugins.cluster import Cluster

pytestmark = pytest.mark.cluster


def test_a_status_from_a_stale_version_is_refused(bed: Bed, cluster: Cluster) -> None:
    bed.create_job("counted")
    job: Any = bed.job("counted")
    v0 = job["metadata"]["resourceVersion"]

    async def writes() -> tuple[Any, Any, Any]:
        kube = KubeClient(cluster.api_client())
        first = await kube.patch_status(bed.ns, "counted", {"failures": 1}, v0)
        stale = await kube.patch_status(bed.ns, "counted", {"failures": 1}, v0)  # same base: a double count
        v1 = (first or {}).get("metadata", {}).get("resourceVersion")
        fresh = await kube.patch_status(bed.ns, "counted", {"failures": 2}, v1)
        return first, stale, fresh

    first, stale, fresh = asyncio.run(writes())
    assert first is not None and first["status"]["failures"] == 1
    assert stale is None  # 409: the caller re-reads and plans again
    assert fresh is not None and fresh["status"]["failures"] == 2
    assert bed.status("counted")["failures"] == 2

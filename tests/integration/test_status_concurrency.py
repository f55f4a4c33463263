"""Status writes with optimistic concurrency, against the real apiserver (issue 26): a status computed from
an older version of the job is refused, so two writers (two operator replicas, or one racing a user's
edit) cannot lose or double-count the absolute counters the status holds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from etj_operator.k8s.client import KubeClient, StatusConflict
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
        with pytest.raises(StatusConflict):  # 409: the caller plans again on the job as it is now
            await kube.patch_status(bed.ns, "counted", {"failures": 1}, v0)  # same base: a double count
        now = await kube.get_job(bed.ns, "counted")
        v1 = (now or {}).get("metadata", {}).get("resourceVersion")
        fresh = await kube.patch_status(bed.ns, "counted", {"failures": 2}, v1)
        return first, now, fresh

    first, now, fresh = asyncio.run(writes())
    assert first is not None and first["status"]["failures"] == 1
    assert now is not None and now["status"]["failures"] == 1
    assert fresh is not None and fresh["status"]["failures"] == 2
    assert bed.status("counted")["failures"] == 2

"""Kueue on the local control plane (docs/kueue.md): the `kueue` fixture and a namespace it manages.

`kueue` runs Kueue's manager (built once by `make setup-test` / `etj kueue build` and cached under the bed's
cache dir) against the session's cluster for the tests of this package only. Its Job and Pod webhooks and its
job management are scoped to namespaces labelled `KUEUE_LABEL`, so the rest of the suite never goes through
Kueue; teardown deletes the Kueue objects while Kueue can still clear their finalizers, then unregisters
the webhooks and stops the process. Without a build the tests skip with the reason (ETJ_KUEUE=1 builds it
in the session instead); `ETJ_KUEUE=0` skips them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.plugins.cluster import Cluster

KUEUE_LABEL = "etj.dev/kueue=enabled"
# Cluster-scoped kinds first deleted by the tests' own cleanup; namespaced ones go with the namespace.
KUEUE_KINDS = [
    "workloads.kueue.x-k8s.io",
    "localqueues.kueue.x-k8s.io",
    "clusterqueues.kueue.x-k8s.io",
    "resourceflavors.kueue.x-k8s.io",
]


@dataclass
class Kueue:
    cluster: Cluster
    start_s: float  # process start to /readyz, as measured by LocalKueue.up


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from etj_testbed.localcluster import kueue_build

    mode = os.environ.get("ETJ_KUEUE", "")
    if mode == "0":
        marker = pytest.mark.skip(reason="ETJ_KUEUE=0")
    elif kueue_build.is_built():
        return
    elif mode == "1":  # build it here: a cold build is far longer than the suite's per-test timeout
        marker = pytest.mark.timeout(3 * 3600)
    else:
        marker = pytest.mark.skip(
            reason="Kueue is not built: `make setup-test` or `etj kueue build` builds it (cold: ~20 min on 2 "
            "cores, docs/kueue.md), or ETJ_KUEUE=1 builds it in the test session"
        )
    for item in items:
        if "kueue" in getattr(item, "fixturenames", ()):
            item.add_marker(marker)


@pytest.fixture(scope="package")
def kueue(cluster: Cluster) -> Iterator[Kueue]:
    from etj_testbed.localcluster.cluster import LocalCluster
    from etj_testbed.localcluster.kueue import LocalKueue

    local = LocalKueue(LocalCluster.named().layout, namespace_label=KUEUE_LABEL)
    timings = local.up()
    try:
        yield Kueue(cluster, timings.get("start", 0.0))
    finally:
        _delete_kueue_objects(cluster)
        local.down()
        _strip_finalizers(cluster)


@pytest.fixture
def kueue_namespace(kueue: Kueue, namespace: str) -> str:
    """The test's namespace, labelled so Kueue's webhooks and controllers manage its Jobs and Pods."""
    kueue.cluster.kubectl("label", "namespace", namespace, KUEUE_LABEL, "--overwrite")
    return namespace


def _delete_kueue_objects(cluster: Cluster, timeout: float = 30) -> None:
    for kind in KUEUE_KINDS:
        cluster.kubectl("delete", kind, "--all", "--all-namespaces", "--wait=false", check=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_names(cluster, kind) for kind in KUEUE_KINDS):
        time.sleep(0.5)


def _strip_finalizers(cluster: Cluster) -> None:
    # Whatever Kueue did not release in time would otherwise hang in Terminating without Kueue.
    for kind in KUEUE_KINDS:
        for ns, name in _names(cluster, kind):
            where = ["-n", ns] if ns else []
            cluster.kubectl(
                "patch",
                kind,
                name,
                *where,
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
                check=False,
            )


def _names(cluster: Cluster, kind: str) -> list[tuple[str, str]]:
    out = cluster.kubectl("get", kind, "--all-namespaces", "-o", "json", check=False)
    if out.returncode != 0:
        return []
    return [
        (item["metadata"].get("namespace", ""), item["metadata"]["name"])
        for item in json.loads(out.stdout).get("items", [])
    ]

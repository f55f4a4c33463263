"""The deadline policy asks Kueue (docs/kueue.md; issue 39 item 4), against a real Kueue v0.17.0 on the bed.

A deadline job falls behind (its progress reports are posted to its real store, as rank 0 posts them) and
wants an on-demand worker; the ClusterQueue has no on-demand quota left. The operator queues an on-demand
seat (a Workload pinned to the on-demand flavor) that Kueue leaves pending, and the job's status says so:
OnDemandQuota=False, reason QuotaExhausted, naming the LocalQueue and the ClusterQueue. Quota added to the
ClusterQueue admits the seat, a worker runs on the on-demand node, and the condition clears. Without the
feature the job never asks Kueue for on-demand (nothing pending, no condition: the wait for it fails).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.opbed import Bed, operator_and_a_store_node, progress_reporter
from tests.kueue.conftest import Kueue
from tests.kueue.test_kueue_install import cluster_queue_body, flavor_body
from tests.kueue.test_kueue_operator import GROUP, SEAT_LABEL, VERSION, KueueBed, kb_admitted

pytestmark = pytest.mark.cluster

TOTAL = 1_500_000
PER_WORKER = 250.0  # samples/s per worker, as if measured by the trainer
CONDITION = "OnDemandQuota"


def test_on_demand_without_quota_says_quota_exhausted_naming_the_queue_and_clears_when_quota_comes(
    kueue: Kueue, kueue_namespace: str, tmp_path: Path
) -> None:
    bed = Bed(kueue.cluster, kueue_namespace)
    kb = KueueBed(bed)
    spot, od = f"spot-{bed.ns}", f"od-{bed.ns}"
    cq = f"cq-{bed.ns}"
    try:
        with operator_and_a_store_node(bed, kueue.cluster, tmp_path, "--kueue") as op:
            try:
                _scenario(bed, kb, spot, od, cq)
            except AssertionError:
                print("status:", bed.status("dl"), "workloads:", kb.workloads())
                print(op.logs())
                raise
    finally:
        kb.cleanup()
        bed.cleanup()


def _scenario(bed: Bed, kb: KueueBed, spot: str, od: str, cq: str) -> None:
    for i in range(2):
        bed.node(f"spot-{i}", "spot")
    od_node = bed.node("od-gpu-0", "on-demand")  # the node is there: it is the quota that is not
    kb.cluster_object("resourceflavors", flavor_body(spot, "spot", bed.ns))
    kb.cluster_object("resourceflavors", flavor_body(od, "on-demand", bed.ns))
    kb.cluster_object("clusterqueues", cluster_queue_body(cq, bed.ns, {spot: 2, od: 0}))
    kb.local_queue()
    # 2,800 s from the start: 1,500,000 samples at 250/s per worker need 3,000 s on 2 workers.
    kb.etj("dl", min_workers=2, max_workers=3, deadline={"withinSeconds": 2800})
    bed.wait("the base's two workers running on spot", lambda: kb.at("dl", 2), 90)
    report = progress_reporter(bed, "dl", total=TOTAL, per_worker=PER_WORKER)
    asked = time.monotonic()
    report(0, 2)  # behind the line: 500/s is too slow, the policy wants one on-demand worker
    bed.wait(
        "OnDemandQuota=False, reason QuotaExhausted",
        lambda: bed.condition("dl", CONDITION).get("reason") == "QuotaExhausted",
        60,
    )
    said_s = time.monotonic() - asked
    message = bed.condition("dl", CONDITION)["message"]
    assert "LocalQueue lq" in message and f"ClusterQueue {cq}" in message, message
    assert "insufficient" in message, message  # Kueue's own words
    (seat,) = [w for w in kb.workloads() if _capacity(w) == "on-demand"]
    assert not kb_admitted(seat), seat
    selector = seat["spec"]["podSets"][0]["template"]["spec"]["nodeSelector"]
    assert selector.get("karpenter.sh/capacity-type") == "on-demand", selector
    assert not [w for w in kb.workloads() if _capacity(w) == "spot"]  # the pending spot seat gave way
    assert len(kb.workers("dl")) == 2  # no worker waits for a seat Kueue has not admitted
    assert any(e.reason == "QuotaExhausted" and e.type == "Warning" for e in bed.events("dl"))
    assert bed.status("dl")["schedule"]["onDemandWanted"] == 1

    added = time.monotonic()
    kb.custom.patch_cluster_custom_object(
        GROUP, VERSION, "clusterqueues", cq, cluster_queue_body(cq, bed.ns, {spot: 2, od: 1})
    )
    bed.wait(
        "the on-demand seat's worker running on the on-demand node",
        lambda: any(p.spec.node_name == od_node for p in kb.running("dl")),
        60,
    )
    bed.wait("OnDemandQuota=True", lambda: bed.condition("dl", CONDITION).get("status") == "True", 60)
    cleared_s = time.monotonic() - added
    (worker,) = [p for p in kb.running("dl") if p.spec.node_name == od_node]
    assert worker.metadata.labels[SEAT_LABEL] == seat["metadata"]["name"]
    assert (bed.status("dl").get("failures") or 0) == 0
    print(
        f"kueue deadline: QuotaExhausted {said_s:.1f} s after the report; "
        f"cleared {cleared_s:.1f} s after quota was added"
    )


def _capacity(workload: dict[str, Any]) -> str | None:
    labels: dict[str, str] = workload["metadata"].get("labels") or {}
    return labels.get("etj.dev/capacity")

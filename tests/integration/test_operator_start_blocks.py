"""A job says why it is not running (issue 37, item 4), on the real apiserver and kube-scheduler: a pod no
node can take carries the scheduler's words into the job's conditions, a Warning Event and `kubectl get
etj`, and failurePolicy.podStartDeadlineSeconds fails the job with them instead of Pending forever.

The bed's kubelet stand-ins cannot produce the kubelet's waiting reasons: kwok's pod stages make every pod
Running, and process nodes ignore the image and leave a missing Secret's variables unset. Image pulls and a
missing Secret are therefore tested on kind (tests/kind/test_failures.py, kind_full); the decision is the
same code (decide/failures/start_blocks.py), and its tables are tests/operator/test_start_blocks.py.
"""

from __future__ import annotations

import time

import pytest

from etj_operator.api.models import GROUP, PLURAL, VERSION
from tests.integration.opbed import Bed, OperatorProcess, job_manifest

pytestmark = pytest.mark.cluster

NOWHERE = {"etj.dev/no-such-pool": "none"}  # a nodeSelector no node has: the scheduler's Unschedulable


def _warnings(bed: Bed, job: str, reason: str) -> list[str]:
    return [e.message or "" for e in bed.events(job) if e.type == "Warning" and e.reason == reason]


def test_a_job_no_node_can_take_says_so_within_a_minute_and_fails_at_its_deadline(
    bed: Bed, operator: OperatorProcess
) -> None:
    bed.node("spot-0", "spot")
    manifest = job_manifest("nofit", bed.ns, max_workers=1, failurePolicy={"podStartDeadlineSeconds": 40})
    placement = manifest["spec"]["placement"]
    placement["nodeSelector"] = {**placement["nodeSelector"], **NOWHERE}
    placement["rendezvous"]["nodeSelector"] = {**placement["rendezvous"]["nodeSelector"], **NOWHERE}
    created = time.monotonic()
    bed.custom.create_namespaced_custom_object(GROUP, VERSION, bed.ns, PLURAL, manifest)
    try:
        bed.wait(
            "PodsBlocked=True/Unschedulable",
            lambda: bed.condition("nofit", "PodsBlocked").get("reason") == "Unschedulable",
            60,
        )
    except AssertionError:
        print(operator.logs())
        raise
    said = time.monotonic() - created
    blocked = bed.condition("nofit", "PodsBlocked")
    # The scheduler's own words, and the store first: without it no worker can ever train.
    assert blocked["status"] == "True" and "nodes are available" in blocked["message"], blocked
    assert blocked["message"].startswith("store pod nofit-rdzv"), blocked
    assert bed.condition("nofit", "Ready")["reason"] == "Unschedulable"
    bed.wait(
        "an Unschedulable Warning Event quoting the scheduler",
        lambda: any("nodes are available" in m for m in _warnings(bed, "nofit", "Unschedulable")),
    )
    table = bed.cluster.kubectl("get", "etj", "nofit", "-n", bed.ns).stdout
    assert "REASON" in table and "Unschedulable" in table, table
    # The deadline: Failed with the cause, not Pending forever; the pods go.
    bed.wait("the job Failed", lambda: bed.status("nofit").get("phase") == "Failed", 90)
    failed = bed.condition("nofit", "Failed")
    assert failed["status"] == "True" and failed["reason"] == "Unschedulable", failed
    assert "not started after" in failed["message"] and "podStartDeadlineSeconds 40" in failed["message"]
    assert "nodes are available" in failed["message"], failed
    bed.wait(
        "a JobFailed Warning naming it",
        lambda: any("Unschedulable" in m for m in _warnings(bed, "nofit", "JobFailed")),
    )
    bed.wait("its pods gone", lambda: not bed.pods("nofit") and not bed.pods("nofit", "rendezvous"), 60)
    print(f"PodsBlocked seen {said:.1f} s after the job was created")


def test_workers_running_beside_a_store_no_node_can_take_name_the_store(
    bed: Bed, operator: OperatorProcess
) -> None:
    bed.node("spot-0", "spot")
    manifest = job_manifest("nostore", bed.ns, max_workers=1)  # the default deadline: no failure here
    rendezvous = manifest["spec"]["placement"]["rendezvous"]
    rendezvous["nodeSelector"] = {**rendezvous["nodeSelector"], **NOWHERE}
    bed.custom.create_namespaced_custom_object(GROUP, VERSION, bed.ns, PLURAL, manifest)
    bed.wait(
        "the worker running and the job blocked on its store",
        lambda: (
            bed.status("nostore").get("workers") == "1/1"
            and bed.condition("nostore", "Ready").get("reason") == "Unschedulable"
        ),
        60,
    )
    message = bed.condition("nostore", "PodsBlocked")["message"]
    assert message.startswith("store pod nostore-rdzv") and "nodes are available" in message, message
    assert bed.status("nostore")["phase"] != "Failed"

"""Failures the operator must make visible, on the real apiserver (issue 15): a pod create the apiserver
refuses (here a ResourceQuota) becomes a condition and a Warning Event, and status keeps being written."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from etj_contract.ports import PROGRESS_PORT
from etj_operator.api.models import GROUP, PLURAL, VERSION
from etj_operator.decide.failures.crash_loop import CRASH_COLLAPSE_S
from etj_trainer.core.progress import get_json, post_json, report_error
from tests.integration.opbed import (
    Bed,
    OperatorProcess,
    job_manifest,
    operator_and_a_store_node,
    running_store_ip,
)
from tests.plugins.cluster import Cluster

pytestmark = pytest.mark.cluster


def _quota(bed: Bed, gpus: int) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}},
    }
    try:
        bed.core.create_namespaced_resource_quota(bed.ns, body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        bed.core.patch_namespaced_resource_quota("gpus", bed.ns, {"spec": body["spec"]})

    def counted() -> bool:
        # The quota admission refuses every pod until the quota controller has filled in status.
        st: Any = bed.core.read_namespaced_resource_quota("gpus", bed.ns).status
        return bool(st and st.hard and st.hard.get("requests.nvidia.com/gpu") == str(gpus))

    bed.wait("the quota to be counted", counted)


def test_a_quota_refusal_is_a_condition_and_an_event_and_status_is_still_written(
    bed: Bed, operator: OperatorProcess
) -> None:
    for i in range(3):
        bed.node(f"spot-{i}", "spot")
    bed.node("od-0", "on-demand", gpus=0)
    _quota(bed, gpus=1)
    bed.create_job("quota", max_workers=3)
    try:
        bed.wait(
            "ReplicaFailure=True/FailedCreate",
            lambda: bed.condition("quota", "ReplicaFailure").get("status") == "True",
            90,
        )
    except AssertionError:
        print(operator.logs())
        raise
    cond = bed.condition("quota", "ReplicaFailure")
    assert cond["reason"] == "FailedCreate" and "exceeded quota" in cond["message"], cond
    # The refusal does not stop the rest of the status: one worker fits the quota and is counted.
    bed.wait("one worker running", lambda: bed.status("quota").get("workers") == "1/3", 60)
    assert bed.condition("quota", "Ready")["status"] == "True"
    bed.wait(
        "a FailedCreate Warning Event naming the quota",
        lambda: any(
            e.type == "Warning" and e.reason == "FailedCreate" and "exceeded quota" in (e.message or "")
            for e in bed.events("quota")
        ),
    )
    # Room in the quota: the missing workers are created and the condition clears.
    _quota(bed, gpus=3)
    bed.wait("3 workers", lambda: bed.status("quota").get("workers") == "3/3", 90)
    bed.wait(
        "ReplicaFailure=False",
        lambda: bed.condition("quota", "ReplicaFailure").get("status") == "False",
        60,
    )


def test_the_store_is_protected_from_evictions_and_moves_off_a_cordoned_node(
    bed: Bed, operator: OperatorProcess
) -> None:
    # One on-demand node holds the store and the worker: the worker's drain on the cordon below proves the
    # operator acted on the cordon, and the store must outlive that round.
    od = bed.node("od-0", "on-demand", gpus=1)
    scheduling = client.SchedulingV1Api(bed.cluster.api_client())
    priority = f"{bed.ns}-store"[:63]
    scheduling.create_priority_class({"metadata": {"name": priority}, "value": 1000})
    try:
        manifest = job_manifest("kept", bed.ns, max_workers=1)
        manifest["spec"]["placement"]["capacityTypes"] = ["on-demand"]
        manifest["spec"]["placement"]["rendezvous"]["priorityClassName"] = priority
        bed.custom.create_namespaced_custom_object(GROUP, VERSION, bed.ns, PLURAL, manifest)
        bed.wait(
            "store and worker running",
            lambda: (
                bed.status("kept").get("workers") == "1/1"
                and any(p.status.phase == "Running" for p in bed.pods("kept", "rendezvous"))
            ),
            90,
        )
        store: Any = bed.pods("kept", "rendezvous")[0]
        # No do-not-disrupt (issue 26): it blocked Karpenter's drift and expiry of the node for good.
        assert "karpenter.sh/do-not-disrupt" not in (store.metadata.annotations or {})
        assert store.status.qos_class == "Guaranteed"
        assert store.spec.priority_class_name == priority and store.spec.priority == 1000
        policy = client.PolicyV1Api(bed.cluster.api_client())
        pdb: Any = policy.read_namespaced_pod_disruption_budget("kept-rdzv", bed.ns)
        assert pdb.spec.max_unavailable == 0
        bed.wait(
            "the disruption controller to count the store",
            lambda: (
                cast(
                    Any, policy.read_namespaced_pod_disruption_budget("kept-rdzv", bed.ns)
                ).status.expected_pods
                == 1
            ),
        )
        # `kubectl drain`, Karpenter and the cluster autoscaler evict: refused for the store.
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": store.metadata.name}}
        with pytest.raises(client.ApiException) as refused:
            bed.core.create_namespaced_pod_eviction(store.metadata.name, bed.ns, eviction)
        assert refused.value.status == 429 and "disruption budget" in str(refused.value.body)
        # A cordon (the first step of a drain or a node group upgrade) drains the worker and moves the
        # store, make before break (issue 26): its replacement is created first and the old store goes only
        # once the replacement runs, here on a second on-demand node that comes after the cordon.
        bed.core.patch_node(od, {"spec": {"unschedulable": True}})
        bed.wait(
            "the worker drained for the cordon",
            lambda: any(e.reason == "NodeCordoned" for e in bed.events("kept")),
            60,
        )

        def live() -> list[Any]:
            return [p for p in cast(Any, bed.pods("kept", "rendezvous")) if not p.metadata.deletion_timestamp]

        bed.wait("a replacement store created", lambda: len(live()) == 2, 60)
        assert any(p.metadata.uid == store.metadata.uid for p in live())  # kept until the replacement runs
        bed.node("od-1", "on-demand", gpus=1)

        def moved() -> bool:
            return bool(live()) and all(p.metadata.uid != store.metadata.uid for p in live())

        bed.wait("the store moved off the cordoned node", moved, 90)
    finally:
        scheduling.delete_priority_class(priority)


def test_a_step_that_stands_still_turns_progressing_false_naming_the_trainers_last_error(
    bed: Bed, cluster: Cluster, tmp_path: Path
) -> None:
    """The store runs for real (a process node), the worker is a kwok pod that never trains: a crash loop
    inside a Running pod, as the operator sees it. Today's code said Ready and nothing else."""
    with operator_and_a_store_node(bed, cluster, tmp_path):
        bed.node("spot-0", "spot")
        manifest = job_manifest("stuck", bed.ns, max_workers=1)
        # Long enough for the report below to reach the store before the deadline on a loaded machine: the
        # Warning is posted when Progressing turns False and quotes the error known then (with 20 s, under
        # load the store's first answer came after the deadline, and neither quoted it).
        manifest["spec"]["failurePolicy"] = {"progressDeadlineSeconds": 40}
        bed.custom.create_namespaced_custom_object(GROUP, VERSION, bed.ns, PLURAL, manifest)

        # The agent's report of the crash (etj_trainer.core.progress.report_error), with the job's token,
        # as soon as the store answers (the deadline's clock runs from the job's Ready).
        bed.wait("the store process running", lambda: running_store_ip(bed, "stuck") is not None, 180)
        token = bed.token("stuck")
        url = f"http://{running_store_ip(bed, 'stuck')}:{PROGRESS_PORT}/progress"
        bed.wait("the store to answer", lambda: get_json(url, token=token) is not None, 60)
        assert report_error("Traceback ...\nFileNotFoundError: /data/train", url=url, token=token)
        bed.wait(
            "Progressing=True", lambda: bed.condition("stuck", "Progressing").get("status") == "True", 60
        )
        bed.wait(
            "Progressing=False/ProgressDeadlineExceeded",
            lambda: bed.condition("stuck", "Progressing").get("status") == "False",
            120,
        )
        cond = bed.condition("stuck", "Progressing")
        assert cond["reason"] == "ProgressDeadlineExceeded", cond
        assert "no step reported" in cond["message"] and "FileNotFoundError: /data/train" in cond["message"]
        assert bed.condition("stuck", "Ready")["status"] == "True"  # why Progressing is needed at all
        bed.wait(
            "a ProgressDeadlineExceeded Warning naming the error",
            lambda: any(
                e.type == "Warning"
                and e.reason == "ProgressDeadlineExceeded"
                and "FileNotFoundError" in (e.message or "")
                for e in bed.events("stuck")
            ),
        )


def _crash(bed: Bed, pod: Any) -> None:
    """What the kubelet writes when the trainer exits 1: kwok pods run nothing, so the test writes it."""
    container = pod.spec.containers[0]
    terminated = {"exitCode": 1, "reason": "Error", "message": "RuntimeError: CUDA error: uncorrectable ECC"}
    body = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": container.name,
                    "image": container.image,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {**terminated, "startedAt": None, "finishedAt": None}},
                }
            ],
        }
    }
    bed.core.patch_namespaced_pod_status(pod.metadata.name, bed.ns, body)


def test_a_worker_that_crashed_on_a_node_is_replaced_on_another_one(
    bed: Bed, operator: OperatorProcess
) -> None:
    """Issue 26: the replacement of a worker that crashed on node X requires not-X, runs elsewhere, and a
    Warning Event and status.avoidedNodes name X."""
    spot = [bed.node(f"spot-{i}", "spot") for i in range(2)]
    bed.node("od-0", "on-demand", gpus=0)
    bed.create_job("crashy", max_workers=1)
    bed.wait("one worker running", lambda: len(bed.running_workers("crashy")) == 1, 90)
    (first,) = bed.running_workers("crashy")
    bad = first.spec.node_name
    assert bad in spot
    _crash(bed, first)

    def replacement() -> Any:
        return next((p for p in bed.running_workers("crashy") if p.metadata.uid != first.metadata.uid), None)

    try:
        bed.wait("the replacement running", lambda: replacement() is not None, 90)
    except AssertionError:
        print(operator.logs())
        raise
    new: Any = replacement()
    assert new.spec.node_name != bad and new.spec.node_name in spot
    required = new.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    terms = required.node_selector_terms
    assert terms and all(
        any(
            e.key == "kubernetes.io/hostname" and e.operator == "NotIn" and bad in e.values
            for e in t.match_expressions
        )
        for t in terms
    ), terms
    bed.wait(
        "an AvoidingNode Warning naming the node",
        lambda: any(
            e.type == "Warning" and e.reason == "AvoidingNode" and bad in (e.message or "")
            for e in bed.events("crashy")
        ),
    )
    status = bed.status("crashy")
    assert [a["node"] for a in status["avoidedNodes"]] == [bad], status
    assert status["failures"] == 1 and len(status["failureTimes"]) == 1, status


def _store_url_and_token(bed: Bed, job: str) -> tuple[str, str]:
    """The job's progress endpoint on its (real) store, and the job's token, once the store answers."""
    bed.wait("the store process running", lambda: running_store_ip(bed, job) is not None, 180)
    token = bed.token(job)
    url = f"http://{running_store_ip(bed, job)}:{PROGRESS_PORT}/progress"
    bed.wait("the store to answer", lambda: get_json(url, token=token) is not None, 60)
    return url, token


def _report_steps(url: str, token: str, first: int, count: int) -> int:
    """Rank 0's reports of ``count`` steps, one about every 0.3 s (as the trainer reports them)."""
    step = first
    for step in range(first, first + count):
        post_json(url, {"step": step, "resizes": [], "finished": False}, token=token)
        time.sleep(0.3)  # the trainer's pace, not a wait for the operator
    return step


def test_crashes_with_progress_between_them_raise_crash_looping_within_two_minutes(
    bed: Bed, cluster: Cluster, tmp_path: Path
) -> None:
    """Issue 26: each agent restart after some progress started the agent's crash budget again, so the pod
    never failed, Progressing stayed True and nothing was posted. The store is real (a process node); the
    test speaks for the worker's agent and rank 0 over the same HTTP the trainer uses."""
    with operator_and_a_store_node(bed, cluster, tmp_path) as operator:
        bed.node("spot-0", "spot")
        bed.custom.create_namespaced_custom_object(
            GROUP, VERSION, bed.ns, PLURAL, job_manifest("loopy", bed.ns, max_workers=1)
        )
        url, token = _store_url_and_token(bed, "loopy")
        step, first_crash, crashed = 0, 0.0, 0.0
        for i in range(3):
            # Training between the crashes: a restart cycle of a few steps, longer than CRASH_COLLAPSE_S
            # (crashes closer than that are one fault that took its peers down with it).
            step = _report_steps(url, token, step + 1, 5)
            while time.monotonic() - crashed < CRASH_COLLAPSE_S + 1:
                step = _report_steps(url, token, step + 1, 3)
            # The agent restarting its crashed workers (elastic_agent.count_crash -> report_error(crash=True))
            assert report_error("RuntimeError: CUDA error: an illegal memory access", url, token, crash=True)
            crashed = time.monotonic()
            first_crash = first_crash or crashed
            if i < 2:
                bed.wait(
                    f"crash {i + 1} counted",
                    lambda n=i + 1: len(bed.status("loopy").get("crashTimes", [])) == n,  # type: ignore[misc]
                    30,
                )
        try:
            bed.wait(
                "CrashLooping=True",
                lambda: bed.condition("loopy", "CrashLooping").get("status") == "True",
                120 - (time.monotonic() - first_crash),
            )
        except AssertionError:
            print(operator.logs(), bed.status("loopy"))
            raise
        took = time.monotonic() - first_crash
        cond = bed.condition("loopy", "CrashLooping")
        assert cond["reason"] == "RepeatedCrashes", cond
        assert "3 crashes in the last 600 s" in cond["message"] and "illegal memory access" in cond["message"]
        assert bed.condition("loopy", "Progressing")["status"] == "True"  # it did make progress
        bed.wait(
            "a CrashLooping Warning Event",
            lambda: any(
                e.type == "Warning" and e.reason == "CrashLooping" and "3 crashes" in (e.message or "")
                for e in bed.events("loopy")
            ),
        )
        print(f"CrashLooping {took:.1f} s after the first crash")


def test_a_stall_is_judged_by_the_jobs_own_step_time_not_the_600_s_deadline(
    bed: Bed, cluster: Cluster, tmp_path: Path
) -> None:
    """Issue 26: the default progressDeadlineSeconds (600) stays; the job steps about every 0.3 s, so it is
    stalled after the floor (stallFloorSeconds, 20 here), and the planner's own timer notices it: the
    resync is 300 s and nothing else wakes the job once the reports stop."""
    with operator_and_a_store_node(bed, cluster, tmp_path, "--resync-seconds=300") as operator:
        bed.node("spot-0", "spot")
        manifest = job_manifest("hangs", bed.ns, max_workers=1)
        manifest["spec"]["failurePolicy"] = {"stallFloorSeconds": 20}
        bed.custom.create_namespaced_custom_object(GROUP, VERSION, bed.ns, PLURAL, manifest)
        url, token = _store_url_and_token(bed, "hangs")
        step = 1
        while (bed.status("hangs").get("progress") or {}).get("stepSeconds") is None:
            step = _report_steps(url, token, step + 1, 5)  # until the operator has measured a step time
        step = _report_steps(url, token, step + 1, 5)
        last_step = time.monotonic()
        try:
            bed.wait(
                "Progressing=False/ProgressStalled",
                lambda: bed.condition("hangs", "Progressing").get("status") == "False",
                90,
            )
        except AssertionError:
            print(operator.logs(), bed.status("hangs"))
            raise
        took = time.monotonic() - last_step
        cond = bed.condition("hangs", "Progressing")
        assert cond["reason"] == "ProgressStalled" and f"step {step}" in cond["message"], cond
        assert 20 <= took < 40, took  # the floor, plus one progress read and the timer's second
        bed.wait(
            "a ProgressStalled Warning",
            lambda: any(e.type == "Warning" and e.reason == "ProgressStalled" for e in bed.events("hangs")),
        )
        print(f"ProgressStalled {took:.1f} s after the last step")

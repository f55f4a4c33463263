"""Operator settings the chart passes, against the real control plane and kwok nodes: the default trainer
image (chart value trainer.image → ETJ_DEFAULT_TRAINER_IMAGE) and namespaced mode's GPU accounting."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from etj_operator.decide.status.conditions import PARTIAL_USAGE_NOTE, ConditionReason
from tests.integration.opbed import TEST_LABEL, Bed, OperatorProcess, job_manifest
from tests.plugins.cluster import Cluster

NO_IMAGE = ConditionReason.NO_TRAINER_IMAGE

pytestmark = pytest.mark.cluster

DEFAULT_IMAGE = "registry.example.com/etj-trainer:default"
GPU = "nvidia.com/gpu"


@pytest.fixture
def bed(cluster: Cluster, namespace: str) -> Iterator[Bed]:
    b = Bed(cluster, namespace)
    yield b
    b.cleanup()


def _operator(
    cluster: Cluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str
) -> OperatorProcess:
    # Only what the test passes: never a default inherited from the developer's environment.
    monkeypatch.delenv("ETJ_DEFAULT_TRAINER_IMAGE", raising=False)
    return OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log", *extra).start()


def _create_without_image(bed: Bed, name: str, **kw: Any) -> None:
    manifest = job_manifest(name, bed.ns, **kw)
    del manifest["spec"]["trainer"]["image"]
    # The real apiserver accepts it (the CRD no longer requires an image).
    bed.custom.create_namespaced_custom_object("etj.dev", "v1alpha1", bed.ns, "elastictrainingjobs", manifest)


def _condition(bed: Bed, job: str, type_: str) -> dict[str, Any] | None:
    return next((c for c in bed.status(job).get("conditions") or [] if c["type"] == type_), None)


def test_a_job_without_image_runs_the_operators_default_image(
    bed: Bed, cluster: Cluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = _operator(cluster, namespace, tmp_path, monkeypatch, "--default-trainer-image", DEFAULT_IMAGE)
    try:
        bed.node("spot-0", "spot")
        bed.node("od-0", "on-demand", gpus=0)
        _create_without_image(bed, "dflt", max_workers=1)
        bed.wait(
            "a worker pod and a store pod", lambda: bool(bed.pods("dflt") and bed.pods("dflt", "rendezvous"))
        )
        for pod in bed.pods("dflt") + bed.pods("dflt", "rendezvous"):
            assert pod.spec.containers[0].image == DEFAULT_IMAGE
        bed.wait("status.trainerImage", lambda: bed.status("dflt").get("trainerImage") == DEFAULT_IMAGE)
        assert "image" not in (bed.job("dflt") or {})["spec"]["trainer"]  # the spec is the user's, untouched
    finally:
        op.stop()
        print(op.logs())


def test_a_job_without_any_image_waits_and_says_why(
    bed: Bed, cluster: Cluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = _operator(cluster, namespace, tmp_path, monkeypatch)
    try:
        bed.node("spot-0", "spot")
        bed.node("od-0", "on-demand", gpus=0)
        _create_without_image(bed, "noimg", max_workers=1)
        bed.wait(
            "Ready=False NoTrainerImage",
            lambda: (_condition(bed, "noimg", "Ready") or {}).get("reason") == NO_IMAGE,
        )
        bed.wait(
            "a Warning event",
            lambda: any(e.reason == NO_IMAGE and e.type == "Warning" for e in bed.events("noimg")),
        )
        assert bed.pods("noimg") == [] and bed.pods("noimg", "rendezvous") == []
        assert bed.status("noimg")["phase"] == "Pending"
        # Setting the image starts it.
        bed.custom.patch_namespaced_custom_object(
            "etj.dev",
            "v1alpha1",
            namespace,
            "elastictrainingjobs",
            "noimg",
            {"spec": {"trainer": {"image": "registry.example.com/etj-trainer:set"}}},
        )
        bed.wait("a worker once the image is set", lambda: bool(bed.pods("noimg")))
    finally:
        op.stop()
        print(op.logs())


def _blocker(core: client.CoreV1Api, namespace: str, name: str, node: str, owner_ns: str) -> None:
    """A plain pod bound to `node` holding its one GPU (kwok reports it Running)."""
    core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "automountServiceAccountToken": False,
                "tolerations": [{"key": TEST_LABEL, "operator": "Equal", "value": owner_ns}],
                "containers": [
                    {"name": "c", "image": "x", "resources": {"requests": {GPU: "1"}, "limits": {GPU: "1"}}}
                ],
            },
        },
    )


def test_namespaced_mode_does_not_see_gpus_used_in_other_namespaces(
    bed: Bed, cluster: Cluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented limitation, observed: the same GPU held by a pod in the watched namespace counts as
    used; held by a pod in another namespace it looks free (and the status says the count is partial)."""
    other = f"t-unwatched-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", other)
    op = _operator(cluster, namespace, tmp_path, monkeypatch)
    try:
        cluster.wait_for(
            f"default ServiceAccount in {other}",
            lambda: cluster.kubectl("get", "sa", "default", "-n", other, check=False).returncode == 0,
        )
        spot = bed.node("spot-0", "spot")
        bed.node("od-0", "on-demand", gpus=0)

        def capacity(job: str) -> tuple[str, str] | None:
            cond = _condition(bed, job, "CapacityAvailable")
            return None if cond is None else (cond["status"], cond["message"])

        def running(ns: str, name: str) -> bool:
            pod: Any = bed.core.read_namespaced_pod(name, ns)
            return bool(pod.status.phase == "Running")

        def unschedulable(job: str) -> bool:
            pods = bed.pods(job)
            return bool(pods) and all(
                any(c.type == "PodScheduled" and c.status == "False" for c in p.status.conditions or [])
                for p in pods
            )

        # 1. The GPU is held in the watched namespace: the operator sees it used.
        _blocker(bed.core, namespace, "holder", spot, namespace)
        bed.wait("holder running", lambda: running(namespace, "holder"))
        bed.create_job("seen", min_workers=1, max_workers=1)
        bed.wait("the scheduler refusing the worker", lambda: unschedulable("seen"), 60)
        # Indices and status converge by watch and resync: wait for the verdict, then read it.
        bed.wait("CapacityAvailable=False", lambda: (capacity("seen") or ("",))[0] == "False", 60)
        _, message = capacity("seen") or ("", "")
        assert message.startswith("room for 0 of 1..1"), message
        assert PARTIAL_USAGE_NOTE in message
        cluster.kubectl("delete", "etj", "seen", "-n", namespace, "--wait=true", timeout=60)
        bed.wait("seen's pods gone", lambda: not bed.pods("seen"), 60)
        bed.core.delete_namespaced_pod("holder", namespace, grace_period_seconds=0)

        # 2. The same GPU held in an unwatched namespace: it looks free, though nothing can schedule.
        _blocker(bed.core, other, "holder", spot, namespace)
        bed.wait("holder running elsewhere", lambda: running(other, "holder"))
        bed.wait("the first holder gone", lambda: not bed.core.list_namespaced_pod(namespace).items, 60)
        bed.create_job("unseen", min_workers=1, max_workers=1)
        bed.wait("the scheduler refusing the worker", lambda: unschedulable("unseen"), 60)
        bed.wait("CapacityAvailable=True", lambda: (capacity("unseen") or ("",))[0] == "True", 60)
        _, message = capacity("unseen") or ("", "")
        assert message.startswith("room for 1 of 1..1"), message  # the over-count
        assert PARTIAL_USAGE_NOTE in message  # and the status says why the number may be wrong
    finally:
        op.stop()
        print(op.logs())
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)

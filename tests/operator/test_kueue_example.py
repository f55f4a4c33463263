"""examples/kueue (issue 39 item 5) read with the operator's own code: each ResourceFlavor places a worker
on the capacity type its name says, the ClusterQueue covers every resource the example job's workers
request in every flavor (else Kueue never admits it), and the queue, namespace and priority-class names
wire up. That Kueue's own schemas accept the objects is tests/kueue/test_kueue_example.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from etj_operator.api.models import CapacityType, ElasticTrainingJob
from etj_operator.decide.kueue.admission import placement
from etj_operator.decide.objects.manifests import worker_resources
from etj_operator.observe.nodes import DEFAULT_RULES, SPOT_TAINT_TOLERATIONS
from etj_operator.observe.workloads import WorkloadInfo, flavor_info

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kueue"
QUEUES: list[dict[str, Any]] = list(yaml.safe_load_all((EXAMPLE / "queues.yaml").read_text()))
JOB = ElasticTrainingJob.model_validate(yaml.safe_load((EXAMPLE / "job.yaml").read_text()))


def _of(kind: str) -> list[dict[str, Any]]:
    return [d for d in QUEUES if d["kind"] == kind]


def test_each_flavor_places_a_worker_on_the_capacity_type_it_is_named_for() -> None:
    flavors = {f.name: f for f in map(flavor_info, _of("ResourceFlavor"))}
    assert set(flavors) == {"spot", "on-demand"}
    for name in flavors:
        seat = placement(WorkloadInfo(name="w", flavors=(name,), admitted=True), flavors)
        assert DEFAULT_RULES.capacity_type(seat.node_selector) == CapacityType(name), seat
    # A worker admitted on spot tolerates the spot node pools' taint, as etj's own spot workers do.
    spot = placement(WorkloadInfo(name="w", flavors=("spot",), admitted=True), flavors)
    assert any(t in SPOT_TAINT_TOLERATIONS for t in spot.tolerations), spot.tolerations
    # The job allows both, so either flavor's workers are its own.
    assert set(JOB.spec.placement.capacity_types) == {CapacityType.SPOT, CapacityType.ON_DEMAND}


def test_the_cluster_queue_covers_every_resource_a_worker_requests_in_every_flavor() -> None:
    (cq,) = _of("ClusterQueue")
    requested = set(worker_resources(JOB.spec)["requests"])
    assert requested == {"nvidia.com/gpu", "cpu", "memory"}
    for group in cq["spec"]["resourceGroups"]:
        assert requested <= set(group["coveredResources"]), group
        for flavor in group["flavors"]:
            assert requested <= {r["name"] for r in flavor["resources"]}, flavor
    # Spot first: Kueue tries a group's flavors in order.
    assert [f["name"] for f in cq["spec"]["resourceGroups"][0]["flavors"]] == ["spot", "on-demand"]
    # Room for the job's base at least (replicas.min workers of 8 GPUs).
    spot_gpus = cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert spot_gpus["name"] == "nvidia.com/gpu"
    assert spot_gpus["nominalQuota"] >= JOB.spec.replicas.min * JOB.spec.trainer.resources.gpu


def test_the_job_its_local_queue_its_cluster_queue_and_its_priority_class_wire_up() -> None:
    (cq,) = _of("ClusterQueue")
    (lq,) = _of("LocalQueue")
    (priority,) = _of("WorkloadPriorityClass")
    labels = JOB.metadata.labels if JOB.metadata and JOB.metadata.labels else {}
    namespace = lq["metadata"]["namespace"]  # the job goes there (`kubectl apply -n`, the example says)
    assert labels["kueue.x-k8s.io/queue-name"] == lq["metadata"]["name"]
    assert lq["spec"]["clusterQueue"] == cq["metadata"]["name"]
    assert cq["spec"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == namespace
    assert f"kubectl apply -n {namespace}" in (EXAMPLE / "job.yaml").read_text()
    assert labels["kueue.x-k8s.io/priority-class"] == priority["metadata"]["name"]

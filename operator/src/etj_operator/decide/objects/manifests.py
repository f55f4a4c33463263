"""Builders for the objects the operator creates: worker pods, the rendezvous pod and its Service.

Pure functions returning plain dicts (what the API accepts), so unit tests can check the pod contract
(docs/contract.md) and Pod Security "restricted" without a cluster. Names come from names.py, placement
from placement.py, the env from pod_env.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from etj_contract import env as etj_env
from etj_contract.ports import PROGRESS_PORT, RDZV_PORT, STORE_READY_PATH, STORE_READY_TIMEOUT_S
from etj_operator.api.models import CapacityType, ElasticTrainingJobSpec
from etj_operator.api.pod import Placement
from etj_operator.constants import (
    ANNOTATION_AVOIDED_NODES,
    LABEL_CAPACITY,
    LABEL_JOB,
    LABEL_KUEUE_SEAT,
    LABEL_ROLE,
    LABEL_SLOT,
    LABEL_STORE,
    ROLE_RENDEZVOUS,
    ROLE_WORKER,
)
from etj_operator.decide.objects.names import (
    labels,
    owned_metadata,
    owner_reference,
    rendezvous_name,
    rendezvous_pod_name,
    worker_name,
)
from etj_operator.decide.objects.placement import SeatPlacement, capacity_affinity, capacity_tolerations
from etj_operator.decide.objects.pod_env import DEFAULT_WORKER_GRACE_SECONDS, token_env, worker_env

RENDEZVOUS_GRACE_SECONDS = 10
# The store pod's requests and limits (equal: Guaranteed QoS). The TCPStore and the progress document
# are small; the cpu is for bursts of keep-alives from large jobs.
STORE_RESOURCES = {"cpu": "500m", "memory": "512Mi"}
# No `karpenter.sh/do-not-disrupt` (issue 26): it made Karpenter skip drift and expiry of the store's node
# for good. The store's PodDisruptionBudget already keeps consolidation away (Karpenter does not pick nodes
# whose pods it cannot evict) and makes a drift or expiry wait until the operator, seeing the
# `karpenter.sh/disrupted` taint, has moved the store.
STORE_ANNOTATIONS: dict[str, str] = {}
NONROOT_UID = 1000


def _restricted_container() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }


def _restricted_pod() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": NONROOT_UID,
        "runAsGroup": NONROOT_UID,
        "fsGroup": NONROOT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def worker_resources(spec: ElasticTrainingJobSpec) -> dict[str, Any]:
    res = spec.trainer.resources
    amounts: dict[str, Any] = {}
    if res.gpu:
        amounts[res.gpu_resource_name] = str(res.gpu)
    if res.cpu is not None:
        amounts["cpu"] = str(res.cpu)
    if res.memory is not None:
        amounts["memory"] = str(res.memory)
    # requests == limits: Guaranteed QoS, so training is the last thing evicted under node pressure.
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def _needs_scratch_checkpoint_dir(spec: ElasticTrainingJobSpec, mounts: list[dict[str, Any]]) -> bool:
    if spec.checkpoint.pvc is not None or spec.checkpoint.uri is not None:
        return False
    path = spec.checkpoint.path.rstrip("/") or "/"
    return not any(
        path == m["mountPath"].rstrip("/") or path.startswith(m["mountPath"].rstrip("/") + "/")
        for m in mounts
    )


def _image(spec: ElasticTrainingJobSpec, image: str | None) -> str:
    """The resolved image (``decide.plan.model.trainer_image``) or the spec's; a pod without one is a bug."""
    resolved = image or spec.trainer.image
    if not resolved:
        raise ValueError("no trainer image: spec.trainer.image is unset and no default was resolved")
    return resolved


def _pod(
    name: str,
    namespace: str,
    pod_labels: dict[str, str],
    owner: dict[str, Any],
    spec: dict[str, Any],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": pod_labels,
        "ownerReferences": [owner],
    }
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _worker_storage(spec: ElasticTrainingJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The worker's volumes and their mounts: /tmp, /dev/shm, checkpoints, then the user's."""
    shm: dict[str, Any] = {"medium": "Memory"}
    if spec.trainer.resources.shm_size is not None:
        shm["sizeLimit"] = str(spec.trainer.resources.shm_size)
    # Operator volumes are named etj-* (the API reserves the prefix); the user's follow unchanged.
    volumes: list[dict[str, Any]] = [
        {"name": "etj-tmp", "emptyDir": {}},
        {"name": "etj-shm", "emptyDir": shm},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "etj-tmp", "mountPath": "/tmp"},
        {"name": "etj-shm", "mountPath": "/dev/shm"},
    ]
    if spec.checkpoint.pvc is not None:
        volumes.append(
            {
                "name": "etj-checkpoints",
                "persistentVolumeClaim": {"claimName": spec.checkpoint.pvc.claim_name},
            }
        )
        mount = {"name": "etj-checkpoints", "mountPath": spec.checkpoint.path}
        if spec.checkpoint.pvc.sub_path:
            mount["subPath"] = spec.checkpoint.pvc.sub_path
        mounts.append(mount)
    volumes += [v.model_dump(mode="json", by_alias=True, exclude_none=True) for v in spec.trainer.volumes]
    mounts += [m.to_dict() for m in spec.trainer.volume_mounts]
    if _needs_scratch_checkpoint_dir(spec, mounts):
        # The root filesystem is read-only: without a PVC, URI or user mount the trainer could not write
        # checkpoints at all. A pod-local emptyDir keeps SIGTERM checkpoints working; joiners then take
        # state from a peer (docs/trainer.md), since nothing outlives the pod.
        volumes.append({"name": "etj-checkpoints", "emptyDir": {}})
        mounts.append({"name": "etj-checkpoints", "mountPath": spec.checkpoint.path})
    return volumes, mounts


def _worker_container(
    spec: ElasticTrainingJobSpec,
    *,
    job: str,
    namespace: str,
    uid: str,
    name: str,
    token_secret: str,
    grace_seconds: int,
    image: str | None,
    startup_workers: int,
    mounts: list[dict[str, Any]],
) -> dict[str, Any]:
    """The worker pod's one container: the trainer, with the contract's env."""
    return {
        "name": "trainer",
        "image": _image(spec, image),
        "imagePullPolicy": spec.trainer.image_pull_policy.value,
        "command": list(spec.trainer.command),
        "args": list(spec.trainer.args),
        "env": worker_env(
            spec,
            job=job,
            namespace=namespace,
            uid=uid,
            pod=name,
            token_secret=token_secret,
            grace_seconds=grace_seconds,
            startup_workers=startup_workers,
        ),
        "resources": worker_resources(spec),
        "securityContext": _restricted_container(),
        "volumeMounts": mounts,
        # A failed trainer's last log lines become the pod's termination message: the WorkerFailed Event
        # quotes the last one, so the cause (a bad data path, a bad value) is in `kubectl describe`.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def worker_pod(
    spec: ElasticTrainingJobSpec,
    *,
    job: str,
    namespace: str,
    uid: str,
    slot: int,
    token_secret: str,
    grace_seconds: int = DEFAULT_WORKER_GRACE_SECONDS,
    image: str | None = None,
    startup_workers: int = 1,
    capacity: CapacityType | None = None,
    avoid_nodes: Sequence[str] = (),
    priority_class: str | None = None,
    seat: SeatPlacement | None = None,
) -> dict[str, Any]:
    """One worker pod; ``image`` is the planner's resolved trainer image (default: spec.trainer.image).
    ``token_secret``: the job's token Secret (dataplane.token_secret_name), which the pod's env names.
    ``startup_workers``: the job's workers once this pod's batch exists (the plan's ``startup_workers``).
    ``capacity``: pin the pod to that capacity type (the deadline policy's spot and on-demand workers),
    labelled ``etj.dev/capacity`` so the planner knows which of its workers to release first. ``avoid_nodes``:
    nodes it must not run on (the plan's: workers crashed there). ``priority_class``: decide/plan/sharing.py.
    ``seat``: the Kueue Workload it runs under (etj.dev/kueue-seat), its flavor's labels and tolerations."""
    name = worker_name(job, slot)
    placement = spec.placement
    volumes, mounts = _worker_storage(spec)
    container = _worker_container(
        spec,
        job=job,
        namespace=namespace,
        uid=uid,
        name=name,
        token_secret=token_secret,
        grace_seconds=grace_seconds,
        image=image,
        startup_workers=startup_workers,
        mounts=mounts,
    )
    pod_labels = {**labels(job, ROLE_WORKER), LABEL_SLOT: str(slot), **_pinned(capacity, seat)}
    types = [capacity] if capacity is not None else list(placement.capacity_types)
    pod_spec: dict[str, Any] = {
        # Never: a crashed worker is replaced by the operator, which counts it against the budget.
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace_seconds,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": _restricted_pod(),
        "containers": [container],
        "volumes": volumes,
        **({"priorityClassName": priority_class} if priority_class else {}),
        "tolerations": [*capacity_tolerations(types), *(t.to_dict() for t in placement.tolerations)],
    }
    if spec.trainer.service_account_name:
        # The trainer's cloud identity (S3 checkpoints); automountServiceAccountToken stays False: IRSA's
        # and Pod Identity's webhooks add their own projected token, the Kubernetes API one is not needed.
        pod_spec["serviceAccountName"] = spec.trainer.service_account_name
    _place_worker(pod_spec, placement, types, capacity, avoid_nodes, seat)
    notes = {ANNOTATION_AVOIDED_NODES: ",".join(avoid_nodes)} if avoid_nodes else None
    return _pod(name, namespace, pod_labels, owner_reference(job, uid), pod_spec, notes)


def _pinned(capacity: CapacityType | None, seat: SeatPlacement | None) -> dict[str, str]:
    """The labels that say what a worker is pinned to: its capacity type, its Kueue seat."""
    pinned = {LABEL_CAPACITY: capacity.value} if capacity is not None else {}
    return pinned | ({LABEL_KUEUE_SEAT: seat.seat} if seat is not None else {})


def _place_worker(
    pod_spec: dict[str, Any],
    placement: Placement,
    types: list[CapacityType],
    capacity: CapacityType | None,
    avoid_nodes: Sequence[str],
    seat: SeatPlacement | None,
) -> None:
    """The worker's node selector and node affinity (capacity types, the user's, the avoided nodes), and
    the node labels and tolerations of the Kueue flavor its seat was admitted on."""
    selector = {**placement.node_selector, **(seat.node_selector if seat is not None else {})}
    if selector:
        pod_spec["nodeSelector"] = selector
    if seat is not None:
        pod_spec["tolerations"] += [dict(t) for t in seat.tolerations]
    if affinity := capacity_affinity(types, placement.affinity, pin=capacity, avoid=avoid_nodes):
        pod_spec["affinity"] = affinity


def _store_container(
    spec: ElasticTrainingJobSpec, *, job: str, namespace: str, token_secret: str, image: str | None
) -> dict[str, Any]:
    """The store pod's one container: ``etj-train store`` (TCPStore and the progress endpoint)."""
    return {
        "name": "store",
        # The planner's resolved store image (decide/plan/model.py store_image); called without one, the
        # spec's.
        "image": _image(spec, image or spec.trainer.store_image),
        "imagePullPolicy": spec.trainer.image_pull_policy.value,
        # Its own address only: process-backed pods (the local bed) share one machine's network.
        "command": [
            "etj-train",
            "store",
            "--host",
            "$(POD_IP)",
            "--port",
            str(RDZV_PORT),
            "--http-port",
            str(PROGRESS_PORT),
        ],
        "ports": [
            {"name": "rdzv", "containerPort": RDZV_PORT},
            {"name": "progress", "containerPort": PROGRESS_PORT},
        ],
        "env": [
            {"name": etj_env.JOB_NAME.name, "value": job},
            {"name": etj_env.NAMESPACE.name, "value": namespace},
            {"name": "HOME", "value": "/tmp"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            token_env(token_secret),
        ],
        # requests == limits: Guaranteed QoS, the last class the kubelet evicts under node pressure.
        "resources": {"requests": dict(STORE_RESOURCES), "limits": dict(STORE_RESOURCES)},
        # Ready when the TCPStore answers a set and a read-back through its own port (issue 37): a TCP
        # connect passed while one client's partial query held the store image's poll() server.
        "readinessProbe": {
            "httpGet": {"path": STORE_READY_PATH, "port": "progress"},
            "periodSeconds": 2,
            "timeoutSeconds": math.ceil(STORE_READY_TIMEOUT_S) + 1,
        },
        "securityContext": _restricted_container(),
        "volumeMounts": [{"name": "etj-tmp", "mountPath": "/tmp"}],
    }


def rendezvous_pod(
    spec: ElasticTrainingJobSpec,
    *,
    job: str,
    namespace: str,
    uid: str,
    token_secret: str,
    image: str | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """The store pod: TCPStore for c10d rendezvous + progress HTTP endpoint, outside every worker.
    ``token_secret``: the job's token Secret (dataplane.token_secret_name)."""
    rdzv = spec.placement.rendezvous
    container = _store_container(spec, job=job, namespace=namespace, token_secret=token_secret, image=image)
    pod_spec: dict[str, Any] = {
        # Always: a crashed store restarts in place. A lost one is replaced by a new pod (new name, maybe
        # a new IP): agents reach it by the Service name and re-form the world on it
        # (etj_trainer.agent.store_link).
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": RENDEZVOUS_GRACE_SECONDS,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": _restricted_pod(),
        "containers": [container],
        "volumes": [{"name": "etj-tmp", "emptyDir": {}}],
        "tolerations": [*capacity_tolerations(rdzv.capacity_types), *(t.to_dict() for t in rdzv.tolerations)],
    }
    if rdzv.node_selector:
        pod_spec["nodeSelector"] = dict(rdzv.node_selector)
    if rdzv.priority_class_name:
        pod_spec["priorityClassName"] = rdzv.priority_class_name
    affinity = capacity_affinity(rdzv.capacity_types)
    if affinity:
        pod_spec["affinity"] = affinity
    # The Service selects one store index: a replacement stays out of it until it is switched in.
    pod_labels = {**labels(job, ROLE_RENDEZVOUS), LABEL_STORE: str(index)}
    name = rendezvous_pod_name(job, index)
    owner = owner_reference(job, uid)
    return _pod(name, namespace, pod_labels, owner, pod_spec, dict(STORE_ANNOTATIONS))


def rendezvous_selector(job: str, store: int | None) -> dict[str, str]:
    """The serving store's pods: one index (``store``), or every store pod of the job (None: a Service's
    selector as operators before make-before-break moves wrote it)."""
    selector = {LABEL_JOB: job, LABEL_ROLE: ROLE_RENDEZVOUS}
    if store is not None:
        selector[LABEL_STORE] = str(store)
    return selector


def rendezvous_service(*, job: str, namespace: str, uid: str, store: int | None) -> dict[str, Any]:
    """Headless, and publishing not-ready addresses so workers resolve the store while it starts. It
    selects the serving store only (``store``: its index), never a replacement that is starting."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owned_metadata(
            rendezvous_name(job), job=job, namespace=namespace, uid=uid, role=ROLE_RENDEZVOUS
        ),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": rendezvous_selector(job, store),
            "ports": [
                {"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT},
                {"name": "progress", "port": PROGRESS_PORT, "targetPort": PROGRESS_PORT},
            ],
        },
    }

"""Builders for the objects the operator creates: worker pods, the rendezvous pod and its Service.

Pure functions returning plain dicts (what the API accepts), so unit tests can check the pod contract
(docs/contract.md) and Pod Security "restricted" without a cluster.

Why one module over ~400 lines: the worker pod, the store pod and their Service share the placement,
toleration and security pieces below; what would split off cleanly (the recipe's env) is already a short
table over ``etj_contract.env``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from etj_contract import env as etj_env
from etj_contract.ports import PROGRESS_PORT, RDZV_PORT
from etj_operator.api.models import (
    API_VERSION,
    KIND,
    CapacityType,
    ElasticTrainingJobSpec,
    TrainingSpec,
)
from etj_operator.constants import (
    LABEL_CAPACITY,
    LABEL_CAPACITY_OVERRIDE,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    LABEL_SLOT,
    MANAGED_BY,
    ROLE_RENDEZVOUS,
    ROLE_WORKER,
)
from etj_operator.observe.nodes import CAPACITY_LABELS, SPOT_TAINT_TOLERATIONS

# Grace period for a drained worker: long enough for a just-in-time checkpoint, shorter than the
# 120 s AWS spot notice so the pod is gone before the node is. The spec has no field for it (yet);
# the operator's --worker-grace-seconds flag changes it.
DEFAULT_WORKER_GRACE_SECONDS = 90
RENDEZVOUS_GRACE_SECONDS = 10
# The store pod's requests and limits (equal: Guaranteed QoS). The TCPStore and the progress document
# are small; the cpu is for bursts of keep-alives from large jobs.
STORE_RESOURCES = {"cpu": "500m", "memory": "512Mi"}
# Karpenter leaves a node alone while it runs a pod with this annotation (consolidation, drift).
STORE_ANNOTATIONS = {"karpenter.sh/do-not-disrupt": "true"}
NONROOT_UID = 1000


def worker_name(job: str, slot: int) -> str:
    return f"{job}-worker-{slot}"


def rendezvous_name(job: str) -> str:
    """The store's Service (a stable address); its pods are ``rendezvous_pod_name``."""
    return f"{job}-rdzv"


def rendezvous_pod_name(job: str, index: int) -> str:
    """Each replacement store pod gets a fresh name: a lost one may stay Terminating on a dead node, and
    a fixed name would keep the job without a store until it is gone. The Service selects by label."""
    return f"{rendezvous_name(job)}-{index}"


def rendezvous_index(job: str, pod: str) -> int | None:
    """The index in a store pod's name; -1 for the fixed name older operators used; None if not ours."""
    base = rendezvous_name(job)
    if pod == base:
        return -1
    tail = pod.removeprefix(base + "-")
    return int(tail) if tail != pod and tail.isdigit() else None


def rendezvous_host(job: str, namespace: str) -> str:
    return f"{rendezvous_name(job)}.{namespace}.svc"


def token_secret_name(job: str) -> str:
    return f"{job}-etj-token"


# The key of the job's Secret that holds the progress token.
TOKEN_KEY = "token"


def token_env(job: str) -> dict[str, Any]:
    """ETJ_PROGRESS_TOKEN read from the job's Secret: pods name the Secret, never the value."""
    return {
        "name": etj_env.PROGRESS_TOKEN.name,
        "valueFrom": {"secretKeyRef": {"name": token_secret_name(job), "key": TOKEN_KEY}},
    }


def worker_selector(job: str) -> str:
    return f"{LABEL_JOB}={job},{LABEL_ROLE}={ROLE_WORKER}"


def owner_reference(job: str, uid: str) -> dict[str, Any]:
    # controller + blockOwnerDeletion: the garbage collector deletes the pods with the job, and
    # foreground deletion of the job waits for them.
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned_metadata(name: str, *, job: str, namespace: str, uid: str, role: str) -> dict[str, Any]:
    """Metadata of an object the job owns besides its pods (Service, Secret, policies): its labels, and
    the owner reference through which the garbage collector removes it with the job."""
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels(job, role),
        "ownerReferences": [owner_reference(job, uid)],
    }


def labels(job: str, role: str) -> dict[str, str]:
    return {
        LABEL_JOB: job,
        LABEL_ROLE: role,
        LABEL_MANAGED_BY: MANAGED_BY,
        "app.kubernetes.io/name": "etj",
        "app.kubernetes.io/instance": job,
    }


def capacity_tolerations(types: Iterable[CapacityType]) -> list[dict[str, str]]:
    """Tolerations for the taints clouds put on spot nodes, when the job allows spot."""
    return [dict(t) for t in SPOT_TAINT_TOLERATIONS] if CapacityType.SPOT in set(types) else []


def _capacity_terms(ctype: CapacityType) -> list[list[dict[str, Any]]]:
    """Node selector terms (ORed; expressions inside a term ANDed) matching nodes of one capacity type.

    The override label wins over the cloud labels, mirroring ``CapacityRules.capacity_type``.
    """
    no_override = {"key": LABEL_CAPACITY_OVERRIDE, "operator": "DoesNotExist"}
    terms: list[list[dict[str, Any]]] = [
        [{"key": LABEL_CAPACITY_OVERRIDE, "operator": "In", "values": [ctype.value]}]
    ]
    if ctype == CapacityType.SPOT:
        for key, value, kind in CAPACITY_LABELS:
            if kind == CapacityType.SPOT:
                terms.append([no_override, {"key": key, "operator": "In", "values": [value]}])
    else:
        # On-demand is "not spot by any convention" (unlabelled nodes count as on-demand).
        spot: dict[str, list[str]] = {}
        for key, value, kind in CAPACITY_LABELS:
            if kind == CapacityType.SPOT:
                spot.setdefault(key, []).append(value)
        terms.append([no_override, *({"key": k, "operator": "NotIn", "values": v} for k, v in spot.items())])
    return terms


def pinned_terms(ctype: CapacityType) -> list[list[dict[str, Any]]]:
    """Terms that pin a pod to one capacity type in a form autoscalers provision for.

    On-demand leads with the positive labels of Karpenter (``karpenter.sh/capacity-type: on-demand``) and
    of EKS managed node groups (``eks.amazonaws.com/capacityType: ON_DEMAND``): a pending pod that requires
    them is what makes Karpenter, or the cluster autoscaler scaling an on-demand node group, start a node.
    The general terms (the override label; "not spot by any convention") follow, so other clouds and
    unlabelled on-demand nodes still take the pod.
    """
    if ctype == CapacityType.SPOT:
        return _capacity_terms(ctype)
    no_override = {"key": LABEL_CAPACITY_OVERRIDE, "operator": "DoesNotExist"}
    return [
        [no_override, {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}],
        [no_override, {"key": "eks.amazonaws.com/capacityType", "operator": "In", "values": ["ON_DEMAND"]}],
        *_capacity_terms(ctype),
    ]


def capacity_affinity(
    types: Iterable[CapacityType], user: Mapping[str, Any] | None = None, *, pin: CapacityType | None = None
) -> dict[str, Any]:
    """Node affinity for the allowed capacity types, merged with the user's affinity.

    One allowed type → a required rule. Both → no requirement, but a preference for the first listed
    (spec order is the preference order). The user's required terms are ANDed with ours (cross product,
    because node selector terms are ORed).
    """
    allowed = list(dict.fromkeys(types))
    affinity: dict[str, Any] = {k: v for k, v in (user or {}).items() if k != "nodeAffinity"}
    user_node = dict((user or {}).get("nodeAffinity") or {})
    preferred = list(user_node.get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    user_terms = list(
        (user_node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    )
    ours: list[list[dict[str, Any]]] = []
    if pin is not None:
        ours = pinned_terms(pin)
    elif len(allowed) == 1:
        ours = _capacity_terms(allowed[0])
    elif allowed:
        preferred += [
            {"weight": 50, "preference": {"matchExpressions": term}} for term in _capacity_terms(allowed[0])
        ]
    if ours and user_terms:
        terms = [
            {**ut, "matchExpressions": [*(ut.get("matchExpressions") or []), *o]}
            for ut in user_terms
            for o in ours
        ]
    elif ours:
        terms = [{"matchExpressions": o} for o in ours]
    else:
        terms = user_terms
    node: dict[str, Any] = {}
    if terms:
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    if preferred:
        node["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    if node:
        affinity["nodeAffinity"] = node
    return affinity


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


def recipe_env(training: TrainingSpec) -> dict[etj_env.Var[Any], object]:
    """The training recipe (spec.training.optimizer/lrSchedule/precision/augmentation) as ETJ_* values."""
    opt, sched, aug = training.optimizer, training.lr_schedule, training.augmentation
    return {
        etj_env.LR: opt.lr_at(training.global_batch_size),
        etj_env.MOMENTUM: opt.momentum,
        etj_env.NESTEROV: str(opt.nesterov).lower(),
        etj_env.WEIGHT_DECAY: opt.weight_decay,
        etj_env.NO_WD_NORM_BIAS: str(opt.no_weight_decay_on_norm_and_bias).lower(),
        etj_env.LABEL_SMOOTHING: opt.label_smoothing,
        etj_env.LR_SCHEDULE: sched.type.value,
        etj_env.WARMUP_EPOCHS: sched.warmup_epochs,
        etj_env.LR_MILESTONES: ",".join(f"{m:g}" for m in sched.milestones),
        etj_env.LR_GAMMA: sched.gamma,
        etj_env.LR_POWER: sched.power,
        etj_env.LR_FINAL_FRACTION: sched.final_lr_fraction,
        etj_env.PRECISION: training.precision.value,
        etj_env.AUGMENT: aug.type.value,
        etj_env.MIN_CROP_SCALE: aug.min_crop_scale,
        etj_env.AUGMENT_FLIP: str(aug.horizontal_flip).lower(),
        etj_env.VAL_RESIZE: aug.validation_resize or 0,  # 0: the training image size
    }


def worker_env(
    spec: ElasticTrainingJobSpec,
    *,
    job: str,
    namespace: str,
    uid: str,
    pod: str,
    grace_seconds: int = DEFAULT_WORKER_GRACE_SECONDS,
    startup_workers: int = 1,
) -> list[dict[str, Any]]:
    """The variables of etj_contract.env.OPERATOR_SET, then HOME, then the user's env (no ETJ_* there)."""
    host = rendezvous_host(job, namespace)
    training = spec.training
    values: dict[etj_env.Var[Any], object] = {
        etj_env.JOB_NAME: job,
        etj_env.NAMESPACE: namespace,
        etj_env.WORKER_ID: pod,
        etj_env.RDZV_ENDPOINT: f"{host}:{RDZV_PORT}",
        etj_env.RDZV_ID: uid,
        etj_env.MIN_WORKERS: spec.replicas.min,
        etj_env.MAX_WORKERS: spec.replicas.max,
        etj_env.STARTUP_WORKERS: startup_workers,
        etj_env.STORE_WAIT_SECONDS: spec.failure_policy.startup_deadline_seconds,
        etj_env.NPROC_PER_WORKER: spec.procs_per_worker,
        etj_env.GLOBAL_BATCH_SIZE: training.global_batch_size,
        etj_env.MICRO_BATCH_SIZE: training.micro_batch_size,
        etj_env.RESIZE_POLICY: training.resize_policy.value,
        etj_env.DSGD_RAMP_STEPS: training.dynamic_sgd.ramp_steps,
        etj_env.EPOCHS: training.epochs,
        etj_env.SEED: training.seed,
        etj_env.CHECKPOINT_DIR: spec.checkpoint.path,
        etj_env.CHECKPOINT_URI: spec.checkpoint.uri or "",
        etj_env.CHECKPOINT_KEEP: spec.checkpoint.keep,
        etj_env.TERMINATION_GRACE_SECONDS: grace_seconds,
        etj_env.CHECKPOINT_INTERVAL_STEPS: spec.checkpoint.interval_steps,
        etj_env.PROGRESS_URL: f"http://{host}:{PROGRESS_PORT}/progress",
        **recipe_env(training),
    }
    # Every variable the contract says the operator sets, in its order (a KeyError here: one is missing).
    env: list[dict[str, Any]] = [
        token_env(job) if v is etj_env.PROGRESS_TOKEN else {"name": v.name, "value": str(values[v])}
        for v in etj_env.OPERATOR_SET
    ]
    # The root filesystem is read-only: caches go to the /tmp emptyDir.
    env.append({"name": "HOME", "value": "/tmp"})
    # The address the agent publishes to the other workers (MASTER_ADDR of the process group). Without
    # it torch elastic publishes the pod's hostname, which no other pod can resolve: on kind every
    # init_process_group timed out ("1/2 clients joined"); process-backed pods share one host.
    env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    env += [e.to_dict() for e in spec.trainer.env]
    return env


def _resources(spec: ElasticTrainingJobSpec) -> dict[str, Any]:
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
    """The resolved image (``plan_model.trainer_image``) or the spec's; a pod without one is a bug."""
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


def worker_pod(
    spec: ElasticTrainingJobSpec,
    *,
    job: str,
    namespace: str,
    uid: str,
    slot: int,
    grace_seconds: int = DEFAULT_WORKER_GRACE_SECONDS,
    image: str | None = None,
    startup_workers: int = 1,
    capacity: CapacityType | None = None,
) -> dict[str, Any]:
    """One worker pod; ``image`` is the planner's resolved trainer image (default: spec.trainer.image).

    ``startup_workers``: the job's workers once this pod's batch exists (the plan's ``startup_workers``).
    ``capacity``: pin the pod to that capacity type (the deadline policy's spot and on-demand workers),
    labelled ``etj.dev/capacity`` so the planner knows which of its workers to release first.
    """
    name = worker_name(job, slot)
    placement = spec.placement
    volumes, mounts = _worker_storage(spec)
    container: dict[str, Any] = {
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
            grace_seconds=grace_seconds,
            startup_workers=startup_workers,
        ),
        "resources": _resources(spec),
        "securityContext": _restricted_container(),
        "volumeMounts": mounts,
        # A failed trainer's last log lines become the pod's termination message: the WorkerFailed Event
        # quotes the last one, so the cause (a bad data path, a bad value) is in `kubectl describe`.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_labels = {**labels(job, ROLE_WORKER), LABEL_SLOT: str(slot)}
    if capacity is not None:
        pod_labels[LABEL_CAPACITY] = capacity.value
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
        "tolerations": [
            *capacity_tolerations(types),
            *(t.to_dict() for t in placement.tolerations),
        ],
    }
    if spec.trainer.service_account_name:
        # The trainer's cloud identity (S3 checkpoints); automountServiceAccountToken stays False: IRSA's
        # and Pod Identity's webhooks add their own projected token, the Kubernetes API one is not needed.
        pod_spec["serviceAccountName"] = spec.trainer.service_account_name
    if placement.node_selector:
        pod_spec["nodeSelector"] = dict(placement.node_selector)
    affinity = capacity_affinity(types, placement.affinity, pin=capacity)
    if affinity:
        pod_spec["affinity"] = affinity
    return _pod(name, namespace, pod_labels, owner_reference(job, uid), pod_spec)


def rendezvous_pod(
    spec: ElasticTrainingJobSpec,
    *,
    job: str,
    namespace: str,
    uid: str,
    image: str | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """The store pod: TCPStore for c10d rendezvous + progress HTTP endpoint, outside every worker."""
    rdzv = spec.placement.rendezvous
    container = {
        "name": "store",
        "image": _image(spec, image),
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
            token_env(job),
        ],
        # requests == limits: Guaranteed QoS, the last class the kubelet evicts under node pressure.
        "resources": {"requests": dict(STORE_RESOURCES), "limits": dict(STORE_RESOURCES)},
        "readinessProbe": {"tcpSocket": {"port": RDZV_PORT}, "periodSeconds": 2},
        "securityContext": _restricted_container(),
        "volumeMounts": [{"name": "etj-tmp", "mountPath": "/tmp"}],
    }
    pod_spec: dict[str, Any] = {
        # Always: a crashed store restarts in place. A lost one is replaced by a new pod (new name, maybe
        # a new IP): agents reach it by the Service name and re-form the world on it (etj_trainer.store_link).
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
    pod_labels = labels(job, ROLE_RENDEZVOUS)
    name = rendezvous_pod_name(job, index)
    owner = owner_reference(job, uid)
    return _pod(name, namespace, pod_labels, owner, pod_spec, dict(STORE_ANNOTATIONS))


def rendezvous_service(*, job: str, namespace: str, uid: str) -> dict[str, Any]:
    """Headless, and publishing not-ready addresses so workers resolve the store while it starts."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owned_metadata(
            rendezvous_name(job), job=job, namespace=namespace, uid=uid, role=ROLE_RENDEZVOUS
        ),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: job, LABEL_ROLE: ROLE_RENDEZVOUS},
            "ports": [
                {"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT},
                {"name": "progress", "port": PROGRESS_PORT, "targetPort": PROGRESS_PORT},
            ],
        },
    }

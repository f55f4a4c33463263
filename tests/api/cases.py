"""Bad ElasticTrainingJob manifests shared by the pydantic tests and the real-apiserver tests.

Every case mutates a valid job and names what a user must see in the rejection: the field path and a phrase
saying why. The same table runs against pydantic (the operator's parser) and the apiserver (OpenAPI + CEL).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Manifest = dict[str, Any]


def valid_job(name: str = "good") -> Manifest:
    """A small valid job (the shape of examples/demo-cpu.yaml) that every case starts from."""
    return {
        "apiVersion": "etj.dev/v1alpha1",
        "kind": "ElasticTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "trainer": {
                "image": "ghcr.io/etj-dev/etj-trainer:0.1.0",
                "env": [{"name": "ETJ_DATA", "value": "digits"}],
                "resources": {"gpu": 1, "cpu": "500m", "memory": "1Gi"},
            },
            "replicas": {"min": 1, "max": 4},
            "training": {"globalBatchSize": 64, "microBatchSize": 16},
        },
    }


def _set(path: str, value: Any) -> Callable[[Manifest], None]:
    """Mutation setting a dotted path (list indices as numbers) under the manifest."""

    def apply(doc: Manifest) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        if last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value

    return apply


def _delete(path: str) -> Callable[[Manifest], None]:
    def apply(doc: Manifest) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[part]
        del node[last]

    return apply


def _both(*fns: Callable[[Manifest], None]) -> Callable[[Manifest], None]:
    def apply(doc: Manifest) -> None:
        for fn in fns:
            fn(doc)

    return apply


@dataclass(frozen=True)
class Case:
    """One bad manifest: ``mutate`` breaks ``valid_job``; the rejection must contain ``field`` and ``why``."""

    id: str
    mutate: Callable[[Manifest], None]
    field: str  # as the apiserver prints it (spec.replicas.min, spec.trainer.env[0].name, ...)
    why: str  # a phrase of the apiserver's message (case-insensitive)
    pydantic_why: str = ""  # phrase of pydantic's message when it differs ("" = same as why)
    apiserver_only: bool = False  # checks pydantic cannot make on one object (metadata-level)
    tags: tuple[str, ...] = field(default_factory=tuple)

    def manifest(self, name: str = "bad") -> Manifest:
        doc = copy.deepcopy(valid_job(name))
        self.mutate(doc)
        return doc


_ENV = "spec.trainer.env"
# Pass-through pod fields carry Kubernetes' own schemas (issue 15: they were preserve-unknown-fields, so
# a malformed one passed the apiserver and broke pod creation later). The operator's parser keeps them as
# plain objects, so these are the apiserver's checks only.
_PASS_THROUGH: list[Case] = [
    Case(
        "affinity-weight-is-an-object",
        _set(
            "spec.placement.affinity",
            {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": {"value": 5}, "preference": {"matchExpressions": []}}
                    ]
                }
            },
        ),
        "spec.placement.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
        # Strict field validation (kubectl apply) names the object's field first; without it the type is.
        "unknown field",
        apiserver_only=True,
    ),
    Case(
        "affinity-operator-unknown",
        _set(
            "spec.placement.affinity",
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Near"}]}]
                    }
                }
            },
        ),
        "operator",
        "supported values",
        apiserver_only=True,
    ),
    Case(
        "affinity-term-without-topology-key",
        _set(
            "spec.placement.affinity",
            {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]}},
        ),
        "topologyKey",
        "Required value",
        apiserver_only=True,
    ),
    Case(
        "volume-source-malformed",
        _set("spec.trainer.volumes", [{"name": "data", "persistentVolumeClaim": {"claimName": 7}}]),
        "spec.trainer.volumes[0].persistentVolumeClaim.claimName",
        "must be of type string",
        apiserver_only=True,
    ),
    Case(
        "volume-source-missing-required",
        _set("spec.trainer.volumes", [{"name": "data", "nfs": {"server": "nfs.example.com"}}]),
        "spec.trainer.volumes[0].nfs.path",
        "Required value",
        apiserver_only=True,
    ),
    Case(
        "env-value-from-malformed",
        _set(f"{_ENV}.0", {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s"}}}),
        f"{_ENV}[0].valueFrom.secretKeyRef.key",
        "Required value",
        apiserver_only=True,
    ),
]
CASES: list[Case] = [
    *_PASS_THROUGH,
    # replicas
    Case("min-zero", _set("spec.replicas.min", 0), "spec.replicas.min", "greater than or equal to 1"),
    Case("min-negative", _set("spec.replicas.min", -2), "spec.replicas.min", "greater than or equal to 1"),
    Case(
        "min-greater-than-max",
        _set("spec.replicas", {"min": 5, "max": 2}),
        "spec.replicas.min",
        "must not be greater than replicas.max",
    ),
    Case(
        "max-wrong-type",
        _set("spec.replicas.max", "four"),
        "spec.replicas.max",
        "must be of type integer",
        pydantic_why="valid integer",
    ),
    Case("max-too-large", _set("spec.replicas.max", 5000), "spec.replicas.max", "less than or equal to 1024"),
    Case(
        "replicas-missing",
        _delete("spec.replicas"),
        "spec.replicas",
        "Required value",
        pydantic_why="Field required",
    ),
    # trainer
    # (No "image-missing" case: an unset image is the operator's default trainer image, tests/operator and
    # tests/integration check that path.)
    Case(
        "image-empty",
        _set("spec.trainer.image", ""),
        "spec.trainer.image",
        "at least 1 chars",
        pydantic_why="at least 1 character",
    ),
    Case(
        "image-too-long",
        _set("spec.trainer.image", "r/" + "x" * 600),
        "spec.trainer.image",
        "may not be more than 512",
        pydantic_why="at most 512 characters",
    ),
    Case(
        "pull-policy-enum",
        _set("spec.trainer.imagePullPolicy", "Sometimes"),
        "spec.trainer.imagePullPolicy",
        'Unsupported value: "Sometimes"',
        pydantic_why="Input should be 'Always'",
    ),
    Case(
        "command-empty",
        _set("spec.trainer.command", []),
        "spec.trainer.command",
        "at least 1 items",
        pydantic_why="at least 1 item",
    ),
    Case(
        "args-too-many",
        _set("spec.trainer.args", ["--x"] * 65),
        "spec.trainer.args",
        "at most 64 items",
        pydantic_why="at most 64 items",
    ),
    Case(
        "env-reserved",
        _set(f"{_ENV}.0", {"name": "ETJ_GLOBAL_BATCH_SIZE", "value": "8"}),
        f"{_ENV}[0].name",
        "ETJ_GLOBAL_BATCH_SIZE is set by the operator",
    ),
    Case(
        "env-value-and-valuefrom",
        _set(f"{_ENV}.0", {"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}),
        f"{_ENV}[0]",
        "value or valueFrom, not both",
    ),
    Case(
        "env-bad-name",
        _set(f"{_ENV}.0", {"name": "has space", "value": "1"}),
        f"{_ENV}[0].name",
        "env names may contain only",
    ),
    Case(
        "env-duplicate",
        _set(_ENV, [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
        f"{_ENV}[1]",
        "Duplicate value",
        pydantic_why="duplicate trainer.env name",
    ),
    Case(
        "env-too-many",
        _set(_ENV, [{"name": f"V{i}", "value": "1"} for i in range(65)]),
        _ENV,
        "at most 64 items",
        pydantic_why="at most 64 items",
    ),
    Case(
        "gpu-negative",
        _set("spec.trainer.resources.gpu", -1),
        "spec.trainer.resources.gpu",
        "greater than or equal to 0",
    ),
    Case(
        "cpu-not-quantity",
        _set("spec.trainer.resources.cpu", "lots"),
        "spec.trainer.resources.cpu",
        "must be a Kubernetes quantity",
        pydantic_why="is not a Kubernetes quantity",
    ),
    Case(
        "memory-negative",
        _set("spec.trainer.resources.memory", -1),
        "spec.trainer.resources.memory",
        "must be a Kubernetes quantity",
        pydantic_why="must not be negative",
    ),
    Case(
        "mount-without-volume",
        _set("spec.trainer.volumeMounts", [{"name": "data", "mountPath": "/data"}]),
        "spec.trainer.volumeMounts",
        "must match the name of an entry in trainer.volumes",
    ),
    Case(
        "volume-reserved-name",
        _set("spec.trainer.volumes", [{"name": "etj-data", "emptyDir": {}}]),
        "spec.trainer.volumes[0].name",
        "reserved for the operator",
    ),
    # training
    Case(
        "global-batch-zero",
        _set("spec.training.globalBatchSize", 0),
        "spec.training.globalBatchSize",
        "greater than or equal to 1",
    ),
    Case(
        "global-batch-negative",
        _set("spec.training.globalBatchSize", -64),
        "spec.training.globalBatchSize",
        "greater than or equal to 1",
    ),
    Case(
        "micro-batch-zero",
        _set("spec.training.microBatchSize", 0),
        "spec.training.microBatchSize",
        "greater than or equal to 1",
    ),
    Case(
        "micro-batch-float",
        _set("spec.training.microBatchSize", 1.5),
        "spec.training.microBatchSize",
        "must be of type integer",
        pydantic_why="valid integer",
    ),
    Case(
        "micro-above-global",
        _set("spec.training", {"globalBatchSize": 32, "microBatchSize": 64}),
        "spec.training.microBatchSize",
        "must not be greater than training.globalBatchSize",
    ),
    Case(
        "global-below-processes",
        _set("spec.training", {"globalBatchSize": 3, "microBatchSize": 1}),
        "spec.training.globalBatchSize",
        "must be at least one sample per training process at replicas.max",
    ),
    Case(
        "global-below-processes-per-pod",
        _both(
            _set("spec.trainer.resources.gpu", 0),
            _set("spec.trainer.procsPerWorker", 32),  # 4 pods x 32 ranks > 64 samples
        ),
        "spec.training.globalBatchSize",
        "must be at least one sample per training process at replicas.max",
    ),
    Case(
        "dynamic-sgd-batch-not-a-multiple-of-the-minimum-ranks",
        _both(
            _set("spec.training.resizePolicy", "DynamicSGD"),
            _set("spec.trainer.resources.gpu", 0),
            _set("spec.trainer.procsPerWorker", 3),  # the batch at the minimum: 64 over 3 ranks
        ),
        "spec.training.globalBatchSize",
        "must be a multiple of the training processes there",
    ),
    Case(
        "procs-per-worker-zero",
        _set("spec.trainer.procsPerWorker", 0),
        "spec.trainer.procsPerWorker",
        "greater than or equal to 1",
    ),
    Case(
        "procs-per-worker-above-gpus",
        _set("spec.trainer.procsPerWorker", 2),  # the valid job has 1 GPU per pod
        "spec.trainer.procsPerWorker",
        "must not be greater than trainer.resources.gpu",
    ),
    Case(
        "resize-policy-enum",
        _set("spec.training.resizePolicy", "Adaptive"),
        "spec.training.resizePolicy",
        'Unsupported value: "Adaptive"',
        pydantic_why="Input should be 'FixedGlobalBatch'",
    ),
    Case(
        "ramp-zero",
        _set("spec.training.dynamicSGD", {"rampSteps": 0}),
        "spec.training.dynamicSGD.rampSteps",
        "greater than or equal to 1",
    ),
    Case(
        "epochs-zero", _set("spec.training.epochs", 0), "spec.training.epochs", "greater than or equal to 1"
    ),
    # placement
    Case(
        "capacity-enum",
        _set("spec.placement.capacityTypes", ["preemptible"]),
        "spec.placement.capacityTypes[0]",
        'Unsupported value: "preemptible"',
        pydantic_why="Input should be 'spot' or 'on-demand'",
    ),
    Case(
        "capacity-empty",
        _set("spec.placement.capacityTypes", []),
        "spec.placement.capacityTypes",
        "at least 1 items",
        pydantic_why="at least 1 item",
    ),
    Case(
        "capacity-duplicate",
        _set("spec.placement.rendezvous", {"capacityTypes": ["spot", "spot"]}),
        "spec.placement.rendezvous.capacityTypes",
        "capacityTypes must not list a value twice",
        pydantic_why="duplicate capacity type",
    ),
    Case(
        "node-selector-too-big",
        _set("spec.placement.nodeSelector", {f"k{i}": "v" for i in range(33)}),
        "spec.placement.nodeSelector",
        "must have at most 32 items",
        pydantic_why="at most 32 items",
    ),
    Case(
        "tolerations-too-many",
        _set("spec.placement.tolerations", [{"operator": "Exists"}] * 33),
        "spec.placement.tolerations",
        "at most 32 items",
        pydantic_why="at most 32 items",
    ),
    Case(
        "toleration-exists-with-value",
        _set("spec.placement.tolerations", [{"key": "k", "operator": "Exists", "value": "v"}]),
        "spec.placement.tolerations[0].value",
        "operator Exists must not set value",
    ),
    Case(
        "toleration-effect-enum",
        _set("spec.placement.tolerations", [{"key": "k", "value": "v", "effect": "Never"}]),
        "spec.placement.tolerations[0].effect",
        'Unsupported value: "Never"',
        pydantic_why="Input should be",
    ),
    # checkpoint, scaling, failure budget, lifecycle
    Case(
        "checkpoint-pvc-and-uri",
        _set("spec.checkpoint", {"pvc": {"claimName": "ckpt"}, "uri": "s3://bucket/job"}),
        "spec.checkpoint",
        "set checkpoint.pvc or checkpoint.uri, not both",
    ),
    # a sharded job's DCP checkpoint is every rank's files on one volume: the object store takes DDP's only
    Case(
        "sharded-checkpoint-to-an-object-store",
        _both(_set("spec.training.parallelism", "FSDP"), _set("spec.checkpoint", {"uri": "s3://bucket/job"})),
        "spec.checkpoint.uri",
        "checkpoints to a volume every worker mounts",
        pydantic_why="checkpoints to a volume every worker mounts",
    ),
    # a stock torchrun script (issue 47, rung 0) is opaque: etj can neither ramp its LR nor shard its model
    Case(
        "a-stock-script-under-dynamic-sgd",
        _both(
            _set("spec.trainer.launcher", "Torchrun"),
            _set("spec.training.resizePolicy", "DynamicSGD"),
            _set("spec.training.globalBatchSize", 64),
        ),
        "spec.trainer.launcher",
        "training.resizePolicy DynamicSGD needs a script on etj_trainer.elastic",
    ),
    Case(
        "a-stock-script-sharded-by-etj",
        _both(_set("spec.trainer.launcher", "Torchrun"), _set("spec.training.parallelism", "FSDP")),
        "spec.trainer.launcher",
        "training.parallelism FSDP or HSDP is etj's sharding of a script on etj_trainer.elastic",
    ),
    Case(
        "an-unknown-launcher",
        _set("spec.trainer.launcher", "mpirun"),
        "spec.trainer.launcher",
        'Unsupported value: "mpirun"',
        pydantic_why="Input should be 'Etj' or 'Torchrun'",
    ),
    Case(
        "a-shard-group-without-hsdp",
        _both(_set("spec.training.parallelism", "FSDP"), _set("spec.training.shardGroupSize", 2)),
        "spec.training.shardGroupSize",
        "training.shardGroupSize (ranks per shard group) is for training.parallelism HSDP only",
    ),
    Case(
        "checkpoint-relative-path",
        _set("spec.checkpoint", {"path": "ckpt"}),
        "spec.checkpoint.path",
        "checkpoint.path must be an absolute path",
    ),
    Case(
        "checkpoint-uri-no-scheme",
        _set("spec.checkpoint", {"uri": "bucket/job"}),
        "spec.checkpoint.uri",
        "checkpoint.uri must be s3://bucket/prefix",
    ),
    # gs:// passed a scheme-only check, was reported durable, then the trainer refused it at its first save
    Case(
        "checkpoint-uri-scheme-the-trainer-cannot-write",
        _set("spec.checkpoint", {"uri": "gs://bucket/job"}),
        "spec.checkpoint.uri",
        "checkpoint.uri must be s3://bucket/prefix",
    ),
    Case(
        "checkpoint-uri-no-bucket",
        _set("spec.checkpoint", {"uri": "s3:///job"}),
        "spec.checkpoint.uri",
        "checkpoint.uri must be s3://bucket/prefix",
    ),
    Case(
        "trainer-bad-service-account",
        _set("spec.trainer.serviceAccountName", "Trainer_S3"),
        "spec.trainer.serviceAccountName",
        "trainer.serviceAccountName must be a lower-case DNS name",
    ),
    Case(
        "checkpoint-bad-claim",
        _set("spec.checkpoint", {"pvc": {"claimName": "Bad_Name"}}),
        "spec.checkpoint.pvc.claimName",
        "must be a lower-case DNS name",
    ),
    Case(
        "checkpoint-interval-zero",
        _set("spec.checkpoint", {"intervalSteps": 0}),
        "spec.checkpoint.intervalSteps",
        "greater than or equal to 1",
    ),
    Case(
        "cooldown-negative",
        _set("spec.scaling", {"cooldownSeconds": -1}),
        "spec.scaling.cooldownSeconds",
        "greater than or equal to 0",
    ),
    Case(
        "max-failures-wrong-type",
        _set("spec.failurePolicy", {"maxFailures": "many"}),
        "spec.failurePolicy.maxFailures",
        "must be of type integer",
        pydantic_why="valid integer",
    ),
    Case(
        "suspend-wrong-type",
        _set("spec.suspend", "yes please"),
        "spec.suspend",
        "must be of type boolean",
        pydantic_why="valid boolean",
    ),
    Case(
        "ttl-negative",
        _set("spec.ttlSecondsAfterFinished", -5),
        "spec.ttlSecondsAfterFinished",
        "greater than or equal to 0",
    ),
    Case(
        "unknown-field",
        _both(_set("spec.replica", {"min": 1})),
        "spec.replica",
        "unknown field",
        pydantic_why="Extra inputs are not permitted",
    ),
    # The training recipe (api/recipe.py): cross-field rules come from one Check (CEL + pydantic).
    Case(
        "warmup-not-shorter-than-training",
        _both(_set("spec.training.epochs", 5), _set("spec.training.lrSchedule", {"warmupEpochs": 5})),
        "spec.training.lrSchedule.warmupEpochs",
        "warmupEpochs must be less than training.epochs",
        tags=("recipe",),
    ),
    Case(
        "milestones-not-increasing",
        _both(
            _set("spec.training.epochs", 90),
            _set("spec.training.lrSchedule", {"type": "step", "milestones": [60, 30, 80]}),
        ),
        "spec.training.lrSchedule.milestones",
        "must be strictly increasing",
        tags=("recipe",),
    ),
    Case(
        "milestones-repeated",
        _both(
            _set("spec.training.epochs", 90),
            _set("spec.training.lrSchedule", {"type": "step", "milestones": [30, 30]}),
        ),
        "spec.training.lrSchedule.milestones",
        "must be strictly increasing",
        tags=("recipe",),
    ),
    Case(
        "milestone-beyond-training",
        _both(
            _set("spec.training.epochs", 10),
            _set("spec.training.lrSchedule", {"type": "step", "milestones": [5, 12]}),
        ),
        "spec.training.lrSchedule.milestones",
        "must each be less than training.epochs",
        tags=("recipe",),
    ),
    Case(
        "step-schedule-without-milestones",
        _set("spec.training.lrSchedule", {"type": "step"}),
        "spec.training.lrSchedule.milestones",
        "at least one epoch when type is step",
        tags=("recipe",),
    ),
    Case(
        "schedule-type-enum",
        _set("spec.training.lrSchedule", {"type": "exponential"}),
        "spec.training.lrSchedule.type",
        'Unsupported value: "exponential"',
        pydantic_why="Input should be 'constant'",
        tags=("recipe",),
    ),
    Case(
        "label-smoothing-one",
        _set("spec.training.optimizer", {"labelSmoothing": 1.0}),
        "spec.training.optimizer.labelSmoothing",
        "less than 1",
        tags=("recipe",),
    ),
    Case(
        "label-smoothing-negative",
        _set("spec.training.optimizer", {"labelSmoothing": -0.1}),
        "spec.training.optimizer.labelSmoothing",
        "greater than or equal to 0",
        tags=("recipe",),
    ),
    Case(
        "lr-and-lr-per-256",
        _set("spec.training.optimizer", {"lr": 0.1, "lrPer256": 0.1}),
        "spec.training.optimizer",
        "set training.optimizer.lr or training.optimizer.lrPer256, not both",
        tags=("recipe",),
    ),
    Case(
        "lr-zero",
        _set("spec.training.optimizer", {"lr": 0}),
        "spec.training.optimizer.lr",
        "greater than 0",
        tags=("recipe",),
    ),
    Case(
        "precision-enum",
        _set("spec.training.precision", "fp8"),
        "spec.training.precision",
        'Unsupported value: "fp8"',
        pydantic_why="Input should be 'fp32'",
        tags=("recipe",),
    ),
    Case(
        "augmentation-enum",
        _set("spec.training.augmentation", {"type": "heavy"}),
        "spec.training.augmentation.type",
        'Unsupported value: "heavy"',
        pydantic_why="Input should be 'none'",
        tags=("recipe",),
    ),
    Case(
        "augmentation-flip-bool",
        _set("spec.training.augmentation", {"type": "standard", "horizontalFlip": "sometimes"}),
        "spec.training.augmentation.horizontalFlip",
        "must be of type boolean",
        pydantic_why="Input should be a valid boolean",
        tags=("recipe",),
    ),
    Case(
        "recipe-env-reserved",
        _set(f"{_ENV}.0", {"name": "ETJ_LR", "value": "0.1"}),
        f"{_ENV}[0].name",
        "ETJ_LR is set by the operator",
        tags=("recipe",),
    ),
    # Issue 28: spec.deadline is either an absolute time or a duration from the start, never both.
    Case(
        "deadline-both-forms",
        _set("spec.deadline", {"finishBy": "2026-12-04T17:00:00Z", "withinSeconds": 3600}),
        "spec.deadline",
        "exactly one of deadline.finishBy and deadline.withinSeconds",
    ),
    Case(
        "deadline-neither-form",
        _set("spec.deadline", {"maxOnDemandWorkers": 2}),
        "spec.deadline",
        "exactly one of deadline.finishBy and deadline.withinSeconds",
    ),
    Case(
        "deadline-too-short",
        _set("spec.deadline", {"withinSeconds": 5}),
        "spec.deadline.withinSeconds",
        "greater than or equal to 60",
        pydantic_why="greater than or equal to 60",
    ),
    Case(
        "price-negative",
        _set("spec.prices", {"spotPerHour": -1}),
        "spec.prices.spotPerHour",
        "greater than or equal to 0",
    ),
    Case(
        "name-too-long",
        _set("metadata.name", "n" * 60),
        "metadata.name",
        "at most 48 characters",
        apiserver_only=True,
    ),
]


@dataclass(frozen=True)
class Update:
    """A change to an existing job; ``rejected`` ones must fail naming ``field``/``why``."""

    id: str
    mutate: Callable[[Manifest], None]
    rejected: bool
    field: str = ""
    why: str = ""


UPDATES: list[Update] = [
    Update(
        "global-batch-immutable",
        _set("spec.training.globalBatchSize", 128),
        True,
        "spec.training.globalBatchSize",
        "training.globalBatchSize is immutable",
    ),
    Update(
        "resize-policy-immutable",
        _set("spec.training.resizePolicy", "DynamicSGD"),
        True,
        "spec.training.resizePolicy",
        "training.resizePolicy is immutable",
    ),
    Update(
        "checkpoint-path-immutable",
        _set("spec.checkpoint", {"path": "/elsewhere"}),
        True,
        "spec.checkpoint",
        "checkpoint.pvc, checkpoint.path and checkpoint.uri are immutable",
    ),
    Update(
        "checkpoint-uri-added",
        _set("spec.checkpoint", {"uri": "s3://bucket/job"}),
        True,
        "spec.checkpoint",
        "are immutable",
    ),
    Update(
        "procs-per-worker-immutable",
        _set("spec.trainer.procsPerWorker", 1),  # the same count as the valid job's 1 GPU: allowed ...
        False,
    ),
    Update(
        "gpus-per-pod-immutable",
        _set("spec.trainer.resources.gpu", 2),  # ... but 2 ranks per pod instead of 1 is not
        True,
        "spec.trainer.procsPerWorker",
        "training processes per worker pod",
    ),
    Update(
        "procs-per-worker-changed",
        _both(_set("spec.trainer.resources.gpu", 0), _set("spec.trainer.procsPerWorker", 2)),
        True,
        "spec.trainer.procsPerWorker",
        "are immutable",
    ),
    # Settings every worker of one job must share (issue 15: edits reached only new pods and mixed them).
    *(
        Update(
            f"{path.rsplit('.', 1)[-1]}-immutable", _set(path, value), True, "spec.training", "are immutable"
        )
        for path, value in (
            ("spec.training.seed", 7),
            ("spec.training.epochs", 9),
            ("spec.training.microBatchSize", 8),
            ("spec.training.precision", "bf16"),
            ("spec.training.optimizer", {"lr": 0.5}),
            ("spec.training.lrSchedule", {"type": "cosine"}),
        )
    ),
    *(
        Update(f"trainer-{name}-immutable", _set(path, value), True, "spec.trainer", "are immutable")
        for name, path, value in (
            ("image", "spec.trainer.image", "ghcr.io/etj-dev/etj-trainer:0.2.0"),
            ("env", "spec.trainer.env", [{"name": "ETJ_DATA", "value": "digits-tensor"}]),
            (
                "env-added",
                "spec.trainer.env",
                [{"name": "ETJ_DATA", "value": "digits"}, {"name": "ETJ_MODEL", "value": "resnet18"}],
            ),
            ("args", "spec.trainer.args", ["--verbose"]),
            ("gpu", "spec.trainer.resources.gpu", 2),
            ("volumes", "spec.trainer.volumes", [{"name": "data", "emptyDir": {}}]),
        )
    ),
    Update("image-removed", _delete("spec.trainer.image"), True, "spec.trainer", "are immutable"),
    Update("pull-policy-editable", _set("spec.trainer.imagePullPolicy", "Always"), False),
    # Elastic knobs stay editable: that is what `kubectl scale` and suspend are for.
    Update("max-editable", _set("spec.replicas.max", 2), False),
    Update("suspend-editable", _set("spec.suspend", True), False),
    Update("interval-editable", _set("spec.checkpoint.intervalSteps", 50), False),
    Update("min-editable", _set("spec.replicas.min", 2), False),
    Update("placement-editable", _set("spec.placement.nodeSelector", {"pool": "b"}), False),
]

"""Worker pod pieces of the spec: trainer container, resources, placement on node pools.

Long because: each field carries its CEL rules and documentation (the CRD and docs/api.md are generated
from here); the pass-through Kubernetes schemas live in k8s_schema.py.
"""

from __future__ import annotations

import copy
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints, WithJsonSchema, model_validator

from etj_contract import env as etj_env
from etj_operator.api._base import (
    ABSOLUTE_PATH_RE,
    DNS_LABEL_RE,
    DNS_SUBDOMAIN_RE,
    ENV_NAME_RE,
    ApiModel,
    Matches,
    Quantity,
    cel,
    rules,
    section,
    unchanged,
)
from etj_operator.api.k8s_schema import k8s_schema

DEFAULT_COMMAND = ["etj-train", "worker"]
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
MAX_PROCS_PER_WORKER = 64
PROCS_ABOVE_GPUS = (
    "trainer.procsPerWorker must not be greater than trainer.resources.gpu (one GPU per training process); "
    "use gpu: 0 for CPU processes"
)
# Variables the operator sets on every worker (etj_contract.env.OPERATOR_SET). Users may not override them;
# other ETJ_* names (ETJ_DATA, ETJ_MODEL, ETJ_IMAGE_SIZE, ...) are trainer settings users may pass;
# the recipe (ETJ_LR ... ETJ_VAL_RESIZE) comes from spec.training, so it has one source.
RESERVED_ENV = etj_env.RESERVED_ENV
_RESERVED_CEL = "[" + ", ".join(f"'{n}'" for n in RESERVED_ENV) + "]"


class CapacityType(StrEnum):
    """Kind of node capacity; the operator maps cloud labels (EKS, Karpenter, GKE, AKS) onto these."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"


class PullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


Arg = Annotated[str, StringConstraints(max_length=4096)]
LabelMap = Annotated[
    dict[Annotated[str, StringConstraints(max_length=317)], Annotated[str, StringConstraints(max_length=63)]],
    # propertyNames has no CRD equivalent, so the key length is checked with CEL.
    Field(
        max_length=32,
        json_schema_extra=rules(
            cel("self.all(k, size(k) <= 317)", "node selector label keys must be at most 317 characters")
        ),
    ),
]


class EnvVar(ApiModel):
    """An environment variable of the worker container (same shape as in a pod spec)."""

    model_config = {
        "json_schema_extra": rules(
            cel(
                f"!(self.name in {_RESERVED_CEL})",
                message_expression="'env ' + self.name + ' is set by the operator from the job spec "
                "and cannot be overridden; set the matching spec field instead'",
                field_path=".name",
            ),
            cel(
                "!(has(self.value) && has(self.valueFrom))",
                "an env entry may set value or valueFrom, not both",
            ),
        )
    }

    name: Annotated[
        str,
        StringConstraints(min_length=1, max_length=256),
        Matches(ENV_NAME_RE, "env names may contain only letters, digits, '_', '-' and '.'"),
    ] = Field(
        description="Environment variable name. The ETJ_* names the operator sets from the spec (batch "
        "sizes, replicas, rendezvous, checkpoint) are reserved; other ETJ_* trainer settings are allowed."
    )
    value: Annotated[str, StringConstraints(max_length=32768)] | None = Field(
        default=None, description="Literal value."
    )
    value_from: Annotated[dict[str, Any], WithJsonSchema(k8s_schema("EnvVarSource"))] | None = Field(
        default=None,
        description="A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef), "
        "passed to the worker container unchanged; the apiserver validates it with Kubernetes' own schema.",
    )

    @model_validator(mode="after")
    def _check(self) -> EnvVar:
        if self.name in RESERVED_ENV:
            raise ValueError(
                f"env {self.name} is set by the operator from the job spec and cannot be overridden; "
                "set the matching spec field instead"
            )
        if self.value is not None and self.value_from is not None:
            raise ValueError("an env entry may set value or valueFrom, not both")
        return self


class WorkerResources(ApiModel):
    """Per-worker resources; requests and limits are both set to these values (Guaranteed QoS)."""

    gpu: int = Field(
        default=1,
        ge=0,
        le=64,
        description="GPUs per worker pod (requested as gpuResourceName). Each GPU runs one training process "
        "(trainer.procsPerWorker defaults to it); 0 trains on CPU.",
    )
    gpu_resource_name: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(
        default=DEFAULT_GPU_RESOURCE, description="Extended resource name of the GPU device plugin."
    )
    cpu: Quantity | None = Field(default=None, description="CPU per worker pod, e.g. 8 or 7500m.")
    memory: Quantity | None = Field(default=None, description="Memory per worker pod, e.g. 60Gi.")
    shm_size: Quantity | None = Field(
        default=None,
        description="Size of the memory-backed /dev/shm for data-loader workers; defaults to the operator's "
        "choice (a fraction of memory).",
    )


_VOLUME_RULES = rules(
    cel(
        "!self.name.startsWith('etj-')",
        "volume names starting with etj- are reserved for the operator's own volumes",
        field_path=".name",
    )
)


def _volume_schema(schema: dict[str, Any]) -> None:
    """Kubernetes' own Volume schema (k8s_schema.py) around our ``name`` field and rules."""
    k8s = k8s_schema("Volume")
    schema["properties"] = {**k8s["properties"], "name": schema["properties"]["name"]}
    schema["required"] = ["name"]
    schema.pop("additionalProperties", None)
    schema.update(copy.deepcopy(_VOLUME_RULES))


class Volume(ApiModel):
    """A Kubernetes Volume (a name plus one source: persistentVolumeClaim, csi, ...), passed through."""

    # The volume sources are Kubernetes' own; the CRD carries their real schema (k8s_schema.py), so the
    # apiserver refuses what a pod would refuse. The model keeps them as extra fields, passed through.
    model_config = {"extra": "allow", "json_schema_extra": _volume_schema}

    name: Annotated[
        str,
        StringConstraints(min_length=1, max_length=63),
        Matches(DNS_LABEL_RE, "volume names must be lower-case DNS labels (letters, digits and '-')"),
    ] = Field(
        description="Volume name (a DNS label) referenced by volumeMounts; names starting with etj- are "
        "reserved."
    )

    @model_validator(mode="after")
    def _check(self) -> Volume:
        if self.name.startswith("etj-"):
            raise ValueError("volume names starting with etj- are reserved for the operator's own volumes")
        return self


class VolumeMount(ApiModel):
    """Where a volume appears in the worker container."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=63)] = Field(
        description="Name of a volume in trainer.volumes."
    )
    mount_path: Annotated[
        str,
        StringConstraints(min_length=1, max_length=1024),
        Matches(ABSOLUTE_PATH_RE, "volumeMounts mountPath must be an absolute path"),
    ] = Field(description="Absolute path inside the container.")
    sub_path: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        default=None, description="Directory inside the volume to mount instead of its root."
    )
    read_only: bool = Field(default=False, description="Mount read-only (e.g. a shared dataset).")


def procs_cel(obj: str) -> str:
    """CEL: the training processes per pod of the TrainerSpec ``obj`` (TrainerSpec.procs, with defaults)."""
    gpu = f"(has({obj}.resources) && has({obj}.resources.gpu) ? {obj}.resources.gpu : 1)"
    return f"(has({obj}.procsPerWorker) ? {obj}.procsPerWorker : ({gpu} > 0 ? {gpu} : 1))"


class Launcher(StrEnum):
    """How the workers run the training code (etj_contract.env.LAUNCHERS; docs/porting.md)."""

    ETJ = "Etj"
    TORCHRUN = "Torchrun"


# What every worker of one job must run identically (imagePullPolicy may change).
_FIXED_TRAINER = ("command", "args", "env", "resources", "volumes", "volumeMounts", "launcher")


class TrainerSpec(ApiModel):
    """The container every worker runs."""

    model_config = {
        "json_schema_extra": rules(
            cel(
                # Empty lists are absent (no schema default), hence the has() guards.
                "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
                "self.volumes.exists(v, v.name == m.name))",
                "every trainer.volumeMounts[].name must match the name of an entry in trainer.volumes",
                field_path=".volumeMounts",
            ),
            cel(
                "!has(self.procsPerWorker) || !has(self.resources) || !has(self.resources.gpu) || "
                "self.resources.gpu == 0 || self.procsPerWorker <= self.resources.gpu",
                PROCS_ABOVE_GPUS,
                field_path=".procsPerWorker",
            ),
            cel(
                # Every pod of a job must run the same number of ranks (torch elastic numbers them per pod).
                f"{procs_cel('self')} == {procs_cel('oldSelf')}",
                "the training processes per worker pod (trainer.procsPerWorker, default resources.gpu) are "
                "immutable; create a new job to change them",
                field_path=".procsPerWorker",
            ),
            cel(
                # An image may be set once on a job that has none (one waiting with NoTrainerImage).
                "(!has(oldSelf.image) || (has(self.image) && self.image == oldSelf.image)) && "
                + " && ".join(unchanged(f) for f in _FIXED_TRAINER),
                "trainer.image, command, args, env, resources, volumes, volumeMounts and launcher are "
                "immutable: a "
                "change would reach only the workers started after it and mix two settings in one job; "
                "create a new job to change them",
            ),
        )
    }

    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = Field(
        default=None,
        description="Trainer container image (must contain etj-train unless command is overridden). Unset: "
        "the operator's default trainer image (the chart's trainer.image), recorded in status.trainerImage "
        "when the job first starts so that workers added later run the same image.",
    )
    store_image: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = Field(
        default=None,
        description="Image of the job's rendezvous store pod (etj-train store: torch's TCPStore and the "
        "progress endpoint, no CUDA). Unset: the operator's default store image (the chart's "
        "trainer.storeImage, e.g. the small CPU-only etj-store image), else the trainer image. It must "
        'carry the trainer\'s torch version (docs/operator.md, "Rendezvous store"). Mutable: only a new '
        "store pod runs a changed one.",
    )
    image_pull_policy: PullPolicy = Field(
        default=PullPolicy.IF_NOT_PRESENT, description="Image pull policy of the worker and store containers."
    )
    command: Annotated[list[Arg], Field(min_length=1, max_length=32)] = Field(
        default_factory=lambda: list(DEFAULT_COMMAND),
        description="Entrypoint of the worker container; defaults to etj-train worker, the elastic agent "
        "that runs the training (the built-in trainer, or your own script: see args).",
        json_schema_extra={"default": [*DEFAULT_COMMAND]},
    )
    args: Annotated[list[Arg], Field(max_length=64)] = Field(
        default_factory=list,
        description="Arguments appended to command. With the default command, "
        '["--script", "/workspace/train.py", ...] runs your own training script (written on '
        "etj_trainer.elastic, or a stock torchrun script with launcher Torchrun; in the image or on a "
        "volume) on every rank instead of the built-in trainer; everything after the script's path goes to "
        "it.",
    )
    launcher: Launcher = Field(
        default=Launcher.ETJ,
        description="How the workers run your code (ETJ_LAUNCHER; docs/porting.md). Etj: the built-in "
        "trainer, or a --script written on etj_trainer.elastic; leaves, joins and crashes resize in place "
        "with the global batch fixed and every sample once. Torchrun: a stock torchrun script, unchanged, "
        "run as `torchrun --nnodes=min:max script.py` would (python script.py semantics, torch elastic's "
        "environment, its own init_process_group); every membership change restarts its workers, which "
        "resume from the script's own checkpoint, and the global batch, the sampling and the checkpoints "
        "are the script's (status.resizeMode says Restart).",
    )
    env: Annotated[list[EnvVar], Field(max_length=64)] = Field(
        default_factory=list,
        description="Extra environment for the workers, added after the operator's ETJ_* variables.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    resources: WorkerResources = section(WorkerResources, "Resources of each worker pod.")
    procs_per_worker: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PROCS_PER_WORKER,
        description="Training processes (ranks) per worker pod (ETJ_NPROC_PER_WORKER, torchrun "
        "--nproc-per-node). Unset: resources.gpu, or 1 when gpu is 0; set it with gpu: 0 to run several CPU "
        "processes per pod. Batches and the job's size in ranks count processes: replicas x procsPerWorker. "
        "Immutable, and so is the count it defaults to (resources.gpu).",
    )
    volumes: Annotated[list[Volume], Field(max_length=16)] = Field(
        default_factory=list,
        description="Extra volumes of each worker pod (datasets, caches), Kubernetes Volume objects.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=16)] = Field(
        default_factory=list,
        description="Mounts of trainer.volumes in the worker container.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["mountPath"]},
    )

    service_account_name: (
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=253),
            Matches(
                DNS_SUBDOMAIN_RE,
                "trainer.serviceAccountName must be a lower-case DNS name (letters, digits, '-', '.')",
            ),
        ]
        | None
    ) = Field(
        default=None,
        description="ServiceAccount of the worker pods, in the job's namespace: the identity the trainer "
        "reaches the object store with (IRSA's eks.amazonaws.com/role-arn annotation, an EKS Pod Identity "
        "association). Unset: the namespace's default. The API token itself is still not mounted: the "
        "trainer never calls the Kubernetes API, and IRSA and Pod Identity project their own tokens.",
    )

    @property
    def procs(self) -> int:
        """Training processes (ranks) per worker pod: procsPerWorker, else one per GPU, or one on CPU."""
        return self.procs_per_worker if self.procs_per_worker is not None else max(1, self.resources.gpu)

    @model_validator(mode="after")
    def _check(self) -> TrainerSpec:
        procs, gpus = self.procs_per_worker, self.resources.gpu
        if procs is not None and 0 < gpus < procs:
            raise ValueError(f"{PROCS_ABOVE_GPUS} (procsPerWorker {procs}, gpu {gpus})")
        # The apiserver rejects these duplicates through the list-type=map keys; mirror that here.
        for label, keys in (
            ("trainer.env name", [e.name for e in self.env]),
            ("trainer.volumes name", [v.name for v in self.volumes]),
            ("trainer.volumeMounts mountPath", [m.mount_path for m in self.volume_mounts]),
        ):
            _unique(label, keys)
        names = {v.name for v in self.volumes}
        for mount in self.volume_mounts:
            if mount.name not in names:
                raise ValueError(
                    f"trainer.volumeMounts name {mount.name!r} must match the name of an entry in "
                    "trainer.volumes"
                )
        return self


class Toleration(ApiModel):
    """A Kubernetes toleration (same fields and meaning as in a pod spec)."""

    model_config = {
        "json_schema_extra": rules(
            cel(
                "self.operator != 'Exists' || !has(self.value) || self.value == ''",
                "a toleration with operator Exists must not set value",
                field_path=".value",
            ),
            cel(
                "self.operator == 'Exists' || (has(self.key) && self.key != '')",
                "a toleration with an empty key must use operator Exists",
                field_path=".key",
            ),
        )
    }

    key: Annotated[str, StringConstraints(max_length=317)] | None = Field(
        default=None, description="Taint key; empty with operator Exists matches every taint."
    )
    operator: TolerationOperator = Field(default=TolerationOperator.EQUAL, description="Exists or Equal.")
    value: Annotated[str, StringConstraints(max_length=63)] | None = Field(
        default=None, description="Taint value to match with operator Equal."
    )
    effect: TaintEffect | None = Field(default=None, description="Taint effect to match; empty matches all.")
    toleration_seconds: int | None = Field(
        default=None, ge=0, description="For NoExecute: how long the pod stays bound after the taint appears."
    )

    @model_validator(mode="after")
    def _check(self) -> Toleration:
        if self.operator == TolerationOperator.EXISTS and self.value:
            raise ValueError("a toleration with operator Exists must not set value")
        if self.operator != TolerationOperator.EXISTS and not self.key:
            raise ValueError("a toleration with an empty key must use operator Exists")
        return self


def _unique(label: str, keys: list[str]) -> None:
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise ValueError(f"duplicate {label} {key!r}")
        seen.add(key)


def _unique_capacity(value: list[CapacityType]) -> list[CapacityType]:
    _unique("capacity type", [str(v) for v in value])
    return value


CapacityTypes = Annotated[
    list[CapacityType], Field(min_length=1, max_length=2), AfterValidator(_unique_capacity)
]
# The order is a preference, so the list is atomic (a "set" is unordered for server-side apply) and
# uniqueness is a CEL rule instead.
_CAPACITY_LIST: dict[str, Any] = {
    "x-kubernetes-list-type": "atomic",
    **rules(cel("self.all(c, self.exists_one(d, d == c))", "capacityTypes must not list a value twice")),
}


PriorityClassName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=253),
    Matches(DNS_SUBDOMAIN_RE, "priorityClassName must be a lower-case DNS name"),
]


class RendezvousPlacement(ApiModel):
    """Where the job's rendezvous store pod (TCPStore + progress endpoint) may run."""

    capacity_types: CapacityTypes = Field(
        default_factory=lambda: [CapacityType.ON_DEMAND],
        description="Capacity types the store may run on; on-demand by default so a spot interruption "
        "never takes the store down.",
        json_schema_extra={**_CAPACITY_LIST, "default": [CapacityType.ON_DEMAND.value]},
    )
    node_selector: LabelMap = Field(
        default_factory=dict, description="Extra node selector for the store pod."
    )
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = Field(
        default_factory=list, description="Tolerations of the store pod."
    )
    priority_class_name: PriorityClassName | None = Field(
        default=None,
        description="PriorityClass of the store pod, so that the scheduler does not preempt it for other "
        "work (losing the store costs the job its rendezvous).",
    )


class Placement(ApiModel):
    """Which nodes run the workers and the rendezvous store."""

    capacity_types: CapacityTypes = Field(
        default_factory=lambda: [CapacityType.SPOT, CapacityType.ON_DEMAND],
        description="Capacity types workers may run on, in order of preference (spot first is cheapest).",
        json_schema_extra={**_CAPACITY_LIST, "default": ["spot", "on-demand"]},
    )
    node_selector: LabelMap = Field(
        default_factory=dict, description="Node selector added to every worker pod."
    )
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = Field(
        default_factory=list,
        description="Tolerations added to every worker pod (e.g. nvidia.com/gpu, spot taints).",
    )
    affinity: Annotated[dict[str, Any], WithJsonSchema(k8s_schema("Affinity"))] | None = Field(
        default=None,
        description="A Kubernetes Affinity for worker pods (merged with the operator's capacity-type rule); "
        "the apiserver validates it with Kubernetes' own schema.",
    )
    priority_class_name: PriorityClassName | None = Field(
        default=None,
        description="PriorityClass of the workers that bring the job up to replicas.min: the job's priority "
        "among jobs sharing a pool. Workers beyond min run at the operator's elastic-extra class (lower "
        "than every job's), so another job's min workers preempt them (docs/operator.md, 'Many jobs, one "
        "spot pool'). Unset: the cluster's default priority.",
    )
    rendezvous: RendezvousPlacement = section(RendezvousPlacement, "Placement of the rendezvous store pod.")

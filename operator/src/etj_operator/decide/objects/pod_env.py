"""The environment of a job's pods: the ETJ_* variables of etj_contract.env the operator sets (pure).

A worker's env is the contract between operator and trainer (docs/contract.md): ``worker_env`` fails if
it misses a variable of ``etj_contract.env.OPERATOR_SET``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from etj_contract import env as etj_env
from etj_contract.ports import PROGRESS_PORT, RDZV_PORT
from etj_operator.api.models import ElasticTrainingJobSpec, TrainingSpec
from etj_operator.decide.objects.names import TOKEN_KEY, rendezvous_host

# Grace period for a drained worker: long enough for a just-in-time checkpoint, shorter than the
# 120 s AWS spot notice so the pod is gone before the node is. The spec has no field for it (yet);
# the operator's --worker-grace-seconds flag changes it.
DEFAULT_WORKER_GRACE_SECONDS = 90


def token_env(secret: str) -> dict[str, Any]:
    """ETJ_PROGRESS_TOKEN read from the job's Secret ``secret`` (dataplane.token_secret_name): pods name the
    Secret, never the value."""
    return {
        "name": etj_env.PROGRESS_TOKEN.name,
        "valueFrom": {"secretKeyRef": {"name": secret, "key": TOKEN_KEY}},
    }


def token_secret_of(pod: Mapping[str, Any]) -> str | None:
    """The token Secret a pod's first container names (a pod as a dict); None if it names none. Pods of
    operators before issue 37 name ``names.legacy_token_secret_name``; the token in both is the same."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    for var in containers[0].get("env") or []:
        if var.get("name") == etj_env.PROGRESS_TOKEN.name:
            ref = (var.get("valueFrom") or {}).get("secretKeyRef") or {}
            return ref.get("name") or None
    return None


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
        etj_env.PARALLELISM: training.parallelism.value,
        etj_env.SHARD_GROUP_SIZE: training.shard_group_size or 0,  # 0: unset (not HSDP)
    }


def worker_env(
    spec: ElasticTrainingJobSpec,
    *,
    job: str,
    namespace: str,
    uid: str,
    pod: str,
    token_secret: str,
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
        etj_env.CHECKPOINT_MAX_FAILED_WRITES: spec.checkpoint.max_failed_writes,
        etj_env.TERMINATION_GRACE_SECONDS: grace_seconds,
        etj_env.CHECKPOINT_INTERVAL_STEPS: spec.checkpoint.interval_steps,
        etj_env.PROGRESS_URL: f"http://{host}:{PROGRESS_PORT}/progress",
        etj_env.LAUNCHER: spec.trainer.launcher.value,
        **recipe_env(training),
    }
    # Every variable the contract says the operator sets, in its order (a KeyError here: one is missing).
    env: list[dict[str, Any]] = [
        token_env(token_secret) if v is etj_env.PROGRESS_TOKEN else {"name": v.name, "value": str(values[v])}
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

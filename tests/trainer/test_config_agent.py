"""The worker reads the contract's ETJ_* environment (docs/contract.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from etj_trainer.agent.agent_config import AgentConfig
from etj_trainer.batching.plan import ResizePolicy
from etj_trainer.config import TrainConfig

CONTRACT_ENV = {
    "ETJ_JOB_NAME": "job",
    "ETJ_NAMESPACE": "ns",
    "ETJ_WORKER_ID": "job-worker-3",
    "ETJ_RDZV_ENDPOINT": "job-rdzv:29400",
    "ETJ_RDZV_ID": "uid-1",
    "ETJ_MIN_WORKERS": "2",
    "ETJ_MAX_WORKERS": "8",
    "ETJ_NPROC_PER_WORKER": "4",
    "ETJ_GLOBAL_BATCH_SIZE": "1024",
    "ETJ_MICRO_BATCH_SIZE": "64",
    "ETJ_RESIZE_POLICY": "DynamicSGD",
    "ETJ_DSGD_RAMP_STEPS": "500",
    "ETJ_EPOCHS": "90",
    "ETJ_SEED": "17",
    "ETJ_CHECKPOINT_DIR": "/ckpt",
    "ETJ_CHECKPOINT_INTERVAL_STEPS": "250",
    "ETJ_PROGRESS_URL": "http://job-rdzv:29401/progress",
    "ETJ_CHECKPOINT_URI": "s3://bucket/jobs/job",
    "ETJ_CHECKPOINT_KEEP": "5",
    "ETJ_TERMINATION_GRACE_SECONDS": "120",
}


def test_train_config_from_contract_env() -> None:
    cfg = TrainConfig.from_env(CONTRACT_ENV)
    assert (cfg.global_batch_size, cfg.micro_batch_size, cfg.epochs, cfg.seed) == (1024, 64, 90, 17)
    assert cfg.resize_policy == ResizePolicy.DYNAMIC_SGD and cfg.dsgd_ramp_steps == 500
    assert (cfg.min_workers, cfg.max_workers) == (2, 8)
    assert (cfg.procs_per_worker, cfg.min_ranks) == (4, 8)  # the minimum in ranks: 2 pods x 4 processes
    assert cfg.checkpoint_dir == Path("/ckpt") and cfg.checkpoint_interval_steps == 250
    assert cfg.progress_url == "http://job-rdzv:29401/progress"
    assert cfg.local_checkpoint_dir == Path("/dev/shm/etj-job-uid-1")
    assert cfg.checkpoint_uri == "s3://bucket/jobs/job" and cfg.checkpoint_keep == 5  # a URI, not a Path


def test_no_checkpoint_uri_when_the_operator_sets_it_empty() -> None:
    assert TrainConfig.from_env({**CONTRACT_ENV, "ETJ_CHECKPOINT_URI": ""}).checkpoint_uri is None


@pytest.mark.parametrize(
    ("grace", "timeout"),
    [
        (None, 30),  # no grace known: torch's default
        ("120", 110),  # the pod's grace less the agent's margin (the JIT checkpoint's time)
        ("90", 80),
        ("12", 5),  # never below the floor
    ],
)
def test_the_jit_checkpoint_gets_the_pods_grace_period(grace: str | None, timeout: int) -> None:
    env = {k: v for k, v in CONTRACT_ENV.items() if k != "ETJ_TERMINATION_GRACE_SECONDS"}
    if grace is not None:
        env["ETJ_TERMINATION_GRACE_SECONDS"] = grace
    assert AgentConfig.from_env(env).shutdown_timeout == timeout


def test_processes_per_worker_fall_back_to_torchruns_local_world_size() -> None:
    # `torchrun --nproc-per-node 2 -m etj_trainer.torchrun_entry` sets LOCAL_WORLD_SIZE, not ETJ_NPROC_...
    base = {k: v for k, v in CONTRACT_ENV.items() if k != "ETJ_NPROC_PER_WORKER"}
    assert TrainConfig.from_env({**base, "LOCAL_WORLD_SIZE": "2"}).min_ranks == 4
    assert TrainConfig.from_env(base).procs_per_worker == 1


def test_agent_config_targets_the_external_store() -> None:
    agent = AgentConfig.from_env(CONTRACT_ENV)
    args = agent.torchrun_args()
    assert "--nnodes=2:8" in args and "--nproc-per-node=4" in args
    assert "--rdzv-endpoint=job-rdzv:29400" in args and "--rdzv-id=uid-1" in args
    conf = agent.rdzv_configs()
    assert conf["is_host"] is False  # never host the store in a worker
    assert conf["last_call_timeout"] <= 2 and conf["keep_alive_interval"] <= 2


def test_agent_publishes_the_pod_ip_as_its_address() -> None:
    # Found on kind: without it torch elastic publishes socket.getfqdn() (the pod's hostname) as MASTER_ADDR,
    # other pods cannot resolve it, and init_process_group times out with "1/2 clients joined".
    agent = AgentConfig.from_env({**CONTRACT_ENV, "POD_IP": "10.244.1.5"})
    assert agent.rendezvous_parameters().local_addr == "10.244.1.5"
    assert "--local-addr=10.244.1.5" in agent.torchrun_args()
    assert AgentConfig.from_env(CONTRACT_ENV).rendezvous_parameters().local_addr is None

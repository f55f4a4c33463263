"""The e2e suite's mode switch (tests/e2e/e2econfig.py): local (start the operator, harness and process nodes
here) or installed (the cluster's own operator and nodes, nothing started). The kind workflow depends on the
installed mode, and it cannot run here, so it is checked in two ways: without a cluster (the configuration
and the job that would be submitted) and on the real local control plane (start, submit, interrupt, return
and clean-up go through the API only, and no process or node is created)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from etj_operator.api.models import ElasticTrainingJob
from etj_testbed.demo import local as demo_module
from etj_testbed.demo.cluster import ClusterDemo
from etj_testbed.demo.local import Demo
from etj_testbed.demo.script import SPOT_ITN, Script
from etj_testbed.localcluster.fake_nodes import fake_gpu_node
from etj_testbed.localcluster.proclet.nodes import INSTANCE_LABEL
from tests.chart.test_workflows import kind_sh
from tests.e2e.e2econfig import E2EConfig
from tests.plugins.cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
IMAGE = "ghcr.io/etj-dev/etj-trainer:ci-cpu"


def _manifest() -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    return job


def _kubeconfig(tmp_path: Path) -> Path:
    """A syntactically valid kubeconfig; nothing here connects to it."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def _installed_env(kubeconfig: Path, **extra: str) -> dict[str, str]:
    return {
        "ETJ_E2E_OPERATOR": "installed",
        "ETJ_E2E_KUBECONFIG": str(kubeconfig),
        "ETJ_E2E_TRAINER_IMAGE": IMAGE,
        **extra,
    }


# ---- configuration, no cluster ---------------------------------------------------------------------


def test_default_is_the_local_mode_exactly_as_before(tmp_path: Path) -> None:
    config = E2EConfig.from_env({})
    assert config == E2EConfig()  # local control plane, nothing else set
    assert config.reads_sample_logs
    assert config.run_root().parent.name == "e2e" and "e2e" in str(config.run_root())
    demo = config.demo(_kubeconfig(tmp_path), "ns", tmp_path / "run", _manifest(), Script(), "inst")
    assert type(demo) is Demo  # starts the operator, the harness and process nodes
    other = E2EConfig.from_env({"ETJ_E2E_KUBECONFIG": "/k", "ETJ_E2E_EPOCHS": "3"})
    assert (other.installed, other.kubeconfig, other.epochs) == (False, Path("/k"), 3)


def test_installed_mode_uses_the_given_cluster_and_image_and_starts_nothing(tmp_path: Path) -> None:
    kubeconfig = _kubeconfig(tmp_path)
    config = E2EConfig.from_env(_installed_env(kubeconfig, ETJ_E2E_IMAGE_PULL_POLICY="Never"))
    assert config.installed and config.kubeconfig == kubeconfig and config.trainer_image == IMAGE
    assert not config.reads_sample_logs  # no shared directory: the sample logs stay on the nodes
    demo = config.demo(kubeconfig, "e2e-ns", tmp_path / "run", _manifest(), Script(), "inst")
    assert isinstance(demo, ClusterDemo)
    assert demo.kubeconfig == kubeconfig and demo.procs == [] and demo.nodes == []
    job = demo.job_manifest()
    trainer = job["spec"]["trainer"]
    assert trainer["image"] == IMAGE and trainer["imagePullPolicy"] == "Never"
    assert job["metadata"]["namespace"] == "e2e-ns"
    # Nothing pins the pods to process nodes: the cluster's own nodes run them.
    text = json.dumps(job)
    assert INSTANCE_LABEL not in text and "nodeSelector" not in json.dumps(job["spec"].get("placement"))
    assert "ETJ_SAMPLE_LOG_DIR" not in text and "hostPath" not in text
    ElasticTrainingJob.model_validate(job)  # what the apiserver will be asked to accept


def test_installed_mode_with_a_shared_directory_writes_checkpoints_and_sample_logs_there(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    env = _installed_env(_kubeconfig(tmp_path), ETJ_E2E_SHARED_DIR=str(shared))
    config = E2EConfig.from_env(env)
    assert config.reads_sample_logs and config.run_root().is_relative_to(shared)
    run_dir = config.run_root() / "elastic"
    demo = config.demo(_kubeconfig(tmp_path), "ns", run_dir, _manifest(), Script(), "inst")
    job = ElasticTrainingJob.model_validate(demo.job_manifest())
    trainer = job.spec.trainer
    assert job.spec.checkpoint.path == str(run_dir / "checkpoints")
    env_vars = {e.name: e.value for e in trainer.env}
    assert env_vars["ETJ_SAMPLE_LOG_DIR"] == str(run_dir / "samples")
    (volume,) = trainer.volumes
    assert volume.model_dump(by_alias=True)["hostPath"] == {"path": str(shared), "type": "Directory"}
    assert [(m.name, m.mount_path) for m in trainer.volume_mounts] == [(volume.name, str(shared))]
    with pytest.raises(ValueError, match="inside the shared directory"):
        config.demo(_kubeconfig(tmp_path), "ns", tmp_path / "elsewhere", _manifest(), Script(), "i")


def test_installed_mode_without_an_image_leaves_it_to_the_operators_default(tmp_path: Path) -> None:
    env = _installed_env(_kubeconfig(tmp_path))
    del env["ETJ_E2E_TRAINER_IMAGE"]
    config = E2EConfig.from_env(env)
    demo = config.demo(_kubeconfig(tmp_path), "ns", tmp_path / "run", _manifest(), Script(), "inst")
    job = ElasticTrainingJob.model_validate(demo.job_manifest())
    assert job.spec.trainer.image is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ETJ_E2E_OPERATOR": "installed"}, "needs ETJ_E2E_KUBECONFIG"),
        ({"ETJ_E2E_OPERATOR": "helm"}, "expected one of local, installed"),
        ({"ETJ_E2E_TRAINER_IMAGE": IMAGE}, "only apply with ETJ_E2E_OPERATOR=installed"),
        ({"ETJ_E2E_SHARED_DIR": "/x"}, "only apply with ETJ_E2E_OPERATOR=installed"),
        (
            {
                "ETJ_E2E_OPERATOR": "installed",
                "ETJ_E2E_KUBECONFIG": "/k",
                "ETJ_E2E_IMAGE_PULL_POLICY": "Sometimes",
            },
            "ETJ_E2E_IMAGE_PULL_POLICY",
        ),
    ],
    ids=["installed-without-cluster", "unknown-mode", "image-in-local-mode", "shared-in-local-mode", "pull"],
)
def test_inconsistent_settings_fail_loudly(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        E2EConfig.from_env(env)


# ---- installed mode against the real local control plane -------------------------------------------


def _kind_worker_labels() -> dict[str, dict[str, str]]:
    """The labels scripts/kind.sh (the kind workflow's cluster) gives its CPU workers, by capacity type."""
    config = yaml.safe_load(kind_sh("config"))
    workers = [n["labels"] for n in config["nodes"] if n["role"] == "worker"]
    return {labels["etj.dev/capacity-type"]: labels for labels in workers}


@pytest.fixture
def kind_like_nodes(cluster: Cluster) -> Iterator[dict[str, str]]:
    """Two kwok nodes labelled exactly like the workflow's kind workers (capacity type → node name)."""
    suffix = uuid.uuid4().hex[:5]
    names: dict[str, str] = {}
    # Tainted so that no other test's pods land here; the test's own pods are bound by name.
    taint = {"key": "etj.dev/e2e-config-test", "value": suffix, "effect": "NoSchedule"}
    for ctype, labels in _kind_worker_labels().items():
        name = f"e2ecfg-{ctype}-{suffix}"
        node = fake_gpu_node(name, "on-demand", gpus=2, provider="gke", labels=labels, taints=[taint])
        cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
        names[ctype] = name
    yield names
    for name in names.values():
        cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def _bound_worker(namespace: str, job: str, name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"etj.dev/job": job, "etj.dev/role": "worker"},
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
    }


@pytest.mark.cluster
@pytest.mark.skipif(
    os.environ.get("ETJ_E2E_OPERATOR") == "installed",
    reason="uses the local control plane; this session's e2e cluster is an installed one (kind)",
)
def test_installed_mode_on_a_real_apiserver_goes_through_the_api_only(
    cluster: Cluster, kind_like_nodes: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"installed mode started a process: {args}")

    class NoSubprocess:
        Popen = run = staticmethod(refuse)

    # Neither the harness nor the operator nor kubectl (not even installed on the kind job's runner) may be
    # started: the demo module's own references are replaced (the test's kubectl still works).
    monkeypatch.setattr(demo_module, "start_subprocess", refuse)
    monkeypatch.setattr(demo_module, "subprocess", NoSubprocess)
    namespace = f"e2ecfg-{uuid.uuid4().hex[:5]}"
    config = E2EConfig.from_env(_installed_env(cluster.kubeconfig))
    demo = config.demo(cluster.kubeconfig, namespace, tmp_path / "run", _manifest(), Script(), "e2ecfg")
    assert isinstance(demo, ClusterDemo)
    spot, on_demand = kind_like_nodes["spot"], kind_like_nodes["on-demand"]
    try:
        demo.start()
        demo.submit()
        job = json.loads(cluster.kubectl("get", "etj", "demo-cpu", "-n", namespace, "-o", "json").stdout)
        assert job["spec"]["trainer"]["image"] == IMAGE  # accepted by the real apiserver as submitted
        cluster.wait_for(
            f"default ServiceAccount in {namespace}",
            lambda: cluster.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0,
        )
        # The interruption victim is a spot node hosting a worker, by the operator's own node-pool rules.
        for i, node in enumerate((spot, on_demand)):
            pod = _bound_worker(namespace, "demo-cpu", f"w{i}", node)
            cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
        assert demo.spot_worker_nodes() == [spot]
        demo.interrupt(spot)
        tainted = _node(cluster, spot)
        assert tainted["spec"]["unschedulable"] is True
        assert SPOT_ITN in {t["key"] for t in tainted["spec"]["taints"]}
        demo.end_of_notice(spot, drained=True)
        assert _node(cluster, spot)["spec"]["unschedulable"] is True  # still there: nothing is deleted
        demo.return_capacity(spot, 3)
        back = _node(cluster, spot)
        assert not back["spec"].get("unschedulable")
        assert [t["key"] for t in back["spec"]["taints"]] == ["etj.dev/e2e-config-test"]  # others' kept
        # An interrupted node is restored by the clean-up too, whatever the run reached.
        demo.interrupt(on_demand)
    finally:
        demo.cleanup(delete_job=True)
        monkeypatch.undo()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    assert not _node(cluster, on_demand)["spec"].get("unschedulable")
    assert SPOT_ITN not in {t["key"] for t in _node(cluster, on_demand)["spec"].get("taints") or []}
    assert demo.procs == [] and demo.nodes == []  # no process started, no node created
    assert cluster.kubectl("get", "nodes", "-l", f"{INSTANCE_LABEL}=e2ecfg", "-o", "name").stdout == ""
    left = cluster.kubectl("get", "etj", "-n", namespace, "-o", "json").stdout
    assert all(j["metadata"].get("deletionTimestamp") for j in json.loads(left)["items"])


def _node(cluster: Cluster, name: str) -> dict[str, Any]:
    node: dict[str, Any] = json.loads(cluster.kubectl("get", "node", name, "-o", "json").stdout)
    return node

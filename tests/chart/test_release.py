"""The release (issue 38): scripts/release.sh's chart step run for real with the real helm (packaged, linted,
rendered), and the tag workflow checked statically, since the public registry and Sigstore's log cannot be
reached here. The whole path (images built, pushed to a registry, `helm install oci://...` with the nodes
pulling) runs on kind: tests/kind/test_release.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from etj_testbed.localcluster import toolchain
from tests.chart.helmbed import REPO, helm_bin

RELEASE_SH = REPO / "scripts" / "release.sh"
WORKFLOW = REPO / ".github" / "workflows" / "release.yaml"
DIGEST = {name: "sha256:" + f"{i}" * 64 for i, name in enumerate(("operator", "store", "cpu", "cuda"), 1)}


def release(*args: str, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = f"{Path(helm_bin()).parent}:{os.environ['PATH']}"
    return subprocess.run(
        [str(RELEASE_SH), *args],
        env={**os.environ, "PATH": path, "ETJ_RELEASE_PUSH": "0", "ETJ_RELEASE_KEEP": str(tmp), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def digests(tmp: Path, cuda: bool = True) -> Path:
    path = tmp / "digests.txt"
    lines = [
        f"operator=reg.example:5000/etj/etj-operator@{DIGEST['operator']}",
        f"store=reg.example:5000/etj/etj-store@{DIGEST['store']}",
        f"trainer-cpu=reg.example:5000/etj/etj-trainer@{DIGEST['cpu']}",
    ]
    if cuda:
        lines.append(f"trainer-cuda=reg.example:5000/etj/etj-trainer@{DIGEST['cuda']}")
    path.write_text("\n".join(lines) + "\n")
    return path


def rendered(chart: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [helm_bin(), "template", "etj", str(chart), "--namespace", "etj-system"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize("cuda", [True, False], ids=["with the CUDA trainer", "CPU trainer only"])
def test_the_released_chart_names_its_version_and_every_image_by_digest(tmp_path: Path, cuda: bool) -> None:
    done = release(
        "chart", tmp=tmp_path, VERSION="1.2.3", REGISTRY="reg.example:5000/etj",
        ETJ_RELEASE_DIGESTS=str(digests(tmp_path, cuda)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "not pushed" in done.stderr and not done.stdout.strip()
    chart = tmp_path / "etj-1.2.3.tgz"
    shown = yaml.safe_load(
        subprocess.run([helm_bin(), "show", "chart", str(chart)], capture_output=True, text=True).stdout
    )
    assert (shown["version"], shown["appVersion"]) == ("1.2.3", "1.2.3")
    container = operator_container(rendered(chart))
    assert container["image"] == f"reg.example:5000/etj/etj-operator@{DIGEST['operator']}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    trainer = DIGEST["cuda"] if cuda else DIGEST["cpu"]  # GPU nodes run the CUDA image where there is one
    assert env["ETJ_DEFAULT_TRAINER_IMAGE"] == f"reg.example:5000/etj/etj-trainer@{trainer}"
    assert env["ETJ_DEFAULT_STORE_IMAGE"] == f"reg.example:5000/etj/etj-store@{DIGEST['store']}"
    # The CRD travels in the package (charts/etj/files/crd.yaml links outside the chart: copied, not linked).
    assert any(d["kind"] == "CustomResourceDefinition" for d in rendered(chart))
    # The released values keep their comments (`helm show values` is what a user reads).
    values = subprocess.run([helm_bin(), "show", "values", str(chart)], capture_output=True, text=True).stdout
    assert "# The default trainer image" in values and DIGEST["operator"] in values


BAD = [
    ("no version", {"REGISTRY": "r/etj"}, "VERSION=x.y.z"),
    ("a version that is not semver", {"VERSION": "v1.2", "REGISTRY": "r/etj"}, "VERSION=x.y.z"),
    ("no registry", {"VERSION": "1.2.3"}, "REGISTRY="),
    ("no digests file", {"VERSION": "1.2.3", "REGISTRY": "r/etj"}, "ETJ_RELEASE_DIGESTS"),
]


@pytest.mark.parametrize(("case", "env", "says"), BAD, ids=[b[0] for b in BAD])
def test_a_release_without_what_it_needs_is_refused_with_the_reason(
    tmp_path: Path, case: str, env: dict[str, str], says: str
) -> None:
    done = release("chart", tmp=tmp_path, **{"VERSION": "", "REGISTRY": "", **env})
    assert done.returncode != 0 and says in done.stderr, (case, done.stderr)
    assert not list(tmp_path.glob("*.tgz"))


def test_the_make_target_runs_the_script_with_the_version_and_registry() -> None:
    makefile = (REPO / "Makefile").read_text()
    target = makefile[makefile.index("\nrelease:") :].split("\n\n")[0]
    assert "scripts/release.sh all" in target, target


# ---- the tag workflow: what cannot run here, checked statically --------------------------------------------


def workflow() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return data


def test_the_workflow_releases_from_a_version_tag_only() -> None:
    on = workflow()[True]  # YAML 1.1 reads the key `on` as True
    assert on == {"push": {"tags": ["v*.*.*"]}}
    assert workflow()["permissions"] == {"contents": "read"}  # each job asks for what it needs


def test_every_image_is_built_with_provenance_and_sbom_and_signed_keyless_by_digest() -> None:
    job = workflow()["jobs"]["images"]
    assert job["permissions"]["id-token"] == "write" and job["permissions"]["packages"] == "write"
    names = {leg["name"] for leg in job["strategy"]["matrix"]["include"]}
    assert names == {"operator", "store", "trainer-cpu", "trainer-cuda"}
    for leg in job["strategy"]["matrix"]["include"]:
        assert (REPO / leg["file"]).is_file(), leg
    build = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("docker/build-push-action"))
    assert build["with"]["push"] is True and build["with"]["sbom"] is True
    assert str(build["with"]["provenance"]).startswith("mode=")
    sign = next(s for s in job["steps"] if "cosign sign" in s.get("run", ""))
    assert "@${{ steps.build.outputs.digest }}" in sign["env"]["IMAGE"]  # by digest, never by tag
    assert "--key" not in sign["run"]  # keyless: GitHub's OIDC token


def test_the_chart_job_runs_the_same_script_as_make_release_and_signs_the_chart() -> None:
    job = workflow()["jobs"]["chart"]
    assert job["needs"] == "images" and job["permissions"]["id-token"] == "write"
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "./scripts/release.sh chart" in runs and "cosign sign --yes" in runs
    assert workflow()["env"]["HELM_VERSION"] == toolchain.HELM_VERSION
    for name, job in workflow()["jobs"].items():
        assert 0 < job["timeout-minutes"] <= 90, name

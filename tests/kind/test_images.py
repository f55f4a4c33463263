"""etj's images as a kubelet runs them: the numeric user the chart sets, HOME and caches on /tmp, a read-only
root filesystem, and (the whole kind suite) the CUDA trainer image building and importing its stack.

The operator and CPU trainer images are the ones `scripts/kind.sh up` built for the cluster (the `kind`
fixture); the CUDA image is built by `scripts/kind.sh cuda-image` from trainer-image/Dockerfile with only
its base changed (torch's PyPI wheels carry their CUDA libraries; the driver would come from the host).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.kind.kindbed import KIND_SH, KindBed

pytestmark = [pytest.mark.kind]

OPERATOR_IMAGE = "ghcr.io/etj-dev/etj-operator:dev"
CUDA_IMAGE = "ghcr.io/etj-dev/etj-trainer:dev"
CUDA_BUILD_GB = 20


def docker_run(image: str, *command: str, user: str) -> subprocess.CompletedProcess[str]:
    """Run as the chart's pods do: that numeric user, a read-only root filesystem, a writable /tmp only,
    no capabilities."""
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp", "--user", user,
         "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--entrypoint", command[0], image,
         *command[1:]],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


STACK = (
    "import getpass, os, torch, torchvision, nvidia.dali, etj_trainer; "
    "print(getpass.getuser(), os.environ['HOME'], torch.__version__, torch.cuda.is_available())"
)


def test_the_cpu_trainer_image_runs_as_its_user_on_a_read_only_root(kind: KindBed) -> None:
    out = docker_run(kind.trainer_image, "python", "-c", STACK, user="1000:1000")
    assert out.returncode == 0, out.stderr
    user, home, _torch, cuda = out.stdout.split()
    assert (user, home, cuda) == ("etj", "/tmp", "False"), out.stdout
    help_ = docker_run(kind.trainer_image, "etj-train", "--help", user="1000:1000")
    assert help_.returncode == 0 and "worker" in help_.stdout, help_.stderr


NO_CUDA = (
    "import importlib.util, os, torch; "
    "lib = os.path.join(os.path.dirname(torch.__file__), 'lib'); "
    "cuda = [n for n in os.listdir(lib) if 'cuda' in n] if os.path.isdir(lib) else []; "
    "print(torch.version.cuda, importlib.util.find_spec('triton') is not None, len(cuda))"
)
CPU_IMAGE_MAX_GB = 3


def test_the_cpu_trainer_image_carries_no_cuda_when_built_from_debian(kind: KindBed) -> None:
    """Found by CI: a worker node ran out of disk while unpacking the 7 GB CPU image built from PyPI's CUDA
    torch (three workers, three copies). Offline, scripts/kind.sh builds Dockerfile.cpu-debian instead: no
    CUDA build of torch, no CUDA libraries, no triton, a fraction of the size."""
    inspect = subprocess.run(
        ["docker", "image", "inspect", "-f",
         '{{.Size}} {{index .Config.Labels "org.opencontainers.image.description"}}', kind.trainer_image],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    size, description = inspect.stdout.strip().split(" ", 1)
    if "torch from Debian" not in description:
        pytest.skip(f"{kind.trainer_image} is built from PyPI ({description}): Debian's torch is not the pin")
    out = docker_run(kind.trainer_image, "python", "-c", NO_CUDA, user="1000:1000")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "False", "0"], out.stdout
    assert int(size) < CPU_IMAGE_MAX_GB * 1e9, f"{int(size) / 1e9:.1f} GB"


def test_the_operator_image_runs_as_its_user_on_a_read_only_root(kind: KindBed) -> None:
    probe = "import getpass, os, kopf, etj_operator; print(getpass.getuser(), os.environ['HOME'])"
    out = docker_run(OPERATOR_IMAGE, "python", "-c", probe, user="65532:65532")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["etj", "/tmp"], out.stdout


# Headers under site-packages/nvidia, static libraries anywhere in site-packages, and whether a C compiler
# is on PATH.
LEFT_FOR_A_COMPILER = (
    "import os, shutil, sysconfig; site = sysconfig.get_paths()['purelib']; "
    "print(sum(os.path.basename(d) == 'include' for d, _, _ in os.walk(os.path.join(site, 'nvidia'))), "
    "sum(f.endswith('.a') for _, _, fs in os.walk(site) for f in fs), "
    "any(shutil.which(c) for c in ('nvcc', 'gcc', 'cc')))"
)


@pytest.mark.slow
@pytest.mark.kind_full
def test_the_cuda_trainer_image_builds_and_imports_its_stack(kind: KindBed) -> None:
    root = subprocess.run(
        ["docker", "info", "-f", "{{.DockerRootDir}}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    free_gb = shutil.disk_usage(root).free / 1e9
    inspect = ["docker", "image", "inspect", CUDA_IMAGE]
    built_before = subprocess.run(inspect, capture_output=True).returncode == 0
    # Built before, the build is docker's layer cache and needs no room; the image is checked either way.
    if free_gb < CUDA_BUILD_GB and not built_before:
        # Its wheels and the installed stack, beside a running cluster's three copies of the CPU image.
        pytest.skip(f"the CUDA image build needs {CUDA_BUILD_GB} GB free under {root}; {free_gb:.0f} GB are")
    built = subprocess.run([str(KIND_SH), "cuda-image"], capture_output=True, text=True, timeout=3600)
    assert built.returncode == 0, built.stderr[-4000:]
    out = docker_run(CUDA_IMAGE, "python", "-c", STACK, user="1000:1000")
    assert out.returncode == 0, out.stderr
    user, home, torch_version, cuda = out.stdout.split()
    # No GPU here: the CUDA build of torch imports and reports none.
    assert (user, home, cuda) == ("etj", "/tmp", "False") and torch_version.startswith("2."), out.stdout
    # Trimmed (trainer-image/Dockerfile): no C headers or static libraries of the CUDA wheels, which only a
    # compiler would read and the image has none.
    left = docker_run(CUDA_IMAGE, "python", "-c", LEFT_FOR_A_COMPILER, user="1000:1000")
    assert left.returncode == 0 and left.stdout.split() == ["0", "0", "False"], (left.stdout, left.stderr)
    help_ = docker_run(CUDA_IMAGE, "etj-train", "--help", user="1000:1000")
    assert help_.returncode == 0 and "worker" in help_.stdout, help_.stderr
    size = subprocess.run([*inspect, "-f", "{{.Size}}"], capture_output=True, text=True, check=True).stdout
    print(f"{CUDA_IMAGE}: {int(size) / 1e9:.2f} GB")

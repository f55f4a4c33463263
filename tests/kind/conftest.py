"""The kind cluster of `make kind` (scripts/kind.sh), for the tests that need a real kubelet.

The `kind` fixture brings the cluster up (`scripts/kind.sh up`: cached images, a registry, a control plane,
one on-demand and two spot CPU workers), installs the chart (`scripts/kind.sh install`) and hands the tests
its kubeconfig. Without Docker the tests are skipped with the reason printed (pytest -ra): Docker is what
the kind path needs and nothing else in `make test` does; `make e2e-kind` installs it (docs/install-kind.md).

`make test` runs the smoke test only (tests/kind/test_smoke.py); the rest is marked ``kind_full`` and runs
under `make e2e-kind` (ETJ_KIND_FULL=1), which also runs tests/e2e in its installed mode on this cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kind.kindbed import KIND_SH, KindBed


def why_no_kind(env: dict[str, str] | None = None) -> str | None:
    """Why the kind tests cannot run here, or None when they can."""
    env = dict(os.environ) if env is None else env
    if env.get("ETJ_KIND") == "0":
        return "ETJ_KIND=0"
    if shutil.which("docker") is None or shutil.which("dockerd") is None:
        return "Docker is not installed (`make e2e-kind` installs it and runs them; docs/install-kind.md)"
    if os.geteuid() != 0 and subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "the Docker daemon is not reachable and only root may start it (scripts/kind.sh)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = why_no_kind()
    full = os.environ.get("ETJ_KIND_FULL") == "1"
    for item in items:
        if not Path(str(item.fspath)).is_relative_to(here):
            continue
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"kind: {reason}"))
        elif item.get_closest_marker("kind_full") and not full:
            item.add_marker(pytest.mark.skip(reason="kind: the full suite runs under `make e2e-kind`"))


def kind_script(command: str, log: Path | None = None) -> str:
    """Run `scripts/kind.sh COMMAND`; its progress goes to ``log`` (default: the kind cache's
    logs/pytest-kind.log); returns its stdout."""
    log = log or _log()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as err:
        done = subprocess.run(
            [str(KIND_SH), command], stdout=subprocess.PIPE, stderr=err, text=True, timeout=3 * 3600
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        pytest.fail(f"scripts/kind.sh {command} failed ({done.returncode}); the end of {log}:\n{tail}")
    return done.stdout


def _log() -> Path:
    from etj_testbed.localcluster.toolchain import cache_root

    return cache_root() / "kind" / "logs" / "pytest-kind.log"


@pytest.fixture(scope="session")
def kind() -> Iterator[KindBed]:
    kubeconfig = Path(kind_script("up").strip().splitlines()[-1])
    kind_script("install")
    bed = KindBed.connect(kubeconfig)
    try:
        yield bed
    finally:
        bed.close()

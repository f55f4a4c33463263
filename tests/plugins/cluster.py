"""pytest fixtures for the real local control plane: one cluster per session, one namespace per test.

Nothing here mocks Kubernetes: `cluster` starts (or reuses) real etcd, kube-apiserver, controller-manager,
scheduler and kwok processes through `etj cluster up`, and installs `crds/` with the real kubectl.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    kubeconfig: Path
    kubectl_bin: str

    def api_client(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.kubectl_bin, "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def token_kubeconfig(self, token: str, path: Path) -> Path:
        """A kubeconfig that authenticates with `token` only (no admin client certificate) at `path`."""
        admin = yaml.safe_load(self.kubeconfig.read_text())
        admin["users"] = [{"name": "token", "user": {"token": token}}]
        admin["contexts"][0]["context"]["user"] = "token"
        path.write_text(yaml.safe_dump(admin))
        path.chmod(0o600)
        return path

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float = 60) -> None:
        """Poll `predicate` until true; fail with `what` after `timeout` seconds (convergence, not speed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _etj(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "etj_testbed.cli", *args], capture_output=True, text=True, timeout=3600
    )


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    from etj_testbed.localcluster import toolchain
    from etj_testbed.localcluster.cluster import LocalCluster
    from etj_testbed.localcluster.crds import wait_established

    local = LocalCluster.named()
    was_running = local.healthy()
    up = _etj("cluster", "up")
    if up.returncode != 0:
        pytest.fail(f"`etj cluster up` failed:\n{up.stderr[-4000:]}")
    kubeconfig = Path(up.stdout.strip().splitlines()[-1])
    bed = Cluster(kubeconfig, str(toolchain.binary("kubectl")))
    crds = REPO / "crds"
    if any(crds.glob("*.yaml")):
        bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
        wait_established(lambda *a: bed.kubectl(*a).stdout, "crd")
    try:
        yield bed
    finally:
        if not was_running and not os.environ.get("ETJ_KEEP_CLUSTER"):
            _etj("cluster", "down")


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    # The ServiceAccount admission plugin refuses pods until the namespace's default SA exists.
    cluster.wait_for(
        f"default ServiceAccount in {name}",
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)

"""The built store image (trainer-image/Dockerfile.store, `scripts/kind.sh store-image`) serves a job: its
``etj-train store`` (Debian's CPU torch, no libuv) answers TCPStore clients of the trainer's torch (this
venv's PyPI build) with either client transport, and the token-guarded progress endpoint. Skipped where
there is no Docker engine or the image was not built (a torch version mismatch skips building it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta

import pytest

from etj_contract.ports import PROGRESS_PORT, RDZV_PORT
from tests.chart.test_images import trainer_pins

IMAGE = os.environ.get("ETJ_STORE_IMAGE", "ghcr.io/etj-dev/etj-store:dev")
TOKEN = "t0ken"


def _docker(*args: str) -> str:
    return subprocess.run(
        ["docker", *args], check=True, capture_output=True, text=True, timeout=120
    ).stdout.strip()


def _image_present() -> bool:
    if shutil.which("docker") is None:
        return False
    return (
        subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, check=False).returncode
        == 0
    )


pytestmark = pytest.mark.skipif(
    not _image_present(), reason=f"no Docker engine or no {IMAGE} (scripts/kind.sh store-image)"
)


def _healthy(ip: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{ip}:{PROGRESS_PORT}/healthz", timeout=1) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@pytest.fixture(scope="module")
def store_ip() -> Iterator[str]:
    """The store pod's command in the image, as the pod runs it: non-root, read-only root, /tmp writable."""
    pod = ["--read-only", "--tmpfs", "/tmp", "--user", "1000:1000", "-e", f"ETJ_PROGRESS_TOKEN={TOKEN}"]
    cid = _docker("run", "-d", *pod, IMAGE, "etj-train", "store", "--host", "0.0.0.0")
    try:
        ip = _docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", cid)
        deadline = time.monotonic() + 60
        while not _healthy(ip):
            assert time.monotonic() < deadline, _docker("logs", cid)
            time.sleep(0.1)
        yield ip
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)


def test_the_images_torch_is_the_trainers_pin() -> None:
    out = _docker("run", "--rm", IMAGE, "python3", "-c", "import torch; print(torch.__version__)")
    assert out.split("+")[0] == trainer_pins()["torch"], out


def test_the_store_command_pulls_in_no_trainer_dependency() -> None:
    heavy = "{'torchvision', 'nvidia', 'PIL', 'sklearn', 'minio'}"
    probe = (
        "import sys; from etj_trainer.service import store_server; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy}))"
    )
    assert _docker("run", "--rm", IMAGE, "python3", "-c", probe) == "[]"


@pytest.mark.parametrize("use_libuv", [True, False], ids=["libuv-client", "classic-client"])
def test_a_trainer_torch_client_uses_the_store(store_ip: str, use_libuv: bool) -> None:
    from torch.distributed import TCPStore

    c = TCPStore(
        store_ip,
        RDZV_PORT,
        is_master=False,
        wait_for_workers=False,
        use_libuv=use_libuv,
        timeout=timedelta(seconds=10),
    )
    key = f"k-{use_libuv}"
    c.set(key, "v1")
    assert c.get(key) == b"v1"
    assert c.add(f"n-{use_libuv}", 3) == 3 and c.add(f"n-{use_libuv}", 4) == 7
    assert c.compare_set(key, "v1", "v2") == b"v2"
    c.wait([key], timedelta(seconds=5))
    assert c.check([key])
    c.set(f"a-{use_libuv}", "1")
    c.set(f"b-{use_libuv}", "2")
    assert c.multi_get([f"a-{use_libuv}", f"b-{use_libuv}"]) == [b"1", b"2"]
    assert c.delete_key(key) and not c.check([key])


def test_the_progress_endpoint_wants_the_token(store_ip: str) -> None:
    url = f"http://{store_ip}:{PROGRESS_PORT}/progress"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 401
    body = json.dumps({"step": 3}).encode()
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=auth), timeout=5) as r:
        assert r.status == 204
    with urllib.request.urlopen(urllib.request.Request(url, headers=auth), timeout=5) as r:
        assert json.loads(r.read())["step"] == 3

"""A release installed as a user installs one (issue 38): `make release` to the registry on the kind network,
then `helm upgrade --install oci://...` with the chart's default pull policy, so every node pulls the
operator, store and trainer images from the registry by the digests the chart names (every other kind test
runs images pushed into the nodes, never pulled). The demo job then trains on the released operator with
its default trainer image. The dev install is put back afterwards (`scripts/kind.sh install`).

kind_full (`make e2e-kind`): it builds and pushes the release's images (from Docker's layer cache after
`make kind`, but still minutes) and its job trains for a few minutes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from etj_testbed.demo.script import Script
from tests.e2e.e2econfig import E2EConfig
from tests.kind.kindbed import KIND_SH, REPO, KindBed, wait_for

pytestmark = [pytest.mark.kind, pytest.mark.kind_full, pytest.mark.slow]

RELEASE, NAMESPACE = "etj", "etj-system"  # scripts/kind.sh's release, which this one replaces for a while
PUSH_TO, PULL_FROM = "127.0.0.1:5001/etj", "etj-registry:5000/etj"  # this machine's and the nodes' names
JSON = dict[str, Any]


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 3600) -> str:
    done = subprocess.run(
        argv, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
    return done.stdout


def pulled(kind: KindBed, namespace: str, pod: str) -> list[tuple[str, float]]:
    """The kubelet's "Successfully pulled image X in Ns" Events of ``pod``: (image, seconds)."""
    out = []
    for event in kind.events(namespace, pod):
        found = re.search(r'Successfully pulled image "([^"]+)" in ([0-9.]+)(m?s)', event.get("message", ""))
        if found:
            seconds = float(found.group(2)) / (1000 if found.group(3) == "ms" else 1)
            out.append((found.group(1), seconds))
    return out


def release_env(version: str, keep: Path) -> dict[str, str]:
    """What `make release` (scripts/release.sh) is given to release ``version`` to the kind registry."""
    return {
        "VERSION": version,
        "REGISTRY": PUSH_TO,
        "PULL_REGISTRY": PULL_FROM,
        "ETJ_RELEASE_IMAGES": "operator store trainer-cpu",  # kind's nodes never run the 7 GB CUDA image
        "ETJ_HELM_PLAIN_HTTP": "1",
        "ETJ_RELEASE_KEEP": str(keep),
    }


def image_ids(pod: JSON) -> list[str]:
    return [c.get("imageID", "") for c in (pod.get("status") or {}).get("containerStatuses") or []]


def test_a_release_installed_from_the_registry_trains_the_demo_job_with_every_image_pulled(
    kind: KindBed, tmp_path: Path
) -> None:
    version = f"0.0.0-kind.{uuid.uuid4().hex[:8]}"  # tags no node has ever seen
    t0 = time.monotonic()
    chart = (
        run(["make", "--no-print-directory", "release"], release_env(version, tmp_path))
        .strip()
        .splitlines()[-1]
    )
    release_s = time.monotonic() - t0
    assert chart == f"oci://{PUSH_TO}/charts/etj", chart
    label = '{{index .Config.Labels "org.opencontainers.image.version"}}'
    for image in ("etj-operator", "etj-store"):
        # The version label gives a release's image an ID of its own: the kubelet's pull records are per
        # image ID, and with the dev image's ID it refused the dev image preloaded for pull policy Never.
        assert (
            run(["docker", "image", "inspect", "-f", label, f"{PUSH_TO}/{image}:{version}"]).strip()
            == version
        )
    try:
        t1 = time.monotonic()
        run(
            [
                "helm", "upgrade", "--install", RELEASE, chart, "--version", version, "--plain-http",
                "--namespace", NAMESPACE, "--values", str(KIND_SH.parent / "kind" / "operator-values.yaml"),
                "--kubeconfig", str(kind.kubeconfig), "--wait", "--timeout", "10m",
            ],
            timeout=900,
        )  # fmt: skip
        install_s = time.monotonic() - t1
        values = json.loads(
            run(["helm", "get", "values", RELEASE, "-n", NAMESPACE, "--all", "-o", "json",
                 "--kubeconfig", str(kind.kubeconfig)])
        )  # fmt: skip
        operator_ref = f"{values['image']['repository']}@{values['image']['digest']}"
        trainer_ref, store_ref = values["trainer"]["image"], values["trainer"]["storeImage"]
        for ref in (operator_ref, trainer_ref, store_ref):
            assert ref.startswith(PULL_FROM + "/") and "@sha256:" in ref, ref
        assert values["image"]["pullPolicy"] == "IfNotPresent"  # the chart's default: the nodes pull

        def operator_pods() -> list[JSON]:
            pods = kind.pods(NAMESPACE, f"app.kubernetes.io/instance={RELEASE}")
            ready = [
                p for p in pods if image_ids(p) and all(operator_ref.split("@")[1] in i for i in image_ids(p))
            ]
            return ready if ready and len(ready) == len(pods) else []

        pods = wait_for("the released operator's pods running its digest", operator_pods, 300)
        pulls = {p["metadata"]["name"]: pulled(kind, NAMESPACE, p["metadata"]["name"]) for p in pods}

        # The demo job with no spec.trainer.image: the released chart's default trainer, pulled by digest.
        config = E2EConfig(
            installed=True, kubeconfig=kind.kubeconfig, trainer_image=None, pull_policy="IfNotPresent",
            shared_dir=kind.shared_dir, epochs=2,
        )  # fmt: skip
        from tests.e2e.e2econfig import demo_job

        manifest = demo_job()
        manifest["spec"]["replicas"] = {"min": 1, "max": 2}
        run_dir = config.run_root() / f"release-{version}"
        demo = config.demo(
            kind.kubeconfig, f"kind-release-{version[-8:]}", run_dir, manifest,
            Script(interrupt_epoch=10**6, timeout_s=1500), f"rel{version[-6:]}",
        )  # fmt: skip
        demo.start()
        try:
            result = demo.run()
            job_pods = kind.pods(demo.ns, f"etj.dev/job={demo.name}")
            for pod in job_pods:
                pulls[pod["metadata"]["name"]] = pulled(kind, demo.ns, pod["metadata"]["name"])
        finally:
            demo.cleanup(delete_job=True)
        status = result.status.get("status") or {}
        assert result.phase == "Succeeded", (status.get("conditions"), run_dir)
        assert status.get("trainerImage") == trainer_ref, status.get("trainerImage")
        pulled_refs = {ref.split("@")[0] for events in pulls.values() for ref, _ in events}
        # Every image came from the registry by the kubelet's own pull (an Event per node that had none).
        for ref in (operator_ref, trainer_ref, store_ref):
            assert ref.split("@")[0] in pulled_refs, (ref, pulls)
        report = {
            "version": version,
            "release_s": round(release_s, 1),
            "helm_install_s": round(install_s, 1),
            "pulls": {pod: [[ref, s] for ref, s in events] for pod, events in pulls.items() if events},
        }
        print("release on kind:", json.dumps(report, indent=1))
        (kind.shared_dir / "release-pulls.json").write_text(json.dumps(report, indent=1))
    finally:
        # The dev install again (images pushed into the nodes, pull policy Never), as the other tests expect.
        run([str(KIND_SH), "install"], timeout=900)

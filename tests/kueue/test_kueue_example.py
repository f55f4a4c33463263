"""examples/kueue against the real Kueue v0.17.0 and the CRD on the bed: every object of queues.yaml and
the queued job pass the apiserver's schemas and Kueue's validating webhooks (a server-side dry run: nothing
is created, so no other test's Kueue sees these queues). How the operator reads them is
tests/operator/test_kueue_example.py."""

from __future__ import annotations

from pathlib import Path

from tests.kueue.conftest import Kueue

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kueue"


def test_the_kueue_example_passes_kueues_schemas_and_webhooks(kueue: Kueue) -> None:
    kubectl = kueue.cluster.kubectl
    kubectl("create", "namespace", "ml-team", check=False)  # the example's; a dry run needs it to exist
    try:
        for name in ("queues.yaml", "job.yaml"):
            out = kubectl(
                "apply", "-n", "ml-team", "--dry-run=server", "-f", str(EXAMPLE / name), check=False
            )
            assert out.returncode == 0, (name, out.stderr)
            assert "(server dry run)" in out.stdout, out.stdout
        # A broken one is refused by the same path: a ClusterQueue flavor without its covered resources.
        broken = (
            (EXAMPLE / "queues.yaml")
            .read_text()
            .replace(
                'coveredResources: ["nvidia.com/gpu", "cpu", "memory"]',
                'coveredResources: ["nvidia.com/gpu"]',
            )
        )
        out = kubectl("apply", "--dry-run=server", "-f", "-", input=broken, check=False)
        assert out.returncode != 0 and "ClusterQueue" in out.stderr + out.stdout, (out.stdout, out.stderr)
    finally:
        kubectl("delete", "namespace", "ml-team", "--wait=false", check=False)

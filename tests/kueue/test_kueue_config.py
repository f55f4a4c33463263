"""The pure parts of the bed's Kueue: its Configuration, the webhook rewrite and the one-line main.go patch.

No build and no cluster: these run everywhere, also where ETJ_KUEUE=0 skips the end-to-end test.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from etj_testbed.localcluster import kueue_build
from etj_testbed.localcluster.components import PORT_OFFSETS as CONTROL_PLANE_OFFSETS
from etj_testbed.localcluster.components import Layout, ports_from_base
from etj_testbed.localcluster.errors import ClusterError
from etj_testbed.localcluster.kueue import (
    MUTATING,
    PORT_OFFSETS,
    VALIDATING,
    configuration,
    ports_for,
    webhook_configurations,
)

MANIFESTS = """---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-batch-v1-job}
  failurePolicy: Fail
  name: mjob.kb.io
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-apps-v1-deployment}
  failurePolicy: Fail
  name: mdeployment.kb.io
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate-kueue-x-k8s-io-v1beta2-clusterqueue}
  failurePolicy: Fail
  name: vclusterqueue.kb.io
  sideEffects: None
"""


def test_ports_follow_the_cluster_base_and_miss_the_control_plane() -> None:
    ports = ports_for(Layout(Path("/x"), ports_from_base(20000)))
    assert (ports.webhook, ports.health, ports.metrics) == (20070, 20071, 20072)
    assert not set(PORT_OFFSETS.values()) & set(CONTROL_PLANE_OFFSETS.values())


def test_configuration_is_loopback_only_with_no_internal_certs(tmp_path: Path) -> None:
    ports = ports_for(Layout(tmp_path, ports_from_base(18400)))
    config = configuration(ports, tmp_path / "certs", namespace_label="etj.dev/kueue=enabled")
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["manageJobsWithoutQueueName"] is False
    assert config["internalCertManagement"] == {"enable": False}
    assert set(config["integrations"]["frameworks"]) >= {"batch/job", "pod"}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 18470, "certDir": str(tmp_path / "certs")}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:18471"
    assert config["metrics"]["bindAddress"] == "127.0.0.1:18472"
    assert config["managedJobsNamespaceSelector"] == {"matchLabels": {"etj.dev/kueue": "enabled"}}
    elastic = configuration(ports, tmp_path, feature_gates={"ElasticJobsViaWorkloadSlices": True})
    assert elastic["featureGates"] == {"VisibilityOnDemand": False, "ElasticJobsViaWorkloadSlices": True}


def test_webhooks_point_at_loopback_by_url_and_keep_only_served_paths() -> None:
    docs = webhook_configurations(MANIFESTS, "https://127.0.0.1:18470", b"CA", "etj.dev/kueue=enabled")
    mutating, validating = docs
    assert mutating["metadata"]["name"] == MUTATING and validating["metadata"]["name"] == VALIDATING
    assert [h["name"] for h in mutating["webhooks"]] == ["mjob.kb.io"]  # deployments: integration off
    job = mutating["webhooks"][0]
    assert job["clientConfig"] == {
        "url": "https://127.0.0.1:18470/mutate-batch-v1-job",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert job["namespaceSelector"] == {"matchLabels": {"etj.dev/kueue": "enabled"}}
    cq = validating["webhooks"][0]
    assert cq["clientConfig"]["url"].endswith("/validate-kueue-x-k8s-io-v1beta2-clusterqueue")
    assert "namespaceSelector" not in cq  # Kueue's own kinds are not scoped
    unscoped = webhook_configurations(MANIFESTS, "https://127.0.0.1:1", b"CA")[0]["webhooks"][0]
    assert unscoped["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "kueue-system"]


def test_the_main_go_patch_is_exact_or_fails_loudly() -> None:
    source = 'func main() {\n\t\tmetricsCertPath := "/etc/kueue/metrics/certs"\n}\n'
    patched = kueue_build.patched_main(source)
    assert "metricsCertPath := etjMetricsCertPath()" in patched
    assert 'os.Getenv("KUEUE_METRICS_CERT_DIR")' in patched
    with pytest.raises(ClusterError, match="needs updating"):
        kueue_build.patched_main("func main() {}\n")


def test_the_cache_is_keyed_by_version_under_the_beds_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ETJ_CACHE_DIR", str(tmp_path))
    assert kueue_build.home().parent == tmp_path
    assert kueue_build.home().name.startswith(f"kueue-{kueue_build.KUEUE_VERSION}-")
    assert not kueue_build.is_built()

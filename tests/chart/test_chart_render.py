"""The Helm chart, rendered by the real helm binary and parsed: what it creates, with which permissions and
security settings, and which values it refuses. No cluster needed (tests/chart/test_chart_install.py
installs it for real).
"""

from __future__ import annotations

import hashlib
import shlex
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from etj_operator.api.models import CapacityType
from etj_operator.k8s.main import build_state, parse_args
from tests.chart.helmbed import (
    CHART,
    CRD_SOURCE,
    KUBE_VERSION,
    REPO,
    documented_permissions,
    find,
    helm,
    one,
    rbac_file,
    render,
    restricted_violations,
    rule_triples,
    template_error,
    value_args,
)

JSON = dict[str, Any]
NS = "etj-system"


def _operator_container(objs: list[JSON]) -> JSON:
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    container: JSON = pod["containers"][0]
    return container


def _operator_flags(objs: list[JSON]) -> Any:
    """The rendered command line, parsed by the operator's own argument parser: a flag the chart passes
    that the operator does not know fails here, not in a crash-looping pod."""
    container = _operator_container(objs)
    assert container["command"] == ["etj", "operator", "run"]
    try:
        return parse_args(container["args"])
    except SystemExit as exc:  # argparse exits on unknown or malformed flags
        raise AssertionError(f"the operator rejects the chart's args {container['args']}") from exc


# ---- lint and the object set -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["watchNamespaces={team-a,team-b}", "metrics.serviceMonitor.enabled=true", "crds.install=false"],
        ["metrics.enabled=false", "serviceAccount.create=false", "serviceAccount.name=existing"],
    ],
    ids=["defaults", "namespaced-servicemonitor-nocrd", "nometrics-own-sa"],
)
def test_helm_lint_strict_passes(sets: list[str]) -> None:
    result = helm("lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, *value_args(sets=sets))
    assert "0 chart(s) failed" in result.stdout, result.stdout


def test_default_render_creates_exactly_the_operator_objects() -> None:
    objs = render()
    got = sorted((o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objs)
    assert got == [
        ("ClusterRole", "etj", None),
        ("ClusterRoleBinding", "etj", None),
        ("CustomResourceDefinition", "elastictrainingjobs.etj.dev", None),
        ("Deployment", "etj", NS),
        ("PodDisruptionBudget", "etj", NS),
        ("PriorityClass", "etj-elastic-extra", None),
        ("Role", "etj-leader-election", NS),
        ("RoleBinding", "etj-leader-election", NS),
        ("Secret", "etj-token-key", NS),
        ("Service", "etj-metrics", NS),
        ("ServiceAccount", "etj", NS),
    ]
    for obj in objs:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/instance"] == "etj"


# ---- the Deployment --------------------------------------------------------------------------------


def test_deployment_is_two_replicas_electing_a_leader_with_the_chart_service_account() -> None:
    objs = render()
    deploy = one(objs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    # One leads, one stands by: a rolling update may overlap them, never taking both away.
    assert deploy["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    args = _operator_flags(objs)
    assert args.leader_elect and (args.lease_seconds, args.renew_seconds, args.retry_seconds) == (15, 10, 2)
    env = {e["name"]: e for e in _operator_container(objs)["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # the Lease holder
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    # The Lease only, only in the release namespace.
    role = one(objs, "Role", "etj-leader-election")
    assert role["metadata"]["namespace"] == NS and role["rules"] == rbac_file()["leaderElection"]
    binding = one(objs, "RoleBinding", "etj-leader-election")
    assert binding["roleRef"]["name"] == "etj-leader-election"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "etj", "namespace": NS}]
    pod = deploy["spec"]["template"]
    selector = deploy["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    # The operator's worker pods carry app.kubernetes.io/name=etj too; component keeps them out.
    assert selector["app.kubernetes.io/component"] == "operator"
    sa = one(objs, "ServiceAccount")
    assert pod["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    assert pod["spec"]["automountServiceAccountToken"] is True


def test_a_single_replica_without_leader_election_is_recreated_and_has_no_pdb() -> None:
    objs = render({"replicaCount": 1, "leaderElection": {"enabled": False}})
    deploy = one(objs, "Deployment")
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
    assert not _operator_flags(objs).leader_elect
    assert not find(objs, "PodDisruptionBudget") and not find(objs, "Role")


def test_more_than_one_replica_without_leader_election_is_refused() -> None:
    error = template_error({"replicaCount": 2, "leaderElection": {"enabled": False}})
    assert "needs leaderElection.enabled" in error


def test_operator_pod_is_pod_security_restricted_with_tmp_on_an_empty_dir() -> None:
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["containers"][0]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HOME"] == "/tmp"  # a read-only root: anything writing to $HOME lands on the emptyDir


def test_the_checker_itself_flags_each_restricted_violation() -> None:
    """The restricted checker must not pass everything: loosen one setting at a time and see it flagged."""
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    loosenings = {
        "privileged": lambda p: p["containers"][0]["securityContext"].update(privileged=True),
        "allowPrivilegeEscalation": lambda p: p["containers"][0]["securityContext"].update(
            allowPrivilegeEscalation=True
        ),
        "capabilities": lambda p: p["containers"][0]["securityContext"].update(capabilities={}),
        "runAsNonRoot": lambda p: (
            p["securityContext"].pop("runAsNonRoot"),
            p["containers"][0]["securityContext"].pop("runAsNonRoot"),
        ),
        "seccomp": lambda p: (
            p["securityContext"].pop("seccompProfile"),
            p["containers"][0]["securityContext"].pop("seccompProfile"),
        ),
        "hostPath": lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "hostNetwork": lambda p: p.update(hostNetwork=True),
        "readOnlyRootFilesystem": lambda p: p["containers"][0]["securityContext"].update(
            readOnlyRootFilesystem=False
        ),
    }
    for what, loosen in loosenings.items():
        copy = yaml.safe_load(yaml.safe_dump(pod))
        loosen(copy)
        assert restricted_violations(copy), f"{what} not flagged"


def test_security_context_cannot_be_loosened_from_values() -> None:
    err = template_error(sets=["podSecurityContext.runAsUser=0"])
    assert "/podSecurityContext/runAsUser" in err
    err = template_error(values={"securityContext": {"privileged": True}})
    assert "securityContext" in err and "not allowed" in err


def test_every_rendered_flag_is_one_the_operator_accepts() -> None:
    args = _operator_flags(render())
    assert args.all_namespaces is True and args.namespace == []
    assert (args.metrics_port, args.liveness_port) == (9090, 8080)
    assert (args.resync_seconds, args.progress_seconds, args.worker_grace_seconds) == (30.0, 10.0, 90)
    assert args.default_capacity_type == "on-demand"


def test_node_pool_label_overrides_reach_the_operators_capacity_rules() -> None:
    values = {
        "nodePools": {
            "spotLabels": {"node.example.com/lifecycle": "spot", "pool-kind": "preemptible"},
            "onDemandLabels": {"node.example.com/lifecycle": "normal"},
            "defaultCapacityType": "spot",
        }
    }
    args = _operator_flags(render(values))
    rules = build_state(args).rules
    assert set(rules.extra) == {
        ("node.example.com/lifecycle", "spot", CapacityType.SPOT),
        ("pool-kind", "preemptible", CapacityType.SPOT),
        ("node.example.com/lifecycle", "normal", CapacityType.ON_DEMAND),
    }
    assert rules.default == CapacityType.SPOT


def test_operator_tuning_values_become_flags() -> None:
    values = {
        "operator": {
            "resyncSeconds": 5,
            "progressSeconds": 0,
            "workerGraceSeconds": 60,
            "livenessPort": 18080,
            "verbose": True,
            "extraEnv": [{"name": "EXTRA", "value": "1"}],
        },
        "metrics": {"port": 19090},
    }
    objs = render(values)
    args = _operator_flags(objs)
    assert (args.resync_seconds, args.progress_seconds, args.worker_grace_seconds) == (5.0, 0.0, 60)
    assert (args.metrics_port, args.liveness_port, args.verbose) == (19090, 18080, True)
    container = _operator_container(objs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"healthz": 18080, "metrics": 19090}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert {"name": "EXTRA", "value": "1"} in container["env"]
    service = one(objs, "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 19090, "targetPort": "metrics", "protocol": "TCP"}
    ]


def test_default_trainer_image_and_operator_image_values(monkeypatch: pytest.MonkeyPatch) -> None:
    objs = render({"trainer": {"image": "registry.example.com/etj-trainer:1.2.3"}})
    container = _operator_container(objs)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ETJ_DEFAULT_TRAINER_IMAGE"] == "registry.example.com/etj-trainer:1.2.3"
    # The operator, started with the pod's variable and args, uses it for jobs without an image.
    monkeypatch.setenv("ETJ_DEFAULT_TRAINER_IMAGE", env["ETJ_DEFAULT_TRAINER_IMAGE"])
    settings = build_state(_operator_flags(objs)).settings
    monkeypatch.delenv("ETJ_DEFAULT_TRAINER_IMAGE")
    assert settings.default_trainer_image == "registry.example.com/etj-trainer:1.2.3"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert container["image"] == f"ghcr.io/etj-dev/etj-operator:{chart['appVersion']}"
    digest = "sha256:" + "a" * 64
    pinned = _operator_container(render({"image": {"repository": "r.example.com/op", "digest": digest}}))
    assert pinned["image"] == f"r.example.com/op@{digest}"


def test_store_image_value_reaches_the_operators_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """chart trainer.storeImage -> ETJ_DEFAULT_STORE_IMAGE -> Settings.default_store_image (issue 26); the
    default (empty) sets no variable: the stores run the jobs' trainer image, as before."""
    monkeypatch.delenv("ETJ_DEFAULT_STORE_IMAGE", raising=False)
    default_env = {e["name"] for e in _operator_container(render({}))["env"]}
    assert "ETJ_DEFAULT_STORE_IMAGE" not in default_env
    objs = render({"trainer": {"storeImage": "registry.example.com/etj-store:2.14.1"}})
    env = {e["name"]: e.get("value") for e in _operator_container(objs)["env"]}
    assert env["ETJ_DEFAULT_STORE_IMAGE"] == "registry.example.com/etj-store:2.14.1"
    monkeypatch.setenv("ETJ_DEFAULT_STORE_IMAGE", env["ETJ_DEFAULT_STORE_IMAGE"])
    settings = build_state(_operator_flags(objs)).settings
    assert settings.default_store_image == "registry.example.com/etj-store:2.14.1"


def test_network_policy_value_and_the_operators_identity_reach_its_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objs = render()
    container = _operator_container(objs)
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    secret = one(objs, "Secret")
    ref = env["ETJ_OPERATOR_TOKEN_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": secret["metadata"]["name"], "key": "key"} and secret["data"]["key"]
    monkeypatch.setenv("POD_NAMESPACE", NS)
    settings = build_state(_operator_flags(objs)).settings
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    # The jobs' policies admit the operator's own pods: its namespace and its selector labels.
    assert settings.network_policy and settings.operator_namespace == NS
    assert dict(settings.operator_pod_labels).items() <= pod_labels.items()
    assert dict(settings.operator_pod_labels)["app.kubernetes.io/component"] == "operator"
    off = build_state(_operator_flags(render({"networkPolicy": {"enabled": False}}))).settings
    assert not off.network_policy


def test_network_policy_enforced_reaches_the_operator() -> None:
    """networkPolicy.enforced (issue 37 item 5): unknown by default (each job gets a Warning), as declared"""
    from etj_operator.decide.objects.netpol import Enforced

    assert build_state(_operator_flags(render())).settings.network_policy_enforced == Enforced.UNKNOWN
    for value, expected in [(True, Enforced.TRUE), ("false", Enforced.FALSE), ("unknown", Enforced.UNKNOWN)]:
        flags = _operator_flags(render({"networkPolicy": {"enforced": value}}))
        assert build_state(flags).settings.network_policy_enforced == expected


def test_the_chart_can_forbid_host_path_volumes() -> None:
    """security.forbidHostPath (issue 37 item 5) reaches the operator as --forbid-host-path; off by default"""
    assert not build_state(_operator_flags(render())).settings.forbid_host_path
    on = build_state(_operator_flags(render({"security": {"forbidHostPath": True}}))).settings
    assert on.forbid_host_path


# ---- RBAC ------------------------------------------------------------------------------------------


def test_rbac_file_is_exactly_the_documented_operator_permissions() -> None:
    rules = rbac_file()
    assert (
        rule_triples(
            rules["cluster"]
            + rules["namespaced"]
            + rules["leaderElection"]
            + rules["kueueCluster"]
            + rules["kueueNamespaced"]
        )
        == documented_permissions()
    )


def test_all_namespaces_mode_binds_one_cluster_role_with_exactly_the_rbac_file() -> None:
    objs = render()
    role = one(objs, "ClusterRole")
    rules = rbac_file()
    assert role["rules"] == rules["cluster"] + rules["namespaced"]
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "etj",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "etj", "namespace": NS}]
    # The only Role is the leader election's, in the release namespace (the next test).
    assert [r["metadata"]["name"] for r in find(objs, "Role") + find(objs, "RoleBinding")] == [
        "etj-leader-election"
    ] * 2


def test_rbac_has_no_wildcards_no_secret_reads_and_no_writes_beyond_what_the_operator_does() -> None:
    for objs in (render(), render({"watchNamespaces": ["a", "b"]})):
        rules = [r for o in objs if o["kind"] in ("ClusterRole", "Role") for r in o["rules"]]
        for rule in rules:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], rule
            assert not rule.get("nonResourceURLs") and not rule.get("resourceNames"), rule
        triples = rule_triples(rules)
        resources = {r for _, r, _ in triples}
        assert not resources & {"configmaps", "serviceaccounts", "roles", "rolebindings"}
        # Secrets: the jobs' token Secrets are created, never read back (tokens and the Secrets' names are
        # derived from the operator's key: a 409 on one is the operator's own, issue 37).
        assert {v for _, r, v in triples if r == "secrets"} == {"create"}
        writes = {(r, v) for _, r, v in triples if v not in ("get", "list", "watch")}
        assert writes == {
            ("pods", "create"),
            ("pods", "delete"),
            ("services", "create"),
            ("services", "patch"),  # the store Service's selector: the serving store (store_move.py)
            ("secrets", "create"),
            ("networkpolicies", "create"),
            ("poddisruptionbudgets", "create"),
            ("events", "create"),
            ("events", "patch"),
            ("elastictrainingjobs", "delete"),
            ("elastictrainingjobs/status", "patch"),
            ("leases", "create"),  # leader election: the operator's own Lease
            ("leases", "update"),
        }


def test_kueue_enabled_adds_the_kueue_rules_and_the_flag() -> None:
    rules = rbac_file()
    objs = render({"kueue": {"enabled": True}})
    role = one(objs, "ClusterRole")
    assert (
        role["rules"]
        == rules["cluster"] + rules["kueueCluster"] + rules["namespaced"] + rules["kueueNamespaced"]
    )
    assert _operator_flags(objs).kueue
    namespaced = render({"kueue": {"enabled": True}, "watchNamespaces": ["team-a"]})
    team = next(r for r in find(namespaced, "Role") if r["metadata"]["name"] == "etj")
    assert team["rules"] == rules["namespaced"] + rules["kueueNamespaced"]
    assert one(namespaced, "ClusterRole")["rules"] == rules["cluster"] + rules["kueueCluster"]
    # Off by default: no Kueue rule, no flag.
    assert not _operator_flags(render()).kueue
    assert all("kueue.x-k8s.io" not in r["apiGroups"] for r in one(render(), "ClusterRole")["rules"])


def test_watch_namespaces_grants_namespaced_rules_only_there() -> None:
    objs = render({"watchNamespaces": ["team-a", "team-b"]})
    rules = rbac_file()
    assert one(objs, "ClusterRole")["rules"] == rules["cluster"]
    roles = {r["metadata"]["namespace"]: r for r in find(objs, "Role") if r["metadata"]["name"] == "etj"}
    assert set(roles) == {"team-a", "team-b"}
    for role in roles.values():
        assert role["rules"] == rules["namespaced"]
    bindings = {
        b["metadata"]["namespace"]: b for b in find(objs, "RoleBinding") if b["metadata"]["name"] == "etj"
    }
    assert set(bindings) == {"team-a", "team-b"}
    for binding in bindings.values():
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "etj", "namespace": NS}]
    args = _operator_flags(objs)
    assert args.namespace == ["team-a", "team-b"] and not args.all_namespaces


def test_rbac_change_rolls_the_operator_pod() -> None:
    # The checksum annotation is what restarts the pod when the rules change on upgrade.
    # It is the sha256 of the rules file itself (files/rbac.yaml), so editing a rule changes it.
    annotations = one(render(), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    rules = (CHART / "files" / "rbac.yaml").read_bytes()
    assert annotations["checksum/rbac"] == hashlib.sha256(rules).hexdigest()


# ---- the CRD ---------------------------------------------------------------------------------------


def test_chart_crd_is_a_link_to_the_single_generated_source() -> None:
    link = CHART / "files" / "crd.yaml"
    assert link.is_symlink(), "charts/etj/files/crd.yaml must be a symlink to crds/, never a copy"
    assert link.resolve() == CRD_SOURCE.resolve()


def _strip_chart_metadata(crd: JSON) -> JSON:
    crd = yaml.safe_load(yaml.safe_dump(crd))
    meta = crd["metadata"]
    meta.pop("annotations", None)
    meta["labels"] = {k: v for k, v in meta["labels"].items() if not k.startswith(("helm.sh/", "app.kuber"))}
    return crd


def test_rendered_crd_is_the_generated_crd_plus_helm_metadata_with_keep_policy() -> None:
    source = yaml.safe_load(CRD_SOURCE.read_text())
    crd = one(render(), "CustomResourceDefinition")
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert _strip_chart_metadata(crd) == _strip_chart_metadata(source)
    # Emitted as text, not re-serialised: integer bounds stay integers (toYaml would make them floats).
    raw = helm(
        "template", "etj", str(CHART), "--kube-version", KUBE_VERSION, "--show-only", "templates/crd.yaml"
    ).stdout
    assert "e+" not in raw
    assert raw.split("\nspec:\n", 1)[1] == CRD_SOURCE.read_text().split("\nspec:\n", 1)[1]


def test_the_token_key_outlives_helm_uninstall_like_the_jobs_it_serves() -> None:
    # Jobs outlive `helm uninstall` (the CRD is kept); a reinstall must read their progress with the same
    # key, so the chart keeps the key too and adopts it on the next install (docs/install-eks.md).
    key = one(render(), "Secret")
    assert key["metadata"]["name"] == "etj-token-key"
    assert key["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_crd_toggle_and_keep_policy_are_values() -> None:
    assert not find(render({"crds": {"install": False}}), "CustomResourceDefinition")
    crd = one(render({"crds": {"keep": False}}), "CustomResourceDefinition")
    assert "annotations" not in crd["metadata"]


def test_packaged_chart_carries_the_crd_content_not_a_link(tmp_path: Path) -> None:
    helm("package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("etj-*.tgz")
    with tarfile.open(archive) as tar:
        member = tar.getmember("etj/files/crd.yaml")
        assert member.isfile()
        data = tar.extractfile(member)
        assert data is not None and data.read().decode() == CRD_SOURCE.read_text()


# ---- metrics ---------------------------------------------------------------------------------------


def test_metrics_service_selects_only_the_operator_pod_and_service_monitor_is_optional() -> None:
    objs = render()
    service = one(objs, "Service")
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "operator"
    assert not find(objs, "ServiceMonitor")
    monitored = render(
        {"metrics": {"serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}}}}
    )
    monitor = one(monitored, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]


def test_metrics_disabled_means_no_service_and_no_listener() -> None:
    objs = render({"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}})
    assert not find(objs, "Service") and not find(objs, "ServiceMonitor")
    assert _operator_flags(objs).metrics_port == 0


# ---- values.schema.json ----------------------------------------------------------------------------

BAD_VALUES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("unknown top-level key", {"replicas": 2}, ["additional properties 'replicas' not allowed"]),
    ("no replicas", {"replicaCount": 0}, ["/replicaCount", "minimum"]),
    ("unknown leader election key", {"leaderElection": {"lease": 5}}, ["'lease' not allowed"]),
    ("unknown nested key", {"operator": {"resync": 5}}, ["/operator", "'resync' not allowed"]),
    ("zero grace", {"operator": {"workerGraceSeconds": 0}}, ["/operator/workerGraceSeconds", "minimum"]),
    ("grace as string", {"operator": {"workerGraceSeconds": "90"}}, ["/operator/workerGraceSeconds"]),
    ("negative resync", {"operator": {"resyncSeconds": -1}}, ["/operator/resyncSeconds"]),
    (
        "capacity type",
        {"nodePools": {"defaultCapacityType": "preemptible"}},
        ["/nodePools/defaultCapacityType", "'on-demand', 'spot'"],
    ),
    ("label key with a space", {"nodePools": {"spotLabels": {"bad key": "x"}}}, ["'bad key'"]),
    ("label value too odd", {"nodePools": {"spotLabels": {"lifecycle": "-spot"}}}, ["/nodePools/spotLabels"]),
    ("namespace name", {"watchNamespaces": ["Team_A"]}, ["/watchNamespaces/0", "'Team_A'"]),
    ("namespace list as string", {"watchNamespaces": "team-a"}, ["/watchNamespaces", "want array"]),
    ("pull policy", {"image": {"pullPolicy": "Sometimes"}}, ["/image/pullPolicy"]),
    ("digest", {"image": {"digest": "sha256:abc"}}, ["/image/digest"]),
    ("root user", {"podSecurityContext": {"runAsUser": 0}}, ["/podSecurityContext/runAsUser"]),
    ("port range", {"metrics": {"port": 70000}}, ["/metrics/port", "maximum"]),
    ("crds.install type", {"crds": {"install": "yes"}}, ["/crds/install", "want boolean"]),
    ("scrape interval", {"metrics": {"serviceMonitor": {"interval": "often"}}}, ["/metrics/serviceMonitor"]),
    ("extra arg not a flag", {"operator": {"extraArgs": ["rm -rf"]}}, ["/operator/extraArgs/0"]),
    ("trainer image empty", {"trainer": {"image": ""}}, ["/trainer/image"]),
    (
        "extra class name",
        {"sharing": {"extraPriorityClass": {"name": "Extra"}}},
        ["/sharing/extraPriorityClass"],
    ),
    (
        "extra class value",
        {"sharing": {"extraPriorityClass": {"value": "-10"}}},
        ["/sharing/extraPriorityClass"],
    ),
    ("store image with a space", {"trainer": {"storeImage": "etj store:1"}}, ["/trainer/storeImage"]),
]


@pytest.mark.parametrize(("values", "expected"), [c[1:] for c in BAD_VALUES], ids=[c[0] for c in BAD_VALUES])
def test_schema_rejects_bad_values_naming_the_field(values: dict[str, Any], expected: list[str]) -> None:
    err = template_error(values)
    assert "values don't meet the specifications of the schema" in err
    for fragment in expected:
        assert fragment in err, err


def test_schema_accepts_every_documented_knob() -> None:
    values = {
        "image": {"repository": "registry.example.com:5000/etj/op", "tag": "v0.1.0-rc.1"},
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}},
        "nodePools": {"spotLabels": {"example.com/lifecycle": "Ec2Spot"}},
        "operator": {"extraArgs": ["--verbose"]},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": 1}},
        "nodeSelector": {"eks.amazonaws.com/capacityType": "ON_DEMAND"},
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "priorityClassName": "system-cluster-critical",
    }
    deploy = one(render(values), "Deployment")["spec"]["template"]["spec"]
    assert deploy["nodeSelector"] == {"eks.amazonaws.com/capacityType": "ON_DEMAND"}
    assert deploy["priorityClassName"] == "system-cluster-critical"
    assert deploy["imagePullSecrets"] == [{"name": "regcred"}]


def test_chart_does_not_hardcode_this_repository_paths() -> None:
    # A packaged chart is used far from this checkout: templates must not point into it.
    for path in (CHART / "templates").iterdir():
        assert str(REPO) not in path.read_text(), path


def test_install_eks_doc_helm_command_renders() -> None:
    """The `helm install` users copy from docs/install-eks.md passes the schema and does what it says."""
    text = (REPO / "docs" / "install-eks.md").read_text()
    block = text.split("helm install etj charts/etj", 1)[1].split("\n\n", 1)[0].split("kubectl", 1)[0]
    words = shlex.split(
        block.replace("$REGISTRY", "123456789012.dkr.ecr.us-west-2.amazonaws.com"), comments=True
    )
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    assert sets, block
    objs = render(sets=sets)
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"eks.amazonaws.com/nodegroup": "system-on-demand"}
    assert pod["containers"][0]["image"].startswith(
        "123456789012.dkr.ecr.us-west-2.amazonaws.com/etj-operator:"
    )


def test_prices_and_deadline_values_reach_the_operators_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """chart prices.* / deadline.* -> ETJ_PRICE_* / ETJ_ON_DEMAND_STARTUP_SECONDS / ETJ_RESIZE_SECONDS ->
    Settings (issue 28)."""
    default_env = {e["name"]: e.get("value") for e in _operator_container(render({}))["env"]}
    assert default_env["ETJ_PRICE_ON_DEMAND"] == "3.06" and default_env["ETJ_PRICE_SPOT"] == "0.918"
    assert "p3.2xlarge" in default_env["ETJ_PRICE_SOURCE"]  # the default prices name their source
    values = {
        "prices": {"spotPerWorkerHour": 1.5, "onDemandPerWorkerHour": 4.0, "source": "our 2026 contract"},
        "deadline": {"onDemandStartupSeconds": 240, "resizeSeconds": 12.5},
    }
    objs = render(values)
    env = {e["name"]: e.get("value") for e in _operator_container(objs)["env"]}
    for name in (
        "ETJ_PRICE_SPOT",
        "ETJ_PRICE_ON_DEMAND",
        "ETJ_PRICE_SOURCE",
        "ETJ_ON_DEMAND_STARTUP_SECONDS",
        "ETJ_RESIZE_SECONDS",
    ):
        monkeypatch.setenv(name, env[name])
    settings = build_state(_operator_flags(objs)).settings
    assert (settings.prices.spot, settings.prices.on_demand) == (1.5, 4.0)
    assert settings.prices.source == "our 2026 contract"
    assert settings.deadline_costs.on_demand_startup_s == 240.0
    assert settings.deadline_costs.resize_s == 12.5


def test_sharing_creates_the_extra_priority_class_and_the_operator_uses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sharing.* -> a PriorityClass below every job's that never preempts, and ETJ_EXTRA_PRIORITY_CLASS ->
    Settings.extra_priority_class (docs/operator.md, "Many jobs, one spot pool")."""
    objs = render({})
    pc = one(objs, "PriorityClass")
    assert (pc["value"], pc["preemptionPolicy"], pc["globalDefault"]) == (-10, "Never", False)
    env = {e["name"]: e.get("value") for e in _operator_container(objs)["env"]}
    monkeypatch.setenv("ETJ_EXTRA_PRIORITY_CLASS", env["ETJ_EXTRA_PRIORITY_CLASS"])
    assert build_state(_operator_flags(objs)).settings.extra_priority_class == "etj-elastic-extra"

    # A class managed elsewhere: named, not created.
    objs = render({"sharing": {"extraPriorityClass": {"name": "spot-extras", "create": False}}})
    assert find(objs, "PriorityClass") == []
    env = {e["name"]: e.get("value") for e in _operator_container(objs)["env"]}
    assert env["ETJ_EXTRA_PRIORITY_CLASS"] == "spot-extras"

    # Off: no class, and every worker runs at its job's priority (first come, first served).
    objs = render({"sharing": {"enabled": False}})
    assert find(objs, "PriorityClass") == []
    assert "ETJ_EXTRA_PRIORITY_CLASS" not in {e["name"] for e in _operator_container(objs)["env"]}
    monkeypatch.delenv("ETJ_EXTRA_PRIORITY_CLASS")
    assert build_state(_operator_flags(objs)).settings.extra_priority_class is None

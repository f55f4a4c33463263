"""`helm install` into the real local control plane, with the operator running from the installed Deployment.

The operator pod is bound by the real scheduler to a process-backed node (`etj.dev/node-runtime: process`),
whose harness runs the Deployment's container command (`etj operator run ...`) as a local process. Its API
access is this chart's ServiceAccount: the harness does not project service-account tokens, so the test
mints one for that ServiceAccount (`kubectl create token`) and hands it over in a kubeconfig through the
chart's `operator.extraEnv` — every API call the operator makes is authorised by the chart's RBAC, nothing
else. The release namespace enforces Pod Security "restricted", so the operator pod and the worker pods it
creates exist only if the apiserver's PodSecurity admission accepted them. Worker pods go to kwok nodes
(fake GPUs, no processes), which is all reconciling needs.

The tests of the namespaced release run in file order on one module-scoped install: install → reconcile →
permissions → upgrade → uninstall.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from etj_testbed.localcluster.fake_nodes import fake_gpu_node
from etj_testbed.localcluster.proclet.harness import Proclet, process_node, selector_for
from tests.chart.helmbed import CHART, JSON, REPO, helm, value_args
from tests.plugins.cluster import Cluster

pytestmark = pytest.mark.cluster

TEST_LABEL = "etj.dev/test"
TAINT = "etj.dev/chart-test"
JOB = "demo-cpu"
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
SELECTOR_OPERATOR = "app.kubernetes.io/component=operator,app.kubernetes.io/instance={release}"


def _free_port() -> int:
    # The harness runs pods in the host's network: the operator's ports must not collide with anything.
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _restricted_namespace(cluster: Cluster, name: str) -> None:
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, f"{PSA_ENFORCE}=restricted", f"{PSA_ENFORCE}-version=latest")
    cluster.wait_for(
        f"default ServiceAccount in {name}",
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )


def _sa_kubeconfig(cluster: Cluster, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig whose only credential is a token of the chart's ServiceAccount."""
    token = cluster.kubectl("create", "token", sa, "-n", namespace, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": sa, "namespace": namespace}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class Release:
    cluster: Cluster
    namespace: str
    name: str
    instance: str
    tmp: Path
    metrics_port: int = field(default_factory=_free_port)
    liveness_port: int = field(default_factory=_free_port)
    proclet: Proclet | None = None
    nodes: list[str] = field(default_factory=list)

    @property
    def service_account(self) -> str:
        return f"{self.name}-etj"

    def values(self, kubeconfig: Path) -> dict[str, Any]:
        return {
            "crds": {"install": False},  # the session fixture installed crds/ already (shared cluster)
            "watchNamespaces": [self.namespace],
            "image": {"repository": "etj.invalid/etj-operator", "pullPolicy": "Never"},  # never pulled
            "nodeSelector": {"etj.dev/proclet": self.instance},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "metrics": {"port": self.metrics_port},
            # One replica: these tests follow "the" operator pod (Recreate on upgrade, its pids, its
            # ServiceAccount); leader election among replicas is tested in tests/integration.
            "replicaCount": 1,
            "leaderElection": {"enabled": False},
            # Cluster-scoped: named after the release, so that no other install in the shared cluster owns it.
            "sharing": {"extraPriorityClass": {"name": f"{self.name}-elastic-extra"}},
            "operator": {
                "livenessPort": self.liveness_port,
                "resyncSeconds": 5,
                "progressSeconds": 0,
                "workerGraceSeconds": 3,
                "extraEnv": [{"name": "KUBECONFIG", "value": str(kubeconfig)}],
            },
        }

    def helm(self, *args: str, check: bool = True) -> str:
        return helm(
            *args, "--namespace", self.namespace, kubeconfig=self.cluster.kubeconfig, check=check
        ).stdout

    def get(self, *args: str) -> JSON:
        out = self.cluster.kubectl("get", *args, "-n", self.namespace, "-o", "json").stdout
        data: JSON = json.loads(out)
        return data

    def operator_pods(self) -> list[JSON]:
        selector = SELECTOR_OPERATOR.format(release=self.name)
        return list(self.get("pods", "-l", selector)["items"])

    def running_operator(self) -> JSON | None:
        pods = [
            p
            for p in self.operator_pods()
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        return pods[0] if len(pods) == 1 else None

    def operator_log(self, pod: JSON) -> str:
        assert self.proclet is not None
        return self.proclet.logs_of(self.namespace, pod["metadata"]["name"])

    def operator_pids(self, pod: JSON) -> list[int]:
        assert self.proclet is not None
        runner = self.proclet.runner(self.namespace, pod["metadata"]["name"])
        assert runner is not None, "the harness never ran the operator pod"
        return list(runner.pids)

    def metrics(self, pod: JSON) -> str:
        url = f"http://{pod['status']['podIP']}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())

    def job(self) -> JSON:
        return self.get("etj", JOB)

    def workers(self, running: bool = True) -> list[JSON]:
        pods = self.get("pods", "-l", f"etj.dev/job={JOB},etj.dev/role=worker")["items"]
        return [
            p
            for p in pods
            if not running
            or (p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp"))
        ]

    def can_i(self, verb: str, resource: str, *scope: str) -> str:
        sa = f"system:serviceaccount:{self.namespace}:{self.service_account}"
        # `can-i VERB pods/exec` would ask about a pod named "exec": subresources go in --subresource.
        resource, _, sub = resource.partition("/")
        args = [verb, resource, *([f"--subresource={sub}"] if sub else []), *scope]
        result = self.cluster.kubectl("auth", "can-i", *args, f"--as={sa}", check=False)
        return result.stdout.strip()

    def diagnostics(self) -> str:
        pods = self.operator_pods()
        logs = "\n".join(self.operator_log(p)[-4000:] for p in pods) if self.proclet else ""
        events = self.cluster.kubectl("get", "events", "-n", self.namespace, check=False).stdout[-3000:]
        # Node readiness and taints: a pod that never schedules is usually a node that never went Ready.
        columns = (
            "NAME:.metadata.name,READY:.status.conditions[?(@.type=='Ready')].status,TAINTS:.spec.taints"
        )
        nodes = self.cluster.kubectl(
            # No node names yet would list every node in the cluster: ask for none instead.
            "get",
            "nodes",
            *(self.nodes or ["--selector=etj.dev/none"]),
            "-o",
            f"custom-columns={columns}",
            check=False,
        )
        return (
            f"operator pods: {[p['metadata']['name'] for p in pods]}\n{logs}\nevents:\n{events}\n"
            f"nodes:\n{nodes.stdout}{nodes.stderr}"
        )


@pytest.fixture(scope="module")
def release(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    suffix = uuid.uuid4().hex[:5]
    rel = Release(
        cluster, f"t-chart-{suffix}", f"op{suffix}", f"chart{suffix}", tmp_path_factory.mktemp("chart")
    )
    _restricted_namespace(cluster, rel.namespace)
    kubeconfig = rel.tmp / "operator.kubeconfig"
    try:
        # No node can take the operator pod yet: it waits Pending while its ServiceAccount's token is minted.
        rel.helm("install", rel.name, str(CHART), *value_args(rel.values(kubeconfig)))
        _sa_kubeconfig(cluster, rel.namespace, rel.service_account, kubeconfig)
        rel.proclet = Proclet(
            cluster.kubeconfig, root=rel.tmp / "proclet", selector=selector_for(rel.instance)
        )
        rel.proclet.start()
        node = process_node(
            f"{rel.namespace}-op",
            "on-demand",
            gpus=0,
            instance=rel.instance,
            taints=[{"key": TAINT, "value": rel.namespace, "effect": "NoSchedule"}],
        )
        cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
        rel.nodes.append(node["metadata"]["name"])
        rollout = cluster.kubectl(
            "rollout",
            "status",
            f"deployment/{rel.name}-etj",
            "-n",
            rel.namespace,
            "--timeout=240s",
            check=False,
            timeout=260,
        )
        assert rollout.returncode == 0, f"{rollout.stderr}\n{rel.diagnostics()}"
        yield rel
    finally:
        rel.helm("uninstall", rel.name, "--wait", check=False)
        if rel.proclet is not None:
            rel.proclet.stop()
        for name in rel.nodes:
            cluster.kubectl("delete", "node", name, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", rel.namespace, "--wait=false", check=False)


def test_operator_runs_from_the_installed_deployment_under_restricted(release: Release) -> None:
    pod = release.running_operator()
    assert pod is not None, release.diagnostics()
    ns = release.get("namespace", release.namespace)
    assert ns["metadata"]["labels"][PSA_ENFORCE] == "restricted"
    # The harness ran exactly the Deployment's container command, on the process-backed node.
    assert pod["spec"]["nodeName"] == release.nodes[0]
    assert pod["spec"]["serviceAccountName"] == release.service_account
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["etj", "operator", "run"]
    assert f"--namespace={release.namespace}" in container["args"]
    assert any(_alive(pid) for pid in release.operator_pids(pod))
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True"  # the readiness probe reached kopf's /healthz on the pod's address
    # The same namespace refuses a pod that is not "restricted": enforcement is real, not a no-op.
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged", "namespace": release.namespace},
        "spec": {
            "nodeSelector": {"etj.dev/proclet": "none"},
            "containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}],
        },
    }
    refused = release.cluster.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr


def _example_job(namespace: str) -> JSON:
    job: JSON = yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    job["metadata"]["namespace"] = namespace
    placement = job["spec"].setdefault("placement", {})
    # Only this test's kwok nodes: never the process node (that would train for real) or other tests' nodes.
    placement["nodeSelector"] = {TEST_LABEL: namespace}
    placement["rendezvous"] = {"nodeSelector": {TEST_LABEL: namespace}}
    return job


def test_installed_operator_reconciles_the_example_job(release: Release) -> None:
    cluster = release.cluster
    for capacity in ("spot", "on-demand"):
        node = fake_gpu_node(
            f"{release.namespace}-{capacity}", capacity, gpus=2, labels={TEST_LABEL: release.namespace}
        )
        cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
        release.nodes.append(node["metadata"]["name"])
    cluster.kubectl("apply", "-f", "-", input=json.dumps(_example_job(release.namespace)))
    want = _example_job(release.namespace)["spec"]["replicas"]["max"]
    try:
        cluster.wait_for(
            f"{want} running workers and status.currentReplicas={want}",
            lambda: (
                len(release.workers()) == want
                and (release.job().get("status") or {}).get("currentReplicas") == want
            ),
            timeout=180,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{release.diagnostics()}") from exc
    status = release.job()["status"]
    assert status["phase"] == "Running" and status["workers"] == f"{want}/{want}"
    # Worker pods were admitted by the restricted namespace, memory-backed /dev/shm included.
    for pod in release.workers():
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = spec["containers"][0]["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    store = release.get("pods", "-l", f"etj.dev/job={JOB},etj.dev/role=rendezvous")["items"]
    assert len(store) == 1
    release.get("service", f"{JOB}-rdzv")
    # It was this operator (not some other one on the shared cluster) that did it: its own metrics say so.
    operator = release.running_operator()
    assert operator is not None
    series = f'etj_operator_current_workers{{job="{JOB}",namespace="{release.namespace}"}} {float(want)}'
    assert series in release.metrics(operator)
    log = release.operator_log(operator)
    # 403 as a number of its own: the log names random ports (a clean-clone run failed on port 34033)
    assert "Forbidden" not in log and not re.search(r"\b403\b", log), log[-4000:]


# (verb, resource, namespace or None for --all-namespaces / cluster scope, expected answer)
PERMISSIONS: list[tuple[str, str, str | None, str]] = [
    ("get", "secrets", "<ns>", "no"),
    ("list", "secrets", None, "no"),
    ("watch", "secrets", "<ns>", "no"),
    ("get", "configmaps", "<ns>", "no"),
    ("create", "secrets", "<ns>", "yes"),  # each job's token Secret, never read back
    ("delete", "secrets", "<ns>", "no"),
    ("create", "networkpolicies.networking.k8s.io", "<ns>", "yes"),
    ("delete", "networkpolicies.networking.k8s.io", "<ns>", "no"),
    ("create", "poddisruptionbudgets.policy", "<ns>", "yes"),
    ("delete", "poddisruptionbudgets.policy", "<ns>", "no"),
    ("create", "pods", "<ns>", "yes"),
    ("delete", "pods", "<ns>", "yes"),
    ("list", "pods", "<ns>", "yes"),
    ("patch", "pods", "<ns>", "no"),
    ("create", "pods/exec", "<ns>", "no"),
    ("create", "pods", "default", "no"),  # namespaced release: nothing outside the watched namespace
    ("list", "pods", None, "no"),
    ("create", "services", "<ns>", "yes"),
    ("delete", "services", "<ns>", "no"),
    ("create", "events", "<ns>", "yes"),
    ("watch", "elastictrainingjobs.etj.dev", "<ns>", "yes"),
    ("delete", "elastictrainingjobs.etj.dev", "<ns>", "yes"),
    ("update", "elastictrainingjobs.etj.dev", "<ns>", "no"),
    ("patch", "elastictrainingjobs.etj.dev", "<ns>", "no"),
    ("patch", "elastictrainingjobs.etj.dev/status", "<ns>", "yes"),
    ("create", "elastictrainingjobs.etj.dev", "<ns>", "no"),
    ("list", "nodes", None, "yes"),
    ("patch", "nodes", None, "no"),
    ("delete", "nodes", None, "no"),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io", None, "yes"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", None, "no"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", None, "no"),
    ("create", "serviceaccounts/token", "<ns>", "no"),
    ("create", "deployments.apps", "<ns>", "no"),
    ("*", "*", None, "no"),
]


def test_service_account_can_do_exactly_what_the_operator_needs(release: Release) -> None:
    wrong = []
    for verb, resource, namespace, expected in PERMISSIONS:
        scope = (
            ["--all-namespaces"]
            if namespace is None
            else ["-n", namespace.replace("<ns>", release.namespace)]
        )
        answer = release.can_i(verb, resource, *scope)
        if answer != expected:
            wrong.append(f"can-i {verb} {resource} {scope}: {answer}, want {expected}")
    assert not wrong, "\n".join(wrong)


def test_upgrade_recreates_the_operator_which_keeps_reconciling(release: Release) -> None:
    before = release.running_operator()
    assert before is not None
    old_pids = release.operator_pids(before)
    release.helm(
        "upgrade",
        release.name,
        str(CHART),
        "--reuse-values",
        *value_args({"nodePools": {"spotLabels": {"example.com/lifecycle": "spot"}}}),
    )
    deploy = release.get("deployment", f"{release.name}-etj")
    assert deploy["spec"]["strategy"]["type"] == "Recreate"

    def replaced() -> bool:
        now = release.running_operator()
        return now is not None and now["metadata"]["uid"] != before["metadata"]["uid"]

    release.cluster.wait_for("the upgraded operator pod running", replaced, timeout=180)
    after = release.running_operator()
    assert after is not None
    assert "--spot-label=example.com/lifecycle=spot" in after["spec"]["containers"][0]["args"]
    # Recreate: the old operator's process was stopped, so the two never ran side by side for long.
    assert not any(_alive(pid) for pid in old_pids)
    # The new operator acts on a change made after the upgrade.
    release.cluster.kubectl("scale", "etj", JOB, "-n", release.namespace, "--replicas=2")
    release.cluster.wait_for(
        "2 running workers after scaling down",
        lambda: (
            len(release.workers()) == 2 and (release.job().get("status") or {}).get("currentReplicas") == 2
        ),
        timeout=120,
    )


NAMESPACED_KINDS = [
    "deployments",
    "replicasets",
    "pods",
    "services",
    "serviceaccounts",
    "roles",
    "rolebindings",
]


def test_uninstall_leaves_no_orphans(release: Release) -> None:
    pod = release.running_operator()
    assert pod is not None
    pids = release.operator_pids(pod)
    # Foreground cascade: helm's --wait then covers the ReplicaSet and the pod, not just the Deployment.
    release.helm("uninstall", release.name, "--cascade=foreground", "--wait", "--timeout=180s")
    selector = f"app.kubernetes.io/instance={release.name}"
    left = release.cluster.kubectl(
        "get", ",".join(NAMESPACED_KINDS), "-A", "-l", selector, "-o", "name"
    ).stdout.split()
    left += release.cluster.kubectl(
        "get", "clusterroles,clusterrolebindings", "-l", selector, "-o", "name"
    ).stdout.split()
    assert left == []
    for kind in ("clusterrole", "clusterrolebinding"):
        got = release.cluster.kubectl("get", kind, f"{release.name}-etj", check=False)
        assert got.returncode != 0 and "NotFound" in got.stderr
    release.cluster.wait_for("the operator process to exit", lambda: not any(_alive(p) for p in pids), 60)
    assert release.helm("list", "-q").split() == []
    # The jobs are the users' and stay (the CRD is kept too); the operator's removal does not kill training.
    assert release.job()["metadata"]["name"] == JOB
    release.cluster.kubectl("delete", "etj", JOB, "-n", release.namespace, "--wait=false")


# ---- a second release: all namespaces ----------------------------------------------------------------


@pytest.fixture
def cluster_wide(cluster: Cluster, tmp_path: Path) -> Iterator[Release]:
    suffix = uuid.uuid4().hex[:5]
    rel = Release(cluster, f"t-chartcw-{suffix}", f"cw{suffix}", f"cw{suffix}", tmp_path)
    _restricted_namespace(cluster, rel.namespace)
    # Its pod never schedules (no node has the label): this release exists for its RBAC and NOTES only, so
    # a cluster-wide operator never touches the other tests' namespaces.
    values = {"crds": {"install": False}, "nodeSelector": {"etj.dev/never": "true"}}
    try:
        rel.helm("install", rel.name, str(CHART), *value_args(values))
        yield rel
    finally:
        with contextlib.suppress(AssertionError):
            rel.helm("uninstall", rel.name, "--wait", check=False)
        cluster.kubectl("delete", "namespace", rel.namespace, "--wait=false", check=False)


def test_cluster_wide_release_reads_pods_everywhere_but_never_secrets(cluster_wide: Release) -> None:
    rel = cluster_wide
    assert rel.can_i("list", "pods", "--all-namespaces") == "yes"
    assert rel.can_i("create", "pods", "-n", "default") == "yes"
    assert rel.can_i("patch", "elastictrainingjobs.etj.dev/status", "-n", "default") == "yes"
    assert rel.can_i("get", "secrets", "-n", rel.namespace) == "no"
    assert rel.can_i("list", "secrets", "--all-namespaces") == "no"
    assert rel.can_i("update", "pods", "-n", "default") == "no"
    notes = rel.helm("get", "notes", rel.name)
    assert "all namespaces" in notes
    assert "NOT installed" in notes  # crds.install=false says what to do instead
    assert f"kubectl -n {rel.namespace} rollout status deployment/{rel.name}-etj" in notes
    rel.helm("uninstall", rel.name, "--wait")
    left = cluster_wide.cluster.kubectl(
        "get",
        "clusterroles,clusterrolebindings",
        "-l",
        f"app.kubernetes.io/instance={rel.name}",
        "-o",
        "name",
    ).stdout.split()
    assert left == []


def test_rendered_chart_is_accepted_by_the_apiserver_without_pod_security_warnings(
    cluster: Cluster, namespace: str
) -> None:
    """Every rendered object, the CRD included (as an update of the installed one), passes the real
    apiserver's validation and admission in a server-side dry run; the namespace warns on "restricted", so a
    Deployment whose pods would be refused shows up as a warning here."""
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/warn=restricted")
    rendered = helm(
        "template", "dry", str(CHART), "--namespace", namespace, *value_args({"watchNamespaces": [namespace]})
    ).stdout
    result = cluster.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--force-conflicts",
        "--field-manager=helm",
        "-n",
        namespace,
        "-f",
        "-",
        input=rendered,
    )
    applied = result.stdout.split("\n")
    for kind in (
        "customresourcedefinition",
        "clusterrole",
        "role",
        "deployment",
        "service",
        "serviceaccount",
    ):
        assert any(re.match(rf"{kind}[./]", line) for line in applied), result.stdout
    assert "PodSecurity" not in result.stderr, result.stderr
    # The warning is real: the same Deployment allowing privilege escalation is flagged.
    deploy = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    deploy["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    loosened = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(deploy)
    )
    assert "would violate PodSecurity" in loosened.stderr, loosened.stderr

"""Process-backed nodes (issue 7's harness): pods bound by the real scheduler run as local processes.

The first half checks the pure rules (env, `$(VAR)`, Service names, addresses, status shapes) without a
cluster; the second half runs the harness against the real local control plane.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.plugins.cluster import Cluster

from etj_testbed.localcluster.proclet.env import (
    LoopbackIPs,
    command_line,
    container_env,
    expand,
    headless_service_of,
    pod_network,
    service_endpoint,
    service_names,
    substitute_services,
)
from etj_testbed.localcluster.proclet.harness import Proclet, iter_pids_with_marker
from etj_testbed.localcluster.proclet.kube import Kube
from etj_testbed.localcluster.proclet.launch import start_subprocess
from etj_testbed.localcluster.proclet.nodes import (
    INSTANCE_LABEL,
    NODE_RUNTIME_LABEL,
    PULL_SECONDS_ANNOTATION,
    node_status_patch,
    process_node,
    pull_seconds,
    selector_for,
)
from etj_testbed.localcluster.proclet.proc import MARK_ROOT, is_running, reap_marked
from etj_testbed.localcluster.proclet.status import START_MARK, ContainerRun, exit_code, last_run, pod_status

JSON = dict[str, Any]

# ---- pure rules -------------------------------------------------------------------------------


def _pod(**spec: Any) -> JSON:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "x"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "main"}], **spec},
    }


def test_var_expansion_follows_kubernetes_rules() -> None:
    env = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", env) == "1-two"
    assert expand("$(MISSING) stays", env) == "$(MISSING) stays"
    assert expand("$$(A) is escaped, $$ is one dollar", env) == "$(A) is escaped, $ is one dollar"


def test_container_env_resolves_field_refs_config_and_secrets_in_order() -> None:
    secret = base64.b64encode(b"s3cret").decode()
    data = {("configmaps", "ns", "cm"): {"K": "from-cm"}, ("secrets", "ns", "sec"): {"pw": secret}}
    container = {
        "name": "main",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "pw"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "URL", "value": "http://$(IP):80/$(NAME)"},
        ],
    }
    env = container_env(
        _pod(),
        container,
        pod_ip="127.0.0.9",
        host_ip="127.0.0.1",
        lookup=lambda k, n, name: data.get((k, n, name)),
    )
    assert env == {
        "CM_K": "from-cm",
        "NAME": "p",
        "NS": "ns",
        "UID": "u-1",
        "IP": "127.0.0.9",
        "NODE": "n1",
        "APP": "x",
        "PW": "s3cret",
        "URL": "http://127.0.0.9:80/p",
    }  # CPU (resourceFieldRef) is skipped with a warning


def test_command_line_is_command_then_args_expanded() -> None:
    container = {"command": ["python", "-c"], "args": ["print('$(X)')"]}
    assert command_line(container, {"X": "hi"}) == ["python", "-c", "print('hi')"]


def test_service_names_are_found_and_substituted() -> None:
    values = [
        "job-rdzv.team-a.svc:29400",
        "http://job-rdzv.team-a.svc.cluster.local:29401/progress",
        "x.svcs",
    ]
    assert service_names(values) == {("job-rdzv", "team-a")}
    ips = {("job-rdzv", "team-a"): "127.0.0.7"}
    assert [substitute_services(v, ips) for v in values] == [
        "127.0.0.7:29400",
        "http://127.0.0.7:29401/progress",
        "x.svcs",
    ]
    assert substitute_services("other.ns.svc:1", ips) == "other.ns.svc:1"  # unknown names stay


def test_service_endpoint_picks_selected_pods_ready_first() -> None:
    def pod(name: str, ip: str, ready: bool, app: str = "srv", **meta: Any) -> JSON:
        cond = {"type": "Ready", "status": "True" if ready else "False"}
        return {
            "metadata": {"name": name, "labels": {"app": app}, **meta},
            "status": {"podIP": ip, "phase": "Running", "conditions": [cond]},
        }

    svc: JSON = {"spec": {"selector": {"app": "srv"}}}
    pods = [
        pod("a", "127.0.0.9", ready=False),
        pod("b", "127.0.0.5", ready=True, deletionTimestamp="2026-01-01T00:00:00Z"),
        pod("c", "127.0.0.7", ready=True),
        pod("d", "127.0.0.3", ready=True, app="other"),
    ]
    assert service_endpoint(svc, pods) == "127.0.0.7"
    assert service_endpoint(svc, pods[:1]) is None  # not ready, not published
    published: JSON = {"spec": {"selector": {"app": "srv"}, "publishNotReadyAddresses": True}}
    assert service_endpoint(published, pods[:1]) == "127.0.0.9"
    assert service_endpoint({"spec": {}}, pods) is None  # no selector: nothing the harness can resolve


def test_loopback_ips_are_unique_while_in_use_and_sticky_by_name() -> None:
    ips = LoopbackIPs("127.0.0.0/29")  # .2 .. .6 usable (.1 is the node's)
    got = [ips.allocate(f"ns/p{i}") for i in range(5)]
    assert len(set(got)) == 5 and "127.0.0.1" not in got and all(ip.startswith("127.0.0.") for ip in got)
    with pytest.raises(RuntimeError):
        ips.allocate("ns/one-too-many")
    ips.release(got[2])
    assert ips.allocate("ns/p2") == got[2]  # a recreated pod gets its old address back
    ips.release(got[0])
    assert ips.allocate("ns/new") == got[0]  # the only free one


def test_beds_on_other_port_bases_hand_out_other_pod_addresses() -> None:
    """Two beds at once (a clean-clone run beside a developer's) once both gave a store 127.0.0.4:29400."""
    default = 16400
    assert pod_network({}, default) == "127.0.0.0/16"
    assert pod_network({"ETJ_CLUSTER_PORT_BASE": "16400"}, default) == "127.0.0.0/16"
    others = {pod_network({"ETJ_CLUSTER_PORT_BASE": str(b)}, default) for b in (23400, 25400, 26400, 20400)}
    assert len(others) == 4 and "127.0.0.0/16" not in others
    assert pod_network(
        {"ETJ_CLUSTER_PORT_BASE": "23400", "ETJ_PROCLET_NETWORK": "127.9.0.0/16"}, default
    ) == ("127.9.0.0/16")
    first = {
        LoopbackIPs(pod_network({"ETJ_CLUSTER_PORT_BASE": str(b)}, default)).allocate("ns/store")
        for b in (16400, 23400)
    }
    assert len(first) == 2


def test_a_pod_behind_a_headless_service_takes_over_its_address() -> None:
    """A replacement store pod (a new name) gets the address its clients hold, as cluster DNS would."""

    def svc(name: str, headless: bool, **selector: str) -> JSON:
        return {
            "metadata": {"name": name},
            "spec": {"selector": selector, "clusterIP": "None" if headless else "10.0.0.1"},
        }

    pod: JSON = {
        "metadata": {"name": "job-rdzv-3", "namespace": "ns", "labels": {"role": "rdzv", "job": "j"}}
    }
    services = [
        svc("web", False, role="rdzv"),
        svc("job-rdzv", True, role="rdzv", job="j"),
        svc("x", True, role="x"),
    ]
    assert headless_service_of(pod, services) == "svc:ns/job-rdzv"
    assert headless_service_of(pod, services[:1]) is None  # a ClusterIP Service has its own address

    ips = LoopbackIPs("127.0.0.0/29")
    first = ips.allocate("svc:ns/job-rdzv")
    threading.Timer(0.3, ips.release, [first]).start()  # the old pod lets go of it a moment later
    assert ips.allocate("svc:ns/job-rdzv", wait_s=30) == first
    assert ips.allocate("svc:ns/job-rdzv", wait_s=0.2) != first  # held: a new one after the wait


def test_exit_codes_and_container_status_shapes() -> None:
    assert exit_code(3) == 3 and exit_code(-signal.SIGKILL) == 137 and exit_code(-signal.SIGTERM) == 143
    run = ContainerRun({"name": "main", "image": "img"})
    run.started("2026-01-01T00:00:00Z")
    run.exited(-signal.SIGKILL, "2026-01-01T00:00:05Z")
    status = run.status()
    assert (
        status["state"]["terminated"]["exitCode"] == 137
        and status["state"]["terminated"]["reason"] == "Error"
    )
    pod = pod_status(_pod(), "Failed", "127.0.0.4", "127.0.0.1", [run])
    assert pod["podIP"] == "127.0.0.4" and pod["podIPs"] == [{"ip": "127.0.0.4"}]
    ready = next(c for c in pod["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "PodCompleted"


def test_process_node_is_labelled_like_a_pool_but_not_for_kwok() -> None:
    node = process_node("n1", "spot", gpus=2, provider="karpenter", instance="t1")
    labels = node["metadata"]["labels"]
    assert "kwok.x-k8s.io/node" not in node["metadata"]["annotations"]
    assert labels[NODE_RUNTIME_LABEL] == "process" and labels[INSTANCE_LABEL] == "t1"
    assert labels["karpenter.sh/capacity-type"] == "spot"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "2"
    assert selector_for("t1") == "etj.dev/node-runtime=process,etj.dev/proclet=t1"
    patch = node_status_patch(node, "2026-01-01T00:00:00Z")["status"]
    assert {"type": "InternalIP", "address": "127.0.0.1"} in patch["addresses"]
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in patch["conditions"])


PULL_CASES = {
    "no node": (None, 0.0),
    "no annotation": ({"metadata": {"name": "n"}}, 0.0),
    "seconds": ({"metadata": {"annotations": {PULL_SECONDS_ANNOTATION: "75"}}}, 75.0),
    "negative is none": ({"metadata": {"annotations": {PULL_SECONDS_ANNOTATION: "-5"}}}, 0.0),
    "not a number is none": ({"metadata": {"annotations": {PULL_SECONDS_ANNOTATION: "slow"}}}, 0.0),
}


@pytest.mark.parametrize("case", PULL_CASES)
def test_the_simulated_image_pull_comes_from_the_node_annotation(case: str) -> None:
    node, want = PULL_CASES[case]
    assert pull_seconds(node) == want


def test_reap_marked_kills_escaped_processes_by_marker(tmp_path: Path) -> None:
    env = {**os.environ, MARK_ROOT: str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True
    )
    try:
        assert proc.pid in list(iter_pids_with_marker(tmp_path))
        assert proc.pid in reap_marked(str(tmp_path))
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


# ---- against the real control plane -----------------------------------------------------------


class Bed:
    """One harness instance per test, owning only nodes labelled with the test's namespace."""

    def __init__(self, cluster: Cluster, namespace: str, root: Path) -> None:
        self.cluster, self.ns, self.root = cluster, namespace, root
        self.kube = Kube(str(cluster.kubeconfig))
        self.harness = Proclet(cluster.kubeconfig, root, selector_for(namespace)).start()
        self.nodes: list[str] = []

    def node(self, suffix: str = "n1", capacity_type: str = "on-demand") -> str:
        name = f"{self.ns}-{suffix}"[:63]
        node = process_node(name, capacity_type, gpus=1, instance=self.ns)
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(node))
        self.nodes.append(name)
        self.cluster.wait_for(f"node {name} Ready", lambda: self.node_ready(name))
        return name

    def node_ready(self, name: str) -> bool:
        node = self.kube.get_or_none(f"/api/v1/nodes/{name}") or {}
        conds = (node.get("status") or {}).get("conditions") or []
        taints = [t["key"] for t in (node.get("spec") or {}).get("taints") or []]
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
        return ready and not any(k.startswith("node.kubernetes.io/") for k in taints)

    def pod(self, name: str, node: str, script: str, **extra: Any) -> None:
        container = {"name": "main", "image": "ignored:latest", "command": [sys.executable, "-c", script]}
        container.update(extra.pop("container", {}))
        spec = {"nodeSelector": {"kubernetes.io/hostname": node}, "restartPolicy": "Never", **extra}
        manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}}}
        manifest["spec"] = {**spec, "containers": [container]}
        self.cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=json.dumps(manifest))

    def get(self, name: str) -> JSON | None:
        return self.kube.get_or_none(f"/api/v1/namespaces/{self.ns}/pods/{name}")

    def phase(self, name: str) -> str | None:
        pod = self.get(name)
        return None if pod is None else (pod.get("status") or {}).get("phase")

    def wait_phase(self, name: str, *phases: str, timeout: float = 60) -> JSON:
        self.cluster.wait_for(f"pod {name} in {phases}", lambda: self.phase(name) in phases, timeout)
        pod = self.get(name)
        assert pod is not None
        return pod

    def close(self) -> None:
        self.harness.stop()
        for name in self.nodes:
            self.cluster.kubectl("delete", "node", name, "--wait=false", check=False)
        self.kube.close()


@pytest.fixture
def bed(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Bed]:
    bed = Bed(cluster, namespace, tmp_path / "proclet")
    try:
        yield bed
    finally:
        bed.close()


def _wait_file(cluster: Cluster, path: Path, timeout: float = 60) -> str:
    cluster.wait_for(
        f"{path} to be written", lambda: path.exists() and path.read_text().strip() != "", timeout
    )
    return path.read_text()


ENV_SCRIPT = """
import json, os, sys
keys = ["POD_NAME", "POD_NS", "POD_UID", "POD_IP", "NODE", "ETJ_POD_IP", "GREETING", "ETJ_SCRATCH_DIR"]
print(json.dumps({k: os.environ.get(k) for k in keys} | {"cwd": os.getcwd()}), flush=True)
sys.exit(int(os.environ["EXIT_WITH"]))
"""


def _field(name: str, path: str) -> JSON:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


@pytest.mark.cluster
def test_process_node_goes_ready_and_stays_ready_past_a_lease_period(bed: Bed) -> None:
    name = bed.node()
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
    # The harness writes the node's status before its first Lease: Ready can be seen a moment earlier.
    bed.cluster.wait_for(f"the Lease of {name}", lambda: bed.kube.get_or_none(lease_path) is not None)
    first = bed.kube.get(lease_path)["spec"]
    assert first["holderIdentity"] == name
    node = bed.kube.get(f"/api/v1/nodes/{name}")
    assert "kwok.x-k8s.io/node" not in (node["metadata"].get("annotations") or {})
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
    # Longer than both the lease duration (40 s) and kcm's node-monitor grace period (20 s): a node whose
    # heartbeats stopped would be NotReady and tainted by now.
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        assert bed.node_ready(name), bed.kube.get(f"/api/v1/nodes/{name}")["status"]["conditions"]
        time.sleep(1)
    assert bed.kube.get(lease_path)["spec"]["renewTime"] > first["renewTime"]


@pytest.mark.cluster
@pytest.mark.parametrize(("code", "phase"), [(0, "Succeeded"), (3, "Failed")])
def test_pod_runs_with_its_own_ip_resolved_env_and_exit_code(bed: Bed, code: int, phase: str) -> None:
    node = bed.node()
    env = [
        _field("POD_NAME", "metadata.name"),
        _field("POD_NS", "metadata.namespace"),
        _field("POD_UID", "metadata.uid"),
        _field("POD_IP", "status.podIP"),
        _field("NODE", "spec.nodeName"),
        {"name": "GREETING", "value": "hello $(POD_NAME)"},
        {"name": "EXIT_WITH", "value": str(code)},
    ]
    bed.pod("envpod", node, ENV_SCRIPT, container={"env": env})
    pod = bed.wait_phase("envpod", phase)
    # The real scheduler bound it (nodeSelector), the harness ran it.
    assert pod["spec"]["nodeName"] == node
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.") and ip != "127.0.0.1" and pod["status"]["podIPs"] == [{"ip": ip}]
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == code
    assert terminated["reason"] == ("Completed" if code == 0 else "Error")
    seen = json.loads(bed.harness.logs_of(bed.ns, "envpod").splitlines()[-1])
    assert seen == {
        "POD_NAME": "envpod",
        "POD_NS": bed.ns,
        "POD_UID": pod["metadata"]["uid"],
        "POD_IP": ip,
        "NODE": node,
        "ETJ_POD_IP": ip,
        "GREETING": "hello envpod",
        "ETJ_SCRATCH_DIR": seen["cwd"],
        "cwd": seen["cwd"],
    }


TMP_SCRIPT = """
import os, socket, tempfile
path = os.path.join(tempfile.mkdtemp(), "a-unix-socket-with-a-name-as-long-as-multiprocessing-makes")
socket.socket(socket.AF_UNIX).bind(path)  # fails with "AF_UNIX path too long" under a deep TMPDIR
print(os.environ["TMPDIR"], os.path.realpath(os.environ["TMPDIR"]), flush=True)
"""


@pytest.mark.cluster
def test_an_empty_dir_at_tmp_becomes_a_short_per_pod_tmpdir(bed: Bed) -> None:
    node = bed.node()
    mounts = {"volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}
    bed.pod("tmp", node, TMP_SCRIPT, container=mounts, volumes=[{"name": "tmp", "emptyDir": {}}])
    bed.wait_phase("tmp", "Succeeded")
    tmpdir, real = bed.harness.logs_of(bed.ns, "tmp").splitlines()[-1].split()
    runner = bed.harness.runner(bed.ns, "tmp")
    assert runner is not None and Path(real) == (runner.dir / "volumes" / "tmp").resolve()
    bed.cluster.wait_for("the short link to go with the pod", lambda: not Path(tmpdir).is_symlink())


@pytest.mark.cluster
def test_a_pod_on_a_slow_pulling_node_waits_and_can_be_deleted_meanwhile(bed: Bed, tmp_path: Path) -> None:
    slow, fast = bed.node("slow"), bed.node("fast")
    bed.cluster.kubectl("annotate", "node", slow, f"{PULL_SECONDS_ANNOTATION}=600")
    ran = tmp_path / "ran"
    bed.pod("pulling", slow, f"open({str(ran)!r}, 'w').write('ran')")
    bed.pod("control", fast, "print('ok')")
    bed.wait_phase("control", "Succeeded")  # the harness has started pods since: the slow one is pulling
    assert bed.phase("pulling") == "Pending" and not ran.exists()
    bed.cluster.kubectl("delete", "pod", "pulling", "-n", bed.ns, "--wait=false")
    bed.cluster.wait_for("the pulling pod to be gone", lambda: bed.get("pulling") is None, timeout=60)
    assert not ran.exists()


@pytest.mark.cluster
def test_deleting_a_running_pod_sends_sigterm_then_the_pod_disappears(bed: Bed, tmp_path: Path) -> None:
    node = bed.node()
    marker, started = tmp_path / "sigterm", tmp_path / "started"
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        def on_term(*_):
            open({str(marker)!r}, "w").write("SIGTERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        open({str(started)!r}, "w").write(str(os.getpid()))
        time.sleep(600)
    """)
    bed.pod("graceful", node, script, terminationGracePeriodSeconds=30)
    bed.wait_phase("graceful", "Running")
    pid = int(_wait_file(bed.cluster, started))
    bed.cluster.kubectl("delete", "pod", "graceful", "-n", bed.ns, "--wait=false")
    bed.cluster.wait_for("the pod object to be gone", lambda: bed.get("graceful") is None)
    assert marker.read_text() == "SIGTERM"
    assert not is_running(pid)


@pytest.mark.cluster
def test_a_process_ignoring_sigterm_is_sigkilled_after_the_grace_period(bed: Bed, tmp_path: Path) -> None:
    node = bed.node()
    started = tmp_path / "started"
    script = textwrap.dedent(f"""
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({str(started)!r}, "w").write(str(os.getpid()))
        while True:
            time.sleep(1)
    """)
    bed.pod("stubborn", node, script, terminationGracePeriodSeconds=3)
    bed.wait_phase("stubborn", "Running")
    pid = int(_wait_file(bed.cluster, started))
    bed.cluster.kubectl("delete", "pod", "stubborn", "-n", bed.ns, "--wait=false")
    bed.cluster.wait_for("the pod object to be gone", lambda: bed.get("stubborn") is None)
    assert not is_running(pid)
    runner = bed.harness.runner(bed.ns, "stubborn")
    assert runner is not None and runner.exit_codes() == {"main": 137}  # 128 + SIGKILL


SERVER = """
import os, socket
ip = os.environ["ETJ_POD_IP"]
srv = socket.create_server((ip, 7070))
conn, peer = srv.accept()
conn.sendall(f"pong from {ip} to {peer[0]}".encode())
conn.close()
print("served", peer[0], flush=True)
"""

CLIENT = """
import os, socket, time
for _ in range(200):
    try:
        me = (os.environ["ETJ_POD_IP"], 0)
        sock = socket.create_connection((os.environ["SERVER"], 7070), source_address=me)
        break
    except OSError:
        time.sleep(0.1)
print(sock.recv(200).decode(), flush=True)
"""


@pytest.mark.cluster
def test_two_pods_get_distinct_ips_and_talk_tcp_through_a_service_name(bed: Bed) -> None:
    node = bed.node()
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "srv"},
        "spec": {
            "clusterIP": "None",
            "selector": {"app": "server"},
            "ports": [{"port": 7070}],
            "publishNotReadyAddresses": True,
        },
    }
    bed.cluster.kubectl("apply", "-n", bed.ns, "-f", "-", input=json.dumps(service))
    bed.pod("server", node, SERVER)
    bed.pod("client", node, CLIENT, container={"env": [{"name": "SERVER", "value": f"srv.{bed.ns}.svc"}]})
    server = bed.wait_phase("server", "Succeeded")
    client = bed.wait_phase("client", "Succeeded")
    server_ip, client_ip = server["status"]["podIP"], client["status"]["podIP"]
    assert server_ip != client_ip
    assert bed.harness.logs_of(bed.ns, "client").splitlines()[-1] == f"pong from {server_ip} to {client_ip}"


@pytest.mark.cluster
def test_on_failure_restarts_the_container_until_it_succeeds(bed: Bed, tmp_path: Path) -> None:
    node = bed.node()
    once = tmp_path / "failed-once"
    script = textwrap.dedent(f"""
        import os, sys
        if not os.path.exists({str(once)!r}):
            open({str(once)!r}, "w")
            sys.exit(1)
    """)
    bed.pod("flaky", node, script, restartPolicy="OnFailure")
    pod = bed.wait_phase("flaky", "Succeeded")
    status = pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1 and status["lastState"]["terminated"]["exitCode"] == 1


SPAWNER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
# This one leaves the pod's process group, as daemons do; only the harness's marker still finds it.
escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(os.environ["PIDS"], "w").write(f"{os.getpid()} {child.pid} {escaped.pid}")
time.sleep(600)
"""


def _spawner_pids(bed: Bed, node: str, name: str, tmp_path: Path) -> list[int]:
    pids = tmp_path / f"{name}.pids"
    bed.pod(name, node, SPAWNER, container={"env": [{"name": "PIDS", "value": str(pids)}]})
    bed.wait_phase(name, "Running")
    found = [int(p) for p in _wait_file(bed.cluster, pids).split()]
    assert all(is_running(p) for p in found)
    return found


@pytest.mark.cluster
def test_deleting_the_node_kills_its_pods_processes(bed: Bed, tmp_path: Path) -> None:
    node = bed.node()
    pids = _spawner_pids(bed, node, "doomed", tmp_path)
    bed.cluster.kubectl("delete", "node", node)
    bed.cluster.wait_for("every process of the node's pod to be gone", lambda: not any(map(is_running, pids)))


@pytest.mark.cluster
def test_stopping_the_harness_leaves_no_processes(bed: Bed, tmp_path: Path) -> None:
    node = bed.node()
    pids = _spawner_pids(bed, node, "p1", tmp_path) + _spawner_pids(bed, node, "p2", tmp_path)
    bed.harness.stop()
    assert not [p for p in pids if is_running(p)]
    assert list(iter_pids_with_marker(bed.root)) == []


@pytest.mark.cluster
def test_the_harness_as_a_subprocess_stops_cleanly_on_sigterm(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    bed = Bed(cluster, namespace, tmp_path / "unused")
    bed.harness.stop()  # this test drives a separate harness process instead
    root = tmp_path / "sub"
    proc = start_subprocess(
        cluster.kubeconfig, root, selector_for(namespace), log_file=tmp_path / "proclet.log"
    )
    try:
        node = bed.node()
        pids = _spawner_pids(bed, node, "p1", tmp_path)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not [p for p in pids if is_running(p)]
        assert list(iter_pids_with_marker(root)) == []
    finally:
        proc.kill()
        proc.wait()
        bed.close()


@pytest.mark.cluster
def test_the_harness_keeps_working_after_its_watches_are_cut(bed: Bed) -> None:
    node = bed.node()
    bed.harness.drop_watches()
    bed.pod("after-cut", node, "print('ok')")
    bed.wait_phase("after-cut", "Succeeded")


@pytest.mark.cluster
def test_a_restarted_harness_reports_pods_whose_processes_it_lost(bed: Bed) -> None:
    node = bed.node()
    bed.pod("lost", node, "import time; time.sleep(600)")
    bed.wait_phase("lost", "Running")
    bed.harness.stop()  # the "kubelet" dies and its processes with it
    bed.harness = Proclet(bed.cluster.kubeconfig, bed.root, selector_for(bed.ns)).start()
    pod = bed.wait_phase("lost", "Failed")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "ContainerStatusUnknown" and terminated["exitCode"] == 137


def test_a_failed_container_with_fallback_to_logs_gets_its_last_run_lines_as_message() -> None:
    """The kubelet's FallbackToLogsOnError, which worker pods ask for: on process nodes a failed worker's
    termination message was empty, so the operator's WorkerFailed Event lacked the trainer's refusal (the
    chaos bench's bad-data job Failed with no error to read)."""
    log = f"{START_MARK} ['etj-train'] at t0\nold run\n{START_MARK} ['etj-train'] at t1\n"
    log += "".join(f"line {i}\n" for i in range(100)) + "ETJ_DATA: /nonexistent: no such file or directory\n"
    assert last_run(log).startswith("line 0\n") and "old run" not in last_run(log)

    def ran(policy: str | None, returncode: int) -> dict[str, Any]:
        spec = {"name": "main", "image": "img"} | ({"terminationMessagePolicy": policy} if policy else {})
        run = ContainerRun(spec)
        run.started("2026-01-01T00:00:00Z")
        run.exited(returncode, "2026-01-01T00:00:05Z", lambda: last_run(log))
        terminated: dict[str, Any] = run.status()["state"]["terminated"]
        return terminated

    message = ran("FallbackToLogsOnError", 1)["message"]
    assert message.endswith("ETJ_DATA: /nonexistent: no such file or directory")
    assert len(message.splitlines()) == 80 and "line 20\n" not in message  # the kubelet's 80-line limit
    assert "message" not in ran("FallbackToLogsOnError", 0)  # only on an error
    assert "message" not in ran(None, 1)  # File, the default: the (absent) termination-log file

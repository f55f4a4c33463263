"""Helpers for operator integration tests: run the operator as a real process, make kwok nodes and jobs.

Every test gets its own namespace and labels its nodes and jobs with it (``etj.dev/test``), so tests
sharing the session's control plane never schedule onto each other's nodes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from kubernetes import client

from etj_contract.ports import PROGRESS_PORT
from etj_contract.progress import ProgressDoc
from etj_operator.api.models import GROUP, PLURAL, VERSION
from etj_operator.decide.objects.pod_env import token_secret_of
from etj_operator.k8s.main import TOKEN_KEY_ENV
from etj_testbed.localcluster.fake_nodes import fake_gpu_node
from etj_trainer.core.progress import get_json, post_json
from tests.plugins.cluster import Cluster

TEST_LABEL = "etj.dev/test"


class OperatorProcess:
    """``python -m etj_operator.k8s.main`` against the test cluster, logging to a file."""

    def __init__(self, kubeconfig: Path, namespace: str, log_path: Path, *extra: str) -> None:
        self.args = [
            sys.executable,
            "-m",
            "etj_operator.k8s.main",
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            namespace,
            "--metrics-port",
            "0",
            "--liveness-port",
            "0",
            "--progress-seconds",
            "0",
            "--resync-seconds",
            "5",
            "--worker-grace-seconds",
            "3",
            *extra,
        ]
        self.log_path = log_path
        self.namespace = namespace
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115  (closed with the process)
        # A key of the test's own, the same for every operator process of it (as the chart keeps one for
        # all replicas and restarts): a random key names a new token Secret after each restart.
        env = {TOKEN_KEY_ENV: f"test-key-{self.namespace}", **os.environ}
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, like a crashed or evicted operator pod."""
        self.stop(signal.SIGKILL)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path.exists() else ""


def make_node(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    capacity: str,
    gpus: int = 1,
    provider: str = "karpenter",
) -> str:
    body = fake_gpu_node(
        name,
        capacity_type=capacity,
        gpus=gpus,
        provider=provider,
        pool=f"{capacity}-pool",
        labels={TEST_LABEL: namespace},
        # Tainted for this test only: other tests' pods cannot take its GPUs (and ours select the label).
        taints=[{"key": TEST_LABEL, "value": namespace, "effect": "NoSchedule"}],
    )
    core.create_node(body)
    return name


def job_manifest(
    name: str, namespace: str, *, min_workers: int = 1, max_workers: int = 3, **spec: Any
) -> dict[str, Any]:
    toleration = {"key": TEST_LABEL, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ElasticTrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "trainer": {"image": "ghcr.io/etj-dev/etj-trainer:test", "resources": {"gpu": 1}},
            "replicas": {"min": min_workers, "max": max_workers},
            "training": {"globalBatchSize": 64, "microBatchSize": 8},
            "placement": {
                "capacityTypes": ["spot", "on-demand"],
                "nodeSelector": {TEST_LABEL: namespace},
                "tolerations": [toleration],
                "rendezvous": {"nodeSelector": {TEST_LABEL: namespace}, "tolerations": [toleration]},
            },
            "scaling": {"cooldownSeconds": 0, "scaleUpDelaySeconds": 0},
            **spec,
        },
    }


class Bed:
    """One test's view: API clients plus polling helpers for the job under test."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.ns = namespace
        api = cluster.api_client()
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.nodes: list[str] = []

    def node(self, name: str, capacity: str, gpus: int = 1) -> str:
        full = f"{self.ns}-{name}"[:63]
        self.nodes.append(make_node(self.core, self.ns, full, capacity, gpus))
        return full

    def cleanup(self) -> None:
        for name in self.nodes:
            with contextlib.suppress(client.ApiException):
                self.core.delete_node(name)

    def create_job(self, name: str, **kw: Any) -> None:
        self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, job_manifest(name, self.ns, **kw)
        )

    def job(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(
                cast(Any, self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name))
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def status(self, name: str) -> dict[str, Any]:
        return (self.job(name) or {}).get("status") or {}

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        """The job's condition of ``type_`` ({} while it has none)."""
        conditions = self.status(name).get("conditions") or []
        return next((c for c in conditions if c["type"] == type_), {})

    def pods(self, job: str, role: str = "worker") -> list[Any]:
        sel = f"etj.dev/job={job},etj.dev/role={role}"
        return list(self.core.list_namespaced_pod(self.ns, label_selector=sel).items)

    def running_workers(self, job: str) -> list[Any]:
        return [
            p for p in self.pods(job) if p.status.phase == "Running" and not p.metadata.deletion_timestamp
        ]

    def token(self, job: str) -> str:
        """The job's progress token, from the Secret its store pod names (the name is derived from the
        operator's key: dataplane.token_secret_name)."""
        (store, *_) = self.pods(job, "rendezvous")
        name = token_secret_of(client.ApiClient().sanitize_for_serialization(store))
        assert name, f"{store.metadata.name} names no token Secret"
        secret: Any = self.core.read_namespaced_secret(name, self.ns)
        return base64.b64decode(secret.data["token"]).decode()

    def events(self, job: str) -> list[Any]:
        evs = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={job}").items
        return list(evs)

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 60) -> None:
        self.cluster.wait_for(what, predicate, timeout)

    def taint(self, node: str, key: str, effect: str = "NoSchedule") -> float:
        """Add a taint; return the monotonic time the request was sent."""
        current = cast(Any, self.core.read_node(node)).spec.taints or []
        kept = [client.ApiClient().sanitize_for_serialization(t) for t in current]
        body = {"spec": {"taints": [*kept, {"key": key, "effect": effect}]}}
        sent = time.monotonic()
        self.core.patch_node(node, body)
        return sent


@contextlib.contextmanager
def operator_and_a_store_node(
    bed: Bed, cluster: Cluster, tmp_path: Path, *extra: str
) -> Iterator[OperatorProcess]:
    """The operator reading progress every second, and an on-demand process node where the job's store runs
    for real (a proclet runs its pod as a process): for tests that speak to the store as the operator does.
    Worker pods stay kwok pods on the test's own nodes."""
    from etj_testbed.localcluster.proclet.harness import Proclet, process_node, selector_for

    instance = f"p{uuid.uuid4().hex[:6]}"
    proclet = Proclet(cluster.kubeconfig, root=tmp_path / "proclet", selector=selector_for(instance)).start()
    op = OperatorProcess(
        cluster.kubeconfig, bed.ns, tmp_path / "operator.log", "--progress-seconds=1", *extra
    ).start()
    store_node = f"{bed.ns}-store"[:63]
    try:
        node = process_node(
            store_node,
            "on-demand",
            gpus=0,
            instance=instance,
            labels={TEST_LABEL: bed.ns},
            taints=[{"key": TEST_LABEL, "value": bed.ns, "effect": "NoSchedule"}],
        )
        cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
        yield op
    finally:
        op.stop()
        print(op.logs())
        proclet.stop()
        cluster.kubectl("delete", "node", store_node, "--wait=false", check=False)


def running_store_ip(bed: Bed, job: str) -> str | None:
    pods = [p for p in bed.pods(job, "rendezvous") if p.status.phase == "Running"]
    return pods[0].status.pod_ip if pods and pods[0].status.pod_ip else None


def progress_reporter(bed: Bed, job: str, *, total: int, per_worker: float) -> Callable[[int, int], None]:
    """A function that posts rank 0's progress report to ``job``'s running store with the job's token, as
    the trainer does: ``report(samples_done, workers_running)``, at ``per_worker`` samples/s each."""
    bed.wait("the store process running", lambda: running_store_ip(bed, job) is not None, 180)
    token = bed.token(job)
    url = f"http://{running_store_ip(bed, job)}:{PROGRESS_PORT}/progress"
    # A started process is not yet a listening store: its imports alone took over 60 s on a loaded 2-core
    # machine (tests/kueue/test_kueue_deadline.py failed so).
    bed.wait("the store to answer", lambda: get_json(url, token=token) is not None, 180)

    def report(done: int, running: int) -> None:
        doc = ProgressDoc(
            epoch=0,
            step=done // 64 + 1,
            samples_seen=done,
            samples_total=total,
            samples_per_second=per_worker * running,
            world_size=running,
        )
        post_json(url, doc.to_json(), token=token)

    return report

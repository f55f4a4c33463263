"""What the kind tests do to the cluster of `make kind`: its kubeconfig, its nodes as Docker containers,
and the e2e configuration that runs a job on it with the loaded images (never pulled)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etj_testbed.demo.local import Demo
from etj_testbed.demo.script import DemoResult, Script, add_validation_data
from etj_testbed.localcluster import toolchain
from etj_testbed.localcluster.proclet.kube import Kube
from tests.e2e.e2econfig import E2EConfig, demo_job

REPO = Path(__file__).resolve().parents[2]
KIND_SH = REPO / "scripts" / "kind.sh"
TRAINER_IMAGE = os.environ.get("ETJ_TRAINER_IMAGE", "ghcr.io/etj-dev/etj-trainer:dev-cpu")
SHARED_DIR = Path(os.environ.get("ETJ_E2E_SHARED_DIR", "/var/tmp/etj-e2e"))
JSON = dict[str, Any]


def kubectl_path() -> str:
    """The kubectl `make setup` built, else the one on PATH (a GitHub runner's)."""
    built = toolchain.binary("kubectl")
    return str(built) if built.exists() else shutil.which("kubectl") or "kubectl"


def kubectl(bed: KindBed, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``kubectl ARGS`` against the kind cluster; the caller checks the return code (some callers expect a
    refusal, or clean up best effort)."""
    return subprocess.run(
        [kubectl_path(), "--kubeconfig", str(bed.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for(what: str, predicate: Callable[[], object], timeout: float, every: float = 2.0) -> Any:
    """Poll until ``predicate`` returns something truthy, and return it; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@dataclass
class KindBed:
    kubeconfig: Path
    kube: Kube
    trainer_image: str = TRAINER_IMAGE
    shared_dir: Path = SHARED_DIR
    stopped: list[str] = field(default_factory=list)  # node containers a test killed; restarted at the end

    @classmethod
    def connect(cls, kubeconfig: Path) -> KindBed:
        return cls(kubeconfig, Kube(str(kubeconfig)))

    def e2e(self, epochs: int) -> E2EConfig:
        """The e2e suite's installed mode on this cluster: the chart's operator, the kind workers, the CPU
        trainer image loaded by `scripts/kind.sh` (pull policy Never), files in the shared directory."""
        return E2EConfig(
            installed=True,
            kubeconfig=self.kubeconfig,
            trainer_image=self.trainer_image,
            pull_policy="Never",
            shared_dir=self.shared_dir,
            epochs=epochs,
        )

    # ---- nodes ------------------------------------------------------------------------------

    def node(self, name: str) -> JSON:
        return self.kube.get(f"/api/v1/nodes/{name}")

    def ready(self, name: str) -> bool:
        node = self.kube.get_or_none(f"/api/v1/nodes/{name}") or {}
        conditions = node.get("status", {}).get("conditions")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions or [])

    def kill_node(self, name: str) -> None:
        """The machine is gone at once: no drain, no SIGTERM to its pods (the kind node is a container)."""
        subprocess.run(["docker", "kill", name], check=True, capture_output=True, timeout=120)
        self.stopped.append(name)

    def start_node(self, name: str, timeout: float = 300) -> None:
        """The machine comes back: its kubelet re-registers and the node turns Ready."""
        subprocess.run(["docker", "start", name], check=True, capture_output=True, timeout=120)
        if name in self.stopped:
            self.stopped.remove(name)
        wait_for(f"node {name} Ready again", lambda: self.ready(name), timeout)

    def pods(self, namespace: str, selector: str) -> list[JSON]:
        items: list[JSON] = (
            self.kube.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector).get("items") or []
        )
        return items

    def events(self, namespace: str, name: str) -> list[JSON]:
        items: list[JSON] = (
            self.kube.get(
                f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.name={name}"
            ).get("items")
            or []
        )
        return items

    def close(self) -> None:
        for name in list(self.stopped):  # a failed test must not leave the next one a node short
            subprocess.run(["docker", "start", name], capture_output=True, timeout=120)
        self.kube.close()


@dataclass
class RunningJob:
    """A job the demo's machinery trains on kind in a background thread, while the test acts on the
    cluster (kills nodes, deletes pods) and watches the job's status."""

    bed: KindBed
    demo: Demo
    run_dir: Path
    thread: threading.Thread
    results: list[DemoResult]

    @property
    def ns(self) -> str:
        return self.demo.ns

    @property
    def name(self) -> str:
        return self.demo.name

    def status(self) -> JSON:
        path = f"/apis/etj.dev/v1alpha1/namespaces/{self.ns}/elastictrainingjobs/{self.name}"
        status: JSON = (self.bed.kube.get_or_none(path) or {}).get("status") or {}
        return status

    def step(self) -> int:
        return int((self.status().get("progress") or {}).get("step") or 0)

    def pods(self, role: str) -> list[JSON]:
        return [
            p
            for p in self.bed.pods(self.ns, f"etj.dev/job={self.name}")
            if p["metadata"].get("labels", {}).get("etj.dev/role") == role
        ]

    def running_on(self, role: str) -> dict[str, str]:
        """Running, not terminating, pods of ``role`` → their node."""
        return {
            p["metadata"]["name"]: p["spec"].get("nodeName", "")
            for p in self.pods(role)
            if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        }

    def training_workers(self, n: int, min_step: int) -> dict[str, str] | None:
        """The running workers (pod → node) once the world has ``n`` of them and is past ``min_step``."""
        workers = self.running_on("worker")
        if len(workers) == n and self.status().get("worldSize") == n and self.step() >= min_step:
            return workers
        return None

    def wait(self, what: str, predicate: Callable[[], object], timeout: float = 600) -> Any:
        def check() -> object:
            if not self.thread.is_alive() and not self.results:
                raise AssertionError(f"the job's runner died while waiting for {what}")
            return predicate()

        return wait_for(what, check, timeout)

    def result(self, timeout: float = 1800) -> DemoResult:
        self.thread.join(timeout)
        assert self.results, f"the job did not finish in {timeout:.0f} s ({self.run_dir})"
        return self.results[0]


@contextmanager
def running_job(
    bed: KindBed,
    tag: str,
    manifest: JSON,
    epochs: int,
    script: Script | None = None,
    config: E2EConfig | None = None,
) -> Iterator[RunningJob]:
    """Submit ``manifest`` and train it in the background under ``script`` (default: no scripted
    interruption; the test acts), in ``config``'s mode (default: the dev images, ``bed.e2e``)."""
    config = config or bed.e2e(epochs)
    run_dir = config.run_root() / tag
    suffix = uuid.uuid4().hex[:5]
    script = script or Script(interrupt_epoch=10**6, timeout_s=1800)
    demo = config.demo(bed.kubeconfig, f"kind-{tag}-{suffix}", run_dir, manifest, script, f"k{tag}{suffix}")
    demo.start()
    results: list[DemoResult] = []
    thread = threading.Thread(target=lambda: results.append(demo.run()), daemon=True, name=f"job-{tag}")
    thread.start()
    try:
        yield RunningJob(bed, demo, run_dir, thread, results)
    finally:
        thread.join(5)
        demo.cleanup(delete_job=not thread.is_alive())


def two_worker_job(epochs: int, min_step_s: float, spot_only: bool = False, **trainer: Any) -> JSON:
    """The demo's job (examples/demo-cpu.yaml) at 1..2 workers for ``epochs``, each step at least
    ``min_step_s`` long (so what a test does lands mid-training on a fast machine too); ``spot_only`` keeps
    the workers off the on-demand node, which then holds the store alone; ``trainer`` overrides
    spec.trainer fields."""
    job: JSON = demo_job()
    job["spec"]["training"]["epochs"] = epochs
    job["spec"]["replicas"] = {"min": 1, "max": 2}
    if spot_only:
        job["spec"]["placement"]["capacityTypes"] = ["spot"]
    job["spec"]["trainer"]["env"].append({"name": "ETJ_MIN_STEP_SECONDS", "value": str(min_step_s)})
    job["spec"]["trainer"].update(trainer)
    return job


# The variables run_local sets itself (the local job's size, rendezvous and store) or that name the pod's
# cluster (addresses, paths inside the image); everything else is the job's training as the operator
# passes it to a worker.
_LOCAL_OWN = (
    "JOB_NAME",
    "NAMESPACE",
    "WORKER_ID",
    "RDZV_ENDPOINT",
    "RDZV_ID",
    "MIN_WORKERS",
    "MAX_WORKERS",
    "STARTUP_WORKERS",
    "STORE_WAIT_SECONDS",
    "CHECKPOINT_DIR",
    "CHECKPOINT_URI",
    "PROGRESS_URL",
    "PROGRESS_TOKEN",
    "MIN_STEP_SECONDS",
)


def fixed_reference_accuracy(job: JSON, workers: int, log_dir: Path) -> float:
    """The accuracy of ``job`` trained at a fixed ``workers`` from start to end, never resized: the same
    trainer, recipe, seed and validation data as its pods get (the operator's own ``worker_env``), run on
    this host by etj-train's local launcher, unpaced. What an elastic run through any resizes must match."""
    from etj_contract import env as etj_env
    from etj_operator.api.models import ElasticTrainingJobSpec
    from etj_operator.decide.objects.pod_env import worker_env
    from etj_trainer.agent.local_launcher import run_local

    spec = ElasticTrainingJobSpec.model_validate(job["spec"])
    pod_env = worker_env(spec, job="reference", namespace="local", uid="reference", pod="w", token_secret="t")
    add_validation_data(pod_env)  # as the demo's machinery gives the job on kind: its accuracy is reported
    own = {getattr(etj_env, name).name for name in _LOCAL_OWN}
    env = {
        e["name"]: e["value"]
        for e in pod_env
        if "value" in e and e["name"] not in own and e["name"] != "HOME"
    }
    result = run_local(workers, [], env, log_dir, timeout_s=1200)
    assert result.get("finished") is True, result
    return float(result["accuracy"])  # type: ignore[arg-type]


def exactly_once(run_dir: Path, epochs: int) -> None:
    """Every sample once per epoch, by the per-rank sample logs (a redone step counts once)."""
    from collections import Counter

    from etj_trainer.core.sample_log import consumed_per_epoch

    seen = consumed_per_epoch(run_dir / "samples")
    assert sorted(seen) == list(range(epochs)), sorted(seen)
    for epoch, ids in seen.items():
        twice = [i for i, n in Counter(ids).items() if n > 1]
        assert not twice, f"epoch {epoch}: trained twice: {twice[:20]}"
        assert sorted(ids) == sorted(seen[0]), f"epoch {epoch}: samples skipped or extra"


PROBE = """
import socket, sys, urllib.request
host, port, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    if kind == "http":
        urllib.request.urlopen(f"http://{host}:{port}/", timeout=5)
    else:
        socket.create_connection((host, port), timeout=5).close()
    print("open")
except urllib.error.HTTPError:
    print("open")  # an answer, even an error status, means the connection was let through
except OSError as exc:
    print(f"closed: {exc}")
"""


@dataclass
class Prober:
    """A pod in a namespace of its own, outside any job, that tries connections (the CPU trainer image has
    Python; pull policy Never)."""

    bed: KindBed
    ns: str
    pod: str = "prober"

    def start(self) -> None:
        self.bed.kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": self.ns}})
        body = {
            "metadata": {"name": self.pod},
            "spec": {
                "containers": [
                    {
                        "name": "probe",
                        "image": self.bed.trainer_image,
                        "imagePullPolicy": "Never",
                        "command": ["sleep", "3600"],
                    }
                ],
                "terminationGracePeriodSeconds": 0,
            },
        }
        self.bed.kube.request("POST", f"/api/v1/namespaces/{self.ns}/pods", body=body)
        wait_for(
            f"pod {self.ns}/{self.pod} running",
            lambda: (
                self.bed.kube.get(f"/api/v1/namespaces/{self.ns}/pods/{self.pod}")
                .get("status", {})
                .get("phase")
                == "Running"
            ),
            300,
        )

    def connect(self, host: str, port: int, kind: str = "tcp") -> str:
        """'open', or 'closed: <why>', for a TCP connection (or an HTTP GET) from the prober to host:port."""
        script = ["python", "-c", PROBE, host, str(port), kind]
        out = kubectl(self.bed, "exec", "-n", self.ns, self.pod, "--", *script, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def close(self) -> None:
        self.bed.kube.request("DELETE", f"/api/v1/namespaces/{self.ns}")

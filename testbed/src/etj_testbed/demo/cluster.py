"""`ClusterDemo`: the demo's script on a cluster that already runs the operator and has real nodes.

`etj demo --operator installed` and the e2e suite's installed mode (tests/e2e/e2econfig.py, the kind
workflow) use it; `make_demo` picks it or the local `Demo` (local.py).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

from kubernetes.client.rest import ApiException

from etj_operator.api.models import CapacityType
from etj_operator.observe.nodes import DEFAULT_RULES, CapacityRules, node_info
from etj_testbed.demo.local import Demo
from etj_testbed.demo.script import (
    CRD_PATH,
    GROUP_PATH,
    INSTANCE,
    JSON,
    SPOT_ITN,
    Script,
    add_validation_data,
)
from etj_testbed.localcluster.proclet.kube import MERGE


class ClusterDemo(Demo):
    """The demo's script on a cluster that already runs the operator (the Helm chart) on real nodes (kind's
    CPU workers, a cloud's GPU nodes). Nothing is started here, no node is created or deleted, and no local
    process is signalled; everything goes through the Kubernetes API:

    - nodes: the cluster's own, spot or on-demand by the operator's own rules (``nodepools.node_info``);
    - the interruption: what an interruption handler does, the NTH taint plus a cordon, on a spot node that
      hosts a worker; the operator drains that node's workers;
    - capacity returning: the taint removed and the cordon lifted on the same node;
    - the image: ``trainer_image`` as spec.trainer.image; ``None`` leaves the field out, so the installed
      operator's default trainer image (the chart's trainer.image) is used;
    - files: with ``shared_dir``, a directory that this machine and every node have at the same path (kind's
      extraMounts), the checkpoints and the per-rank sample log go to ``run_dir`` inside it through a
      hostPath volume, so whoever runs the demo can read them; without it checkpoints stay pod-local and no
      sample log is written.
    """

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        run_dir: Path,
        manifest: JSON,
        script: Script,
        instance: str = INSTANCE,
        *,
        trainer_image: str | None = None,
        pull_policy: str | None = None,
        shared_dir: Path | None = None,
        rules: CapacityRules = DEFAULT_RULES,
    ) -> None:
        super().__init__(kubeconfig, namespace, run_dir, manifest, script, instance)
        if shared_dir is not None and not run_dir.resolve().is_relative_to(shared_dir.resolve()):
            raise ValueError(f"run directory {run_dir} must be inside the shared directory {shared_dir}")
        self.trainer_image, self.pull_policy, self.shared_dir = trainer_image, pull_policy, shared_dir
        self.rules = rules
        self.cordoned_before: dict[str, bool] = {}  # node we interrupted → was it unschedulable already

    @property
    def job_path(self) -> str:
        return f"{GROUP_PATH}/namespaces/{self.ns}/elastictrainingjobs"

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.kube.get_or_none(CRD_PATH) is None:
            raise RuntimeError(
                "this cluster has no ElasticTrainingJob CRD: install the operator first (helm install etj "
                "charts/etj; docs/install-eks.md)"
            )
        try:
            self.kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": self.ns}})
        except ApiException as exc:
            if exc.status != 409:
                raise
        if self.shared_dir is not None:
            # A hostPath volume is refused under the baseline and restricted Pod Security levels.
            labels = {"pod-security.kubernetes.io/enforce": "privileged"}
            self.kube.patch(f"/api/v1/namespaces/{self.ns}", {"metadata": {"labels": labels}}, MERGE)
            for sub in ("", "checkpoints", "samples"):
                path = self.run_dir / sub
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o777)  # the trainer runs as another user (uid 1000) on the nodes
        self._delete_job(wait_s=120)

    def _delete_job(self, wait_s: float = 0) -> None:
        try:
            self.kube.request("DELETE", f"{self.job_path}/{self.name}")
        except ApiException as exc:
            if exc.status != 404:
                raise
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and self.job():
            time.sleep(1)

    def job_manifest(self) -> JSON:
        job = copy.deepcopy(self.manifest)
        job["metadata"]["namespace"] = self.ns
        spec = job["spec"]
        trainer = spec.setdefault("trainer", {})
        if self.trainer_image:
            trainer["image"] = self.trainer_image
        else:
            trainer.pop("image", None)  # the installed operator's default trainer image
        if self.pull_policy:
            trainer["imagePullPolicy"] = self.pull_policy
        env = trainer.setdefault("env", [])
        if self.shared_dir is not None:
            shared = str(self.shared_dir)
            trainer.setdefault("volumes", []).append(
                {"name": "demo-shared", "hostPath": {"path": shared, "type": "Directory"}}
            )
            trainer.setdefault("volumeMounts", []).append({"name": "demo-shared", "mountPath": shared})
            spec.setdefault("checkpoint", {})["path"] = str(self.run_dir / "checkpoints")
            env.append({"name": "ETJ_SAMPLE_LOG_DIR", "value": str(self.run_dir / "samples")})
        add_validation_data(env)
        return job

    def submit(self) -> None:
        self.kube.request("POST", self.job_path, body=self.job_manifest())

    def spot_worker_nodes(self) -> list[str]:
        spot = []
        for name in sorted({n for n in self.worker_nodes().values() if n}):
            node = self.kube.get_or_none(f"/api/v1/nodes/{name}")
            if node is not None and node_info(node, self.rules).capacity_type == CapacityType.SPOT:
                spot.append(name)
        return spot

    def interrupt(self, node: str) -> None:
        current = self.kube.get(f"/api/v1/nodes/{node}")
        self.cordoned_before.setdefault(node, bool(current["spec"].get("unschedulable")))
        super().interrupt(node)

    def restore(self, node: str) -> None:
        """Undo `interrupt`: drop the taint, and lift the cordon unless the node was cordoned before."""
        current = self.kube.get_or_none(f"/api/v1/nodes/{node}")
        if current is None:
            return
        taints = [t for t in current["spec"].get("taints") or [] if t.get("key") != SPOT_ITN]
        unschedulable = self.cordoned_before.pop(node, False)
        self.kube.patch(
            f"/api/v1/nodes/{node}", {"spec": {"taints": taints, "unschedulable": unschedulable}}, MERGE
        )

    def end_of_notice(self, victim: str, drained: bool) -> None:
        # A real cluster's machine is not deleted from here: the node stays tainted and cordoned.
        self.event(f"{victim} {'drained' if drained else 'notice expired'}; it stays tainted and cordoned")

    def return_capacity(self, victim: str, serial: int) -> None:
        self.restore(victim)
        self.event(f"spot capacity is back: {victim} (taint removed, cordon lifted)")

    def cleanup(self, delete_job: bool = True) -> None:
        try:
            for node in list(self.cordoned_before):
                self.restore(node)
            if delete_job:
                self._delete_job()
        finally:
            self.kube.close()


def make_demo(
    kubeconfig: Path,
    namespace: str,
    run_dir: Path,
    manifest: JSON,
    script: Script,
    instance: str = INSTANCE,
    *,
    installed: bool = False,
    trainer_image: str | None = None,
    pull_policy: str | None = None,
    shared_dir: Path | None = None,
) -> Demo:
    """The local demo (operator, harness and process nodes started here) or, with ``installed``, the
    cluster-agnostic one (`ClusterDemo`: the cluster's own operator and nodes)."""
    if not installed:
        return Demo(kubeconfig, namespace, run_dir, manifest, script, instance)
    return ClusterDemo(
        kubeconfig,
        namespace,
        run_dir,
        manifest,
        script,
        instance,
        trainer_image=trainer_image,
        pull_policy=pull_policy,
        shared_dir=shared_dir,
    )

"""`etj demo`: an ElasticTrainingJob rides out a spot interruption on the local control plane.

Everything is real except the machines: the control plane (`etj cluster up`), the operator (`etj operator
run`), the scheduler's placement, and the trainer, whose worker pods run as local processes on
process-backed nodes (`localcluster.proclet`). Script: 2 on-demand + 2 spot nodes with one GPU each; the
job trains; mid-epoch one spot node gets the AWS Node Termination Handler's interruption taint and cordon,
its machine disappears after the drain; later a new spot node arrives. The live view follows the job's
status; at the end the final accuracy is printed and a timeline PNG is written. Ctrl-C cleans up.

`ClusterDemo` (cluster.py: `etj demo --operator installed`, the e2e suite's installed mode) runs the
same script on a cluster that already has the operator and real nodes, through the API only.
"""

from __future__ import annotations

import copy
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from etj_testbed.demo.scenario import Scenario, SpotInterruption
from etj_testbed.demo.script import (
    GROUP_PATH,
    INSTANCE,
    JSON,
    REPO,
    SPOT_ITN,
    DemoResult,
    Script,
    add_validation_data,
)
from etj_testbed.demo.view import Live
from etj_testbed.localcluster import toolchain
from etj_testbed.localcluster.crds import wait_established
from etj_testbed.localcluster.proclet.kube import MERGE, Kube
from etj_testbed.localcluster.proclet.launch import start_subprocess
from etj_testbed.localcluster.proclet.nodes import INSTANCE_LABEL, process_node, selector_for


class Demo:
    """The mechanics of a demo run; what happens to its machines is its `Scenario`'s (scenario.py)."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        run_dir: Path,
        manifest: JSON,
        script: Script,
        instance: str = INSTANCE,
        scenario: Scenario | None = None,
    ) -> None:
        self.scenario = scenario if scenario is not None else SpotInterruption()
        # `instance` names the nodes and the harness's selector: demos on one cluster stay apart.
        self.instance = instance
        self.kubeconfig, self.ns, self.run_dir, self.script = kubeconfig, namespace, run_dir, script
        self.kube = Kube(str(kubeconfig))
        self.manifest = manifest
        self.name: str = manifest["metadata"]["name"]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.nodes: list[str] = []
        self.result = DemoResult(status={}, run_dir=run_dir)

    # ---- set-up -----------------------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        cmd = [str(toolchain.binary("kubectl")), "--kubeconfig", str(self.kubeconfig), *args]
        out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120)
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        crds = REPO / "crds"
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
        wait_established(self.kubectl, "crd")
        self.kubectl("create", "namespace", self.ns, check=False)
        self.kubectl("delete", "etj", self.name, "-n", self.ns, "--ignore-not-found", "--wait=true")
        self.procs.append(
            start_subprocess(
                self.kubeconfig,
                self.run_dir / "proclet",
                selector_for(self.instance),
                log_file=self.run_dir / "proclet.log",
            )
        )
        operator = [
            sys.executable,
            "-m",
            "etj_operator.cli",
            "operator",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "-n",
            self.ns,
            "--metrics-port",
            "0",
            "--liveness-port",
            "0",
            "--progress-seconds",  # a livelier view than the default 10 s
            "2",
            *self.scenario.operator_args(self),
        ]
        with open(self.run_dir / "operator.log", "ab") as log:
            self.procs.append(
                subprocess.Popen(operator, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            )
        self.scenario.start(self)

    def add_node(self, name: str, capacity_type: str, gpus: int = 1) -> None:
        self.kubectl(
            "apply",
            "-f",
            "-",
            stdin=yaml.safe_dump(process_node(name, capacity_type, gpus, instance=self.instance)),
        )
        self.nodes.append(name)
        self.scenario.node_added(self, name, capacity_type)

    def remove_node(self, name: str) -> None:
        """The machine goes away without notice (the end of a notice, a chaos event)."""
        self.kubectl("delete", "node", name, "--wait=false", check=False)
        self.nodes.remove(name)

    def submit(self) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(self.job_manifest()))

    def job_manifest(self) -> JSON:
        """The job as submitted: the manifest, rewritten for where its pods run."""
        job = copy.deepcopy(self.manifest)
        job["metadata"]["namespace"] = self.ns
        spec = job["spec"]
        # Process nodes share the host's filesystem: a per-run checkpoint directory and sample log.
        spec.setdefault("checkpoint", {})["path"] = str(self.run_dir / "checkpoints")
        env = spec["trainer"].setdefault("env", [])
        env.append({"name": "ETJ_SAMPLE_LOG_DIR", "value": str(self.run_dir / "samples")})
        # Only this demo's process nodes: on a real cluster (kind) the store must not land on a real node,
        # whose pod IPs the local worker processes cannot reach, nor on another demo's nodes.
        pin = {INSTANCE_LABEL: self.instance}
        placement = spec.setdefault("placement", {})
        placement["nodeSelector"] = {**(placement.get("nodeSelector") or {}), **pin}
        rendezvous = placement.setdefault("rendezvous", {})
        rendezvous["nodeSelector"] = {**(rendezvous.get("nodeSelector") or {}), **pin}
        add_validation_data(env)
        return job

    # ---- the script -------------------------------------------------------------------------

    def job(self) -> JSON:
        path = f"{GROUP_PATH}/namespaces/{self.ns}/elastictrainingjobs/{self.name}"
        return self.kube.get_or_none(path) or {}

    def now(self) -> float:
        """Seconds since submission; 0 before it (the first nodes)."""
        return time.time() - self.result.t0 if self.result.t0 else 0.0

    def event(self, what: str) -> None:
        t = self.now()
        self.result.events.append((t, what))
        print(f"[{t:7.1f}s] {what}", flush=True)

    def interrupt(self, node: str) -> None:
        """What the AWS Node Termination Handler does on a spot interruption notice: taint and cordon."""
        current = self.kube.get(f"/api/v1/nodes/{node}")
        taints = [
            *(current["spec"].get("taints") or []),
            {"key": SPOT_ITN, "value": "spot-itn", "effect": "NoSchedule"},
        ]
        self.kube.patch(f"/api/v1/nodes/{node}", {"spec": {"taints": taints, "unschedulable": True}}, MERGE)

    def worker_nodes(self) -> dict[str, str]:
        pods = self.kube.get(f"/api/v1/namespaces/{self.ns}/pods", labelSelector=f"etj.dev/job={self.name}")
        return {
            p["metadata"]["name"]: p["spec"].get("nodeName", "")
            for p in pods.get("items") or []
            if p["metadata"].get("labels", {}).get("etj.dev/role") == "worker"
        }

    def run(self, live: Live | None = None) -> DemoResult:
        """Poll the job once a second until it ends (or the script's timeout): the scenario's turn, a
        sample, the live view."""
        self.result.t0 = time.time()
        self.submit()
        self.event(f"submitted {self.name} to namespace {self.ns}")
        self.scenario.submitted(self)
        deadline = time.monotonic() + self.script.timeout_s
        while time.monotonic() < deadline:
            job = self.job()
            self.scenario.poll(self, job)
            self.result.status = job
            status = job.get("status") or {}
            self.result.samples.append(sample(status, time.time() - self.result.t0))
            if live is not None:
                live.update(job, self.result.events)
            for proc, what in zip(self.procs, ("process-node harness", "operator"), strict=False):
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"the {what} exited ({proc.returncode}); see its log in {self.run_dir}"
                    )
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            time.sleep(1)
        return self.result

    def spot_worker_nodes(self) -> list[str]:
        """Spot nodes that host one of the job's workers (the candidates for an interruption)."""
        return [n for n in self.worker_nodes().values() if n.startswith(f"{self.instance}-spot")]

    def end_of_notice(self, victim: str, drained: bool) -> None:
        """The notice is over: the machine goes away."""
        self.kubectl("delete", "node", victim, "--wait=false")
        self.nodes.remove(victim)
        self.event(f"{victim} terminated ({'after the drain' if drained else 'notice expired'})")

    def return_capacity(self, victim: str, serial: int) -> None:
        """Spot capacity comes back: a new spot node."""
        name = f"{self.instance}-spot-{serial}"
        self.add_node(name, "spot")
        self.event(f"spot capacity is back: {name}")

    # ---- tear-down --------------------------------------------------------------------------

    def cleanup(self, delete_job: bool = True) -> None:
        self.scenario.cleanup(self)
        if delete_job:
            self.kubectl(
                "delete", "etj", self.name, "-n", self.ns, "--ignore-not-found", "--wait=false", check=False
            )
        for proc in reversed(self.procs):  # operator first, then the harness (which kills pod processes)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for node in self.nodes:
            self.kubectl("delete", "node", node, "--wait=false", check=False)
        self.kube.close()


def sample(status: JSON, t: float) -> JSON:
    """One poll's point of the timeline."""
    progress = status.get("progress") or {}
    return {
        "t": t,
        "world": status.get("worldSize") or 0,
        "sps": progress.get("samplesPerSecond"),
        "loss": progress.get("loss"),
        "epoch": progress.get("epoch"),
        "step": progress.get("step"),
    }

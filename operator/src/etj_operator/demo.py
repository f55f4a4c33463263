"""`etj demo`: an ElasticTrainingJob rides out a spot interruption on the local control plane.

Everything is real except the machines: the control plane (`etj cluster up`), the operator (`etj operator
run`), the scheduler's placement, and the trainer, whose worker pods run as local processes on
process-backed nodes (`localcluster.proclet`). Script: 2 on-demand + 2 spot nodes with one GPU each; the
job trains; mid-epoch one spot node gets the AWS Node Termination Handler's interruption taint and cordon,
its machine disappears after the drain; later a new spot node arrives. The live view follows the job's
status; at the end the final accuracy is printed and a timeline PNG is written. Ctrl-C cleans up.

`ClusterDemo` (demo_cluster.py: `etj demo --operator installed`, the e2e suite's installed mode) runs the
same script on a cluster that already has the operator and real nodes, through the API only.
"""

from __future__ import annotations

import argparse
import copy
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from etj_operator.demo_view import Live, logged_accuracy, write_timeline
from etj_operator.localcluster import toolchain
from etj_operator.localcluster.proclet import start_subprocess
from etj_operator.localcluster.proclet_kube import MERGE, Kube
from etj_operator.localcluster.proclet_nodes import INSTANCE_LABEL, process_node, selector_for

REPO = Path(__file__).resolve().parents[3]
GROUP_PATH = "/apis/etj.dev/v1alpha1"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/elastictrainingjobs.etj.dev"
SPOT_ITN = "aws-node-termination-handler/spot-itn"
INSTANCE = "demo"
JSON = dict[str, Any]


@dataclass
class Script:
    """When the demo interrupts and returns capacity (all in terms of what the job reports)."""

    interrupt_epoch: int = 1  # taint a spot node once training is inside this epoch...
    interrupt_min_world: int = 4  # ...and this many workers train
    notice_s: float = 120.0  # AWS gives 120 s; the node goes earlier if its pods are already gone
    return_after_s: float = 5.0  # new spot capacity this long after the interrupted node is gone
    timeout_s: float = 1800.0


@dataclass
class DemoResult:
    status: JSON
    samples: list[JSON] = field(default_factory=list)  # one per poll: t, world, sps, loss, epoch, step
    events: list[tuple[float, str]] = field(default_factory=list)  # the demo's own actions
    run_dir: Path = Path()
    t0: float = 0.0

    @property
    def phase(self) -> str | None:
        return (self.status.get("status") or {}).get("phase")


class Demo:
    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        run_dir: Path,
        manifest: JSON,
        script: Script,
        instance: str = INSTANCE,
    ) -> None:
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
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
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
        ]
        with open(self.run_dir / "operator.log", "ab") as log:
            self.procs.append(
                subprocess.Popen(operator, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            )
        for name, ctype in (
            ("od-1", "on-demand"),
            ("od-2", "on-demand"),
            ("spot-1", "spot"),
            ("spot-2", "spot"),
        ):
            self.add_node(f"{self.instance}-{name}", ctype)

    def add_node(self, name: str, capacity_type: str) -> None:
        self.kubectl(
            "apply",
            "-f",
            "-",
            stdin=yaml.safe_dump(process_node(name, capacity_type, 1, instance=self.instance)),
        )
        self.nodes.append(name)

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

    def event(self, what: str) -> None:
        self.result.events.append((time.time() - self.result.t0, what))
        print(f"[{time.time() - self.result.t0:7.1f}s] {what}", flush=True)

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
        self.result.t0 = time.time()
        self.submit()
        self.event(f"submitted {self.name} to namespace {self.ns}")
        stage, victim, stage_at, spare = "train", "", 0.0, 3
        deadline = time.monotonic() + self.script.timeout_s
        while time.monotonic() < deadline:
            job = self.job()
            self.result.status = job
            status = job.get("status") or {}
            progress = status.get("progress") or {}
            self.result.samples.append(
                {
                    "t": time.time() - self.result.t0,
                    "world": status.get("worldSize") or 0,
                    "sps": progress.get("samplesPerSecond"),
                    "loss": progress.get("loss"),
                    "epoch": progress.get("epoch"),
                    "step": progress.get("step"),
                }
            )
            if live is not None:
                live.update(job, self.result.events)
            for proc, what in zip(self.procs, ("process-node harness", "operator"), strict=False):
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"the {what} exited ({proc.returncode}); see its log in {self.run_dir}"
                    )
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            epoch, world = progress.get("epoch") or 0, status.get("worldSize") or 0
            # Interrupt at full size; if full size never comes, a epoch later anyway.
            due = epoch >= self.script.interrupt_epoch and (
                world >= self.script.interrupt_min_world or epoch > self.script.interrupt_epoch
            )
            if stage == "train" and due:
                spot = self.spot_worker_nodes()
                if spot:
                    victim = sorted(spot)[0]
                    self.interrupt(victim)
                    stage, stage_at = "notice", time.monotonic()
                    self.event(f"spot interruption notice on {victim} (taint {SPOT_ITN}:NoSchedule, cordon)")
            elif stage == "notice":
                drained = victim not in self.worker_nodes().values()
                if drained or time.monotonic() - stage_at > self.script.notice_s:
                    self.end_of_notice(victim, drained)
                    stage, stage_at = "gone", time.monotonic()
            elif stage == "gone" and time.monotonic() - stage_at > self.script.return_after_s:
                self.return_capacity(victim, spare)
                stage = "returned"
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


def add_validation_data(env: list[JSON]) -> None:
    names = {e["name"]: e.get("value") for e in env}
    if "ETJ_VAL_DATA" not in names and names.get("ETJ_DATA"):
        # Without validation data the trainer reports no accuracy, and the demo ends by printing it.
        env.append({"name": "ETJ_VAL_DATA", "value": names["ETJ_DATA"]})


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="etj demo", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--kubeconfig", type=Path, help="use this cluster instead of starting the local one")
    p.add_argument(
        "--operator",
        choices=["local", "installed"],
        default="local",
        help="local: start the operator, the process-node harness and process nodes here (default); "
        "installed: use the operator already installed on --kubeconfig's cluster (the chart) and its own "
        "nodes, and interrupt a spot node through the API",
    )
    p.add_argument(
        "--trainer-image",
        help="installed: spec.trainer.image (default: none, so the operator's default trainer image is used)",
    )
    p.add_argument("--image-pull-policy", choices=["Always", "IfNotPresent", "Never"], help="installed")
    p.add_argument(
        "--shared-dir",
        type=Path,
        help="installed: a directory this machine and every node see at the same path (kind extraMounts); "
        "checkpoints and sample logs go there (the run directory is placed inside it)",
    )
    p.add_argument("--namespace", default="etj-demo")
    p.add_argument("--manifest", type=Path, default=REPO / "examples" / "demo-cpu.yaml")
    p.add_argument("--timeline", type=Path, default=REPO / "docs" / "demo-timeline.png")
    p.add_argument(
        "--run-dir", type=Path, help="logs, checkpoints, sample logs (default: a new dir in the cache)"
    )
    p.add_argument(
        "--no-reference",
        dest="reference",
        action="store_false",
        help="skip the fixed-size reference run whose accuracy is printed next to the elastic run's",
    )
    p.add_argument("--interrupt-epoch", type=int, default=Script.interrupt_epoch)
    p.add_argument("--return-after", type=float, default=Script.return_after_s, help="seconds")
    p.add_argument("--timeout", type=float, default=Script.timeout_s, help="seconds")
    p.add_argument(
        "--keep", action="store_true", help="leave the job (not the processes) in place at the end"
    )
    return p.parse_args(argv)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(argv: list[str]) -> int:
    args = parse_args(argv)
    installed = args.operator == "installed"
    if installed and args.kubeconfig is None:
        print(
            "etj demo: --operator installed needs --kubeconfig (a cluster with the chart installed)",
            file=sys.stderr,
        )
        return 2
    if args.kubeconfig is None:
        from etj_operator.localcluster.cluster import LocalCluster

        print("starting the local control plane (first run builds it; see README)…", file=sys.stderr)
        args.kubeconfig = LocalCluster.named().up()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = args.shared_dir / "demo" if installed and args.shared_dir else toolchain.cache_root() / "demo"
    run_dir = args.run_dir or base / stamp

    from etj_operator.demo_cluster import make_demo  # it imports this module

    def demo(namespace: str, run: Path, job: JSON, script: Script, instance: str) -> Demo:
        return make_demo(
            args.kubeconfig,
            namespace,
            run,
            job,
            script,
            instance,
            installed=installed,
            trainer_image=args.trainer_image,
            pull_policy=args.image_pull_policy,
            shared_dir=args.shared_dir if installed else None,
        )

    manifest = yaml.safe_load(args.manifest.read_text())
    script = Script(args.interrupt_epoch, return_after_s=args.return_after, timeout_s=args.timeout)
    # Ctrl-C and SIGTERM both end in the cleanup below; SIGINT may arrive ignored (a background job of a
    # script), so its handler is set explicitly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    contents = "checkpoints, samples" if installed else "operator.log, proclet.log, pods/*/*.log"
    print(f"run directory: {run_dir} ({contents})", file=sys.stderr)
    try:
        result = _run_one(demo(args.namespace, run_dir, manifest, script, INSTANCE), args.keep)
        status = result.status.get("status") or {}
        print(f"\njob {result.phase}; resizes:")
        for r in status.get("resizeHistory") or []:
            print(
                f"  {r.get('from')}→{r.get('to')} {r.get('reason')}: pause {r.get('pauseSeconds')} s, "
                f"steps lost {r.get('stepsLost')}"
            )
        print(f"timeline: {write_timeline(result, args.timeline)}")
        rows = [("elastic run (spot interruption and return)", _accuracy(result, run_dir))]
        if args.reference and result.phase == "Succeeded":
            # The question a user asks: what did the interruption cost? Same job and seed at the full
            # size throughout, no interruption (the e2e test asserts the same comparison).
            size = manifest["spec"]["replicas"]["max"]
            fixed = copy.deepcopy(manifest)
            fixed["spec"]["replicas"]["min"] = size
            never = Script(interrupt_epoch=10**6, timeout_s=args.timeout)
            print(f"\nreference: the same job on a fixed {size} workers, no interruption…", file=sys.stderr)
            ref_dir = run_dir / "fixed-size"
            ref = _run_one(demo(f"{args.namespace}-fixed", ref_dir, fixed, never, "fixed"), False)
            rows.append((f"fixed-size run ({size} workers, no interruption)", _accuracy(ref, ref_dir)))
    except KeyboardInterrupt:
        print("\ninterrupted: cleaning up", file=sys.stderr)
        return 130
    print("\nfinal validation accuracy:")
    for label, accuracy in rows:
        print(f"  {label:<48} {'-' if accuracy is None else f'{accuracy:.4f}'}")
    if len(rows) == 2 and rows[0][1] is not None and rows[1][1] is not None:
        print(f"  difference: {100 * (rows[0][1] - rows[1][1]):+.2f} percentage points")
    return 0 if result.phase == "Succeeded" else 1


def _run_one(demo: Demo, keep: bool) -> DemoResult:
    try:
        demo.start()
        with Live() as live:
            return demo.run(live)
    finally:
        demo.cleanup(delete_job=not keep)


def _accuracy(result: DemoResult, run_dir: Path) -> float | None:
    status = result.status.get("status") or {}
    accuracy: float | None = (status.get("progress") or {}).get("accuracy")
    return accuracy if accuracy is not None else logged_accuracy(run_dir)

"""Which cluster the end-to-end suite runs on, and how, from the environment.

- default (``ETJ_E2E_OPERATOR`` unset or ``local``): the local control plane (the `cluster` fixture), or the
  cluster of ``ETJ_E2E_KUBECONFIG``; either way the operator, the process-node harness and process-backed
  nodes are started on this machine (`etj_testbed.demo.local.Demo`), as `etj demo` does;
- ``ETJ_E2E_OPERATOR=installed``: the cluster of ``ETJ_E2E_KUBECONFIG`` (required) already runs the
  operator (the Helm chart) and has the nodes (kind's CPU workers labelled ``etj.dev/capacity-type``);
  nothing is started here and interruptions go through the API (`etj_testbed.demo.cluster.ClusterDemo`).
  ``ETJ_E2E_TRAINER_IMAGE`` is spec.trainer.image (unset: the operator's default trainer image),
  ``ETJ_E2E_IMAGE_PULL_POLICY`` its pull policy, and ``ETJ_E2E_SHARED_DIR`` a directory this machine and
  every node see at the same path (kind extraMounts): checkpoints and the per-rank sample logs go there,
  which the exactly-once check reads. Without it that check is skipped.

``ETJ_E2E_EPOCHS`` (default 6) sets the training length in both modes.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from etj_testbed.demo.cluster import make_demo
from etj_testbed.demo.local import Demo
from etj_testbed.demo.script import DemoResult, Script
from etj_testbed.demo.view import write_timeline
from etj_testbed.localcluster.toolchain import cache_root

REPO = Path(__file__).resolve().parents[2]

MODES = ("local", "installed")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


@dataclass(frozen=True)
class E2EConfig:
    installed: bool = False
    kubeconfig: Path | None = None  # None: the local control plane
    trainer_image: str | None = None
    pull_policy: str | None = None
    shared_dir: Path | None = None
    epochs: int = 6

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> E2EConfig:
        env = os.environ if env is None else env
        mode = env.get("ETJ_E2E_OPERATOR") or "local"
        if mode not in MODES:
            raise ValueError(f"ETJ_E2E_OPERATOR={mode!r}: expected one of {', '.join(MODES)}")
        kubeconfig = Path(env["ETJ_E2E_KUBECONFIG"]) if env.get("ETJ_E2E_KUBECONFIG") else None
        installed = mode == "installed"
        if installed and kubeconfig is None:
            raise ValueError(
                "ETJ_E2E_OPERATOR=installed needs ETJ_E2E_KUBECONFIG: the cluster whose installed operator "
                "and nodes run the jobs (the local control plane's nodes cannot run container images)"
            )
        pull = env.get("ETJ_E2E_IMAGE_PULL_POLICY") or None
        if pull is not None and pull not in PULL_POLICIES:
            raise ValueError(
                f"ETJ_E2E_IMAGE_PULL_POLICY={pull!r}: expected one of {', '.join(PULL_POLICIES)}"
            )
        local_only = [
            name
            for name in ("ETJ_E2E_TRAINER_IMAGE", "ETJ_E2E_IMAGE_PULL_POLICY", "ETJ_E2E_SHARED_DIR")
            if env.get(name) and not installed
        ]
        if local_only:
            # Process-backed pods run no image and share this machine's disk: these would be ignored.
            raise ValueError(f"{', '.join(local_only)} only apply with ETJ_E2E_OPERATOR=installed")
        shared = Path(env["ETJ_E2E_SHARED_DIR"]) if env.get("ETJ_E2E_SHARED_DIR") else None
        return cls(
            installed=installed,
            kubeconfig=kubeconfig,
            trainer_image=env.get("ETJ_E2E_TRAINER_IMAGE") or None,
            pull_policy=pull,
            shared_dir=shared,
            epochs=int(env.get("ETJ_E2E_EPOCHS") or 6),
        )

    @property
    def reads_sample_logs(self) -> bool:
        """Whether this machine can read the workers' sample logs (process pods write them here)."""
        return not self.installed or self.shared_dir is not None

    def run_root(self) -> Path:
        """Where this session's run directories go: kept after the session for whoever debugs a failure."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        if self.installed and self.shared_dir is not None:
            return self.shared_dir / "e2e" / stamp  # the nodes write checkpoints and sample logs here
        return cache_root() / "e2e" / stamp

    def run(
        self, kubeconfig: Path, run_dir: Path, manifest: dict[str, Any], script: Script, tag: str
    ) -> DemoResult:
        """Run one job under ``script`` in a namespace of its own; the timeline stays in ``run_dir``."""
        suffix = uuid.uuid4().hex[:5]
        demo = self.demo(kubeconfig, f"e2e-{tag}-{suffix}", run_dir, manifest, script, f"e2e{tag}{suffix}")
        try:
            demo.start()
            result = demo.run()
        finally:
            demo.cleanup(delete_job=True)
        write_timeline(result, run_dir / "timeline.png")  # kept with the logs for whoever debugs a failure
        return result

    def demo(
        self,
        kubeconfig: Path,
        namespace: str,
        run_dir: Path,
        manifest: dict[str, Any],
        script: Script,
        instance: str,
    ) -> Demo:
        return make_demo(
            kubeconfig,
            namespace,
            run_dir,
            manifest,
            script,
            instance,
            installed=self.installed,
            trainer_image=self.trainer_image,
            pull_policy=self.pull_policy,
            shared_dir=self.shared_dir,
        )


# How far an elastic run's final accuracy may be from the same job's fixed-size run, in percentage points.
ACCURACY_POINTS = 0.5


def demo_job() -> dict[str, Any]:
    """A fresh copy of the demo's job (examples/demo-cpu.yaml), for a test to adjust."""
    job: dict[str, Any] = yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    return job

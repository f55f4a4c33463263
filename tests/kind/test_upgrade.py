"""`helm upgrade` from the previous release to this one under a training job, then `helm rollback` (issue 38).

Release N-1 is main at PREVIOUS (the commit that brought `make release`), released from its own tree with
this checkout's release scripts; release N is this checkout. Between them: a CRD field with a default
(spec.checkpoint.maxFailedWrites), a new operator (the token Secret's derived name, least-privilege RBAC
changes, the PodsBlocked and CheckpointDurable conditions) and a new store image (the relay's framing and
deadlines, /readyz). Both are pushed to the registry on the kind network and installed from it, so every
node pulls as a user's nodes do.

What an upgrade must not do to a running job, each checked: restart a worker or the store (pod uids and
restart counts), count a failure, lose status (start time, resize history, counters) or stop training; the
new operator takes the Lease within its lease time. The same after the rollback, and the job then ends
Succeeded with every sample once per epoch.

kind_full (`make e2e-kind`): two releases are built and pushed (minutes, from Docker's layer cache after
`make kind`), and the job trains through both helm operations. The dev install is put back afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.e2econfig import E2EConfig
from tests.kind.kindbed import (
    KIND_SH,
    REPO,
    KindBed,
    RunningJob,
    exactly_once,
    running_job,
    two_worker_job,
    wait_for,
)
from tests.kind.test_release import NAMESPACE, RELEASE, image_ids, release_env, run

pytestmark = [pytest.mark.kind, pytest.mark.kind_full, pytest.mark.slow]

PREVIOUS = "a250ed1"  # main when `make release` landed: release N-1
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/etj-operator"
LEASE_SECONDS, RETRY_SECONDS = 15, 2  # the chart's leaderElection defaults
EPOCHS = 24  # about 9 minutes at 0.5 s a step: through both helm operations
JSON = dict[str, Any]


def release(tree: Path, version: str, tmp: Path) -> str:
    """`scripts/release.sh all` of ``tree`` at ``version`` to the kind registry (CPU images): the chart's
    OCI reference."""
    out = subprocess.run(
        [str(tree / "scripts" / "release.sh"), "all"],
        cwd=tree,
        env={**os.environ, **release_env(version, tmp)},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert out.returncode == 0, f"release {version} from {tree}:\n{out.stderr[-6000:]}"
    return out.stdout.strip().splitlines()[-1]


def previous_tree(tmp: Path) -> Path:
    """PREVIOUS's files, with this checkout's release scripts (the tooling, not the product: release N-1
    as that commit's code, CRD, chart and Dockerfiles)."""
    tree = tmp / "previous"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    shutil.rmtree(tree / "scripts")
    shutil.copytree(REPO / "scripts", tree / "scripts")
    return tree


def helm(kind: KindBed, *args: str) -> str:
    return run(["helm", *args, "--namespace", NAMESPACE, "--kubeconfig", str(kind.kubeconfig)], timeout=900)


def install(kind: KindBed, chart: str, version: str) -> float:
    """`helm upgrade --install` of ``chart`` at ``version`` with kind's values; seconds it took."""
    t0 = time.monotonic()
    values = str(KIND_SH.parent / "kind" / "operator-values.yaml")
    helm(kind, "upgrade", "--install", RELEASE, chart, "--version", version, "--plain-http",
         "--values", values, "--wait", "--timeout", "10m")  # fmt: skip
    return time.monotonic() - t0


def operator_digest(kind: KindBed) -> str:
    values = json.loads(helm(kind, "get", "values", RELEASE, "--all", "-o", "json"))
    return str(values["image"]["digest"])


def holder(kind: KindBed) -> str | None:
    """The operator pod holding the leader Lease (its identity is the pod's name and a suffix)."""
    lease: JSON = kind.kube.get_or_none(LEASE) or {}
    who = str((lease.get("spec") or {}).get("holderIdentity") or "")
    return who.rsplit("-", 1)[0] if who else None


def leader_runs(kind: KindBed, digest: str) -> Callable[[], str | None]:
    """The Lease's holder, once it is a running operator pod of ``digest``."""

    def check() -> str | None:
        pods = {
            p["metadata"]["name"]: p
            for p in kind.pods(NAMESPACE, "app.kubernetes.io/component=operator")
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        }
        who = holder(kind)
        if who in pods and all(digest in i for i in image_ids(pods[who])):
            return who
        return None

    return check


def job_pods(run_: RunningJob) -> dict[str, tuple[str, int]]:
    """Every pod of the job → (uid, restarts): a restart or a replacement changes it."""
    return {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses") or []),
        )
        for p in run_.bed.pods(run_.ns, f"etj.dev/job={run_.name}")
        if not p["metadata"].get("deletionTimestamp")
    }


def kept(before: JSON) -> Callable[[JSON], list[str]]:
    """What of ``before`` (a status) a later status lost: start time, resize history, failures."""

    def lost(now: JSON) -> list[str]:
        out = []
        if now.get("startTime") != before.get("startTime"):
            out.append(f"startTime {before.get('startTime')} -> {now.get('startTime')}")
        if (now.get("resizeHistory") or [])[: len(before.get("resizeHistory") or [])] != (
            before.get("resizeHistory") or []
        ):
            out.append("resizeHistory")
        if now.get("failures"):
            out.append(f"failures {now.get('failures')}")
        return out

    return lost


class LeaderWatch:
    """Samples the Lease's holder twice a second while a helm operation runs: the longest time no running
    operator pod held it is the handover's gap."""

    def __init__(self, kind: KindBed) -> None:
        self.kind, self.gap, self._stop = kind, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="leader-watch")

    def _run(self) -> None:
        leaderless_since: float | None = None
        while not self._stop.wait(0.5):
            try:
                led = leader_runs(self.kind, "")() is not None
            except Exception:  # an apiserver hiccup is not a leader change
                continue
            now = time.monotonic()
            if led:
                leaderless_since = None
            elif leaderless_since is None:
                leaderless_since = now
            if leaderless_since is not None:
                self.gap = max(self.gap, now - leaderless_since)

    def __enter__(self) -> LeaderWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def through(kind: KindBed, run_: RunningJob, what: str, act: Callable[[], float]) -> JSON:
    """Do ``act`` (a helm operation) under the training job, then check the job did not notice: the same
    pods, nothing counted, status kept, a leader of the release's operator in place with no gap longer than
    the lease time, training on."""
    pods_before, status_before = job_pods(run_), run_.status()
    with LeaderWatch(kind) as watch:
        helm_s = act()
        leader = wait_for(f"the {what} operator leading", leader_runs(kind, operator_digest(kind)), 300)
    # kopf's leader releases the Lease on SIGTERM, so the new one need not wait the lease out; at worst it
    # waits one lease time and a retry.
    assert watch.gap <= LEASE_SECONDS + RETRY_SECONDS, (what, watch.gap)
    step = run_.step()
    run_.wait(f"training on after the {what}", lambda: run_.step() >= step + 10, timeout=300)
    assert job_pods(run_) == pods_before, (what, pods_before, job_pods(run_))
    lost = kept(status_before)(run_.status())
    assert not lost, (what, lost)
    return {"helm_s": round(helm_s, 1), "leaderless_s": round(watch.gap, 1), "leader": leader}


@pytest.mark.timeout(3000)  # two releases built and pushed, a nine-minute job through two helm operations
def test_an_upgrade_and_a_rollback_under_a_training_job_leave_it_training(
    kind: KindBed, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    old_version, new_version = f"0.0.1-up.{tag}", f"0.0.2-up.{tag}"
    t0 = time.monotonic()
    old_chart = release(previous_tree(tmp_path), old_version, tmp_path)
    new_chart = release(REPO, new_version, tmp_path)
    built_s = time.monotonic() - t0
    report: JSON = {"release_both_s": round(built_s, 1)}
    try:
        report["install_previous_s"] = round(install(kind, old_chart, old_version), 1)
        old_digest = operator_digest(kind)
        wait_for("the previous operator leading", leader_runs(kind, old_digest), 300)
        crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/elastictrainingjobs.etj.dev"

        def has_new_field() -> bool:
            spec = kind.kube.get(crd)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            checkpoint = spec["properties"]["spec"]["properties"]["checkpoint"]["properties"]
            return "maxFailedWrites" in checkpoint

        assert not has_new_field()  # N-1's CRD
        config = E2EConfig(
            installed=True, kubeconfig=kind.kubeconfig, trainer_image=None, pull_policy="IfNotPresent",
            shared_dir=kind.shared_dir, epochs=EPOCHS,
        )  # fmt: skip
        job = two_worker_job(EPOCHS, 0.5)
        job["spec"]["trainer"].pop("image", None)  # the release's default trainer, pulled by digest
        with running_job(kind, f"upgrade-{tag}", job, EPOCHS, config=config) as run_:
            run_.wait("two workers training", lambda: run_.training_workers(2, min_step=5), timeout=900)
            report["upgrade"] = through(kind, run_, "upgraded", lambda: install(kind, new_chart, new_version))
            assert operator_digest(kind) != old_digest
            assert has_new_field()
            spec = kind.kube.get(
                f"/apis/etj.dev/v1alpha1/namespaces/{run_.ns}/elastictrainingjobs/{run_.name}"
            )
            assert spec["spec"]["checkpoint"].get("maxFailedWrites") == 3  # the new default, read back

            def rollback() -> float:
                t = time.monotonic()
                helm(kind, "rollback", RELEASE, "--wait", "--timeout", "10m")
                return time.monotonic() - t

            report["rollback"] = through(kind, run_, "rolled back", rollback)
            assert operator_digest(kind) == old_digest
            assert not has_new_field()
            result = run_.result()
        status = result.status.get("status") or {}
        assert result.phase == "Succeeded", (status.get("conditions"), run_.run_dir)
        assert not status.get("failures"), status
        exactly_once(run_.run_dir, EPOCHS)
        print("upgrade on kind:", report)
        (kind.shared_dir / "upgrade.json").write_text(json.dumps(report, indent=1))
    finally:
        run([str(KIND_SH), "install"], timeout=900)  # the dev install again, as the other tests expect

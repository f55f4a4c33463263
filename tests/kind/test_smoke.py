"""The kind smoke test (part of `make test` where Docker is installed): etj as it ships, on a real kubelet.

The chart's operator (installed by Helm, in-cluster, with the chart's RBAC) runs a short job in the CPU
trainer image on kind's workers. While it trains, a pod in another namespace tries the job's store: the
TCPStore port and the HTTP endpoint must both be closed to it (the job's NetworkPolicy, enforced by the
cluster's engine), while a Service without a policy answers it (so "closed" is the policy, not a broken
prober). Mid-training a spot worker gets the AWS termination handler's taint and a cordon. The job must
leave in place (no step lost, no failure counted), finish, report its accuracy, and have trained every
sample exactly once per epoch (the per-rank sample logs in the directory kind mounts into every worker).
"""

from __future__ import annotations

import uuid

import pytest

from etj_contract.ports import PROGRESS_PORT, RDZV_PORT
from etj_testbed.demo.script import Script
from tests.kind.kindbed import KindBed, Prober, exactly_once, running_job, two_worker_job

pytestmark = [pytest.mark.slow, pytest.mark.kind]

EPOCHS = 4
KUBE_DNS = ("kube-dns.kube-system.svc.cluster.local", 53)  # a Service no NetworkPolicy selects


def test_a_job_trains_behind_its_policy_and_leaves_a_spot_node_in_place(kind: KindBed) -> None:
    script = Script(interrupt_epoch=1, interrupt_min_world=2, return_after_s=5, timeout_s=1200)
    prober = Prober(kind, f"kind-prober-{uuid.uuid4().hex[:5]}")
    prober.start()
    try:
        with running_job(kind, "smoke", two_worker_job(EPOCHS, 0.3), EPOCHS, script) as run:
            store_ip = run.wait(
                "the store running and a first step",
                lambda: (
                    run.step() >= 1
                    and next(
                        (
                            p["status"].get("podIP")
                            for p in run.pods("rendezvous")
                            if p["status"].get("podIP")
                        ),
                        None,
                    )
                ),
            )
            assert prober.connect(*KUBE_DNS) == "open"
            tried = {
                "TCPStore": prober.connect(store_ip, RDZV_PORT),
                "HTTP endpoint": prober.connect(store_ip, PROGRESS_PORT, "http"),
            }
            assert all(v.startswith("closed") for v in tried.values()), tried
            result = run.result()
    finally:
        prober.close()
    status = result.status.get("status") or {}

    assert result.phase == "Succeeded", (run.run_dir, status.get("conditions"))
    assert [what for _, what in result.events if "interruption" in what], result.events
    history = status.get("resizeHistory") or []
    spot = [r for r in history if r["to"] < r["from"] and "Spot" in (r.get("reason") or "")]
    assert spot, history
    # In place: a graceful leave redoes no step and no worker failed (a restart would count one).
    assert spot[0].get("pauseSeconds") is not None and not spot[0].get("stepsLost"), spot
    assert not status.get("failures"), status
    accuracy = (status.get("progress") or {}).get("accuracy")
    assert accuracy is not None and accuracy > 0.5, status.get("progress")
    exactly_once(run.run_dir, EPOCHS)

"""The operator warns when NetworkPolicy is not declared enforced, and `etj check network-policy` finds out
(issue 37 item 5). The local bed's network enforces no NetworkPolicy (like EKS's VPC CNI without its policy
agent): the job's policy is stored and ignored, so the job gets the Warning and the check says NOT ENFORCED
(its probe, a process pod outside the job, reaches the job's real store on its progress port)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from etj_operator.decide.objects.netpol import NOT_ENFORCED
from tests.integration.opbed import Bed, operator_and_a_store_node, running_store_ip
from tests.plugins.cluster import Cluster


@pytest.mark.cluster
def test_an_unenforced_network_policy_is_warned_about_and_the_check_finds_it_out(
    bed: Bed, cluster: Cluster, tmp_path: Path
) -> None:
    with operator_and_a_store_node(bed, cluster, tmp_path):  # networkPolicy.enforced: unknown (default)
        bed.node("spot-0", "spot")
        bed.create_job("open", max_workers=1)
        bed.wait("the Warning", lambda: any(e.reason == NOT_ENFORCED for e in bed.events("open")), 90)
        (event,) = [e for e in bed.events("open") if e.reason == NOT_ENFORCED]
        assert event.type == "Warning" and f"etj check network-policy -n {bed.ns} open" in event.message

        bed.wait("the store process running", lambda: running_store_ip(bed, "open") is not None, 180)

        def store_ready() -> bool:
            pods = bed.pods("open", "rendezvous")
            return any(
                c.type == "Ready" and c.status == "True" for p in pods for c in p.status.conditions or []
            )

        bed.wait("the store Ready (the check probes a Ready store only)", store_ready, 120)
        check = [sys.executable, "-m", "etj_operator.cli", "check", "network-policy", "-n", bed.ns, "open"]
        ran = subprocess.run(
            [*check, "--kubeconfig", str(cluster.kubeconfig)], capture_output=True, text=True, timeout=300
        )
        assert ran.returncode == 1, ran.stdout + ran.stderr
        assert ran.stdout.startswith("NOT ENFORCED: a pod outside job open reached open's store port 29401")
        # The probe is gone; the job's pods are as they were.
        leftover = bed.core.list_namespaced_pod(
            bed.ns, label_selector="app.kubernetes.io/name=etj-network-policy-probe"
        )
        assert not [p for p in leftover.items if not p.metadata.deletion_timestamp]

"""The operator warns when the job's NetworkPolicy is not known to be enforced (issue 37 item 5): an
unenforcing CNI stores the policy and ignores it, and nothing said so. The pure parts: the Warning, the
check's probe pod and its verdict (on the real apiserver: tests/integration/test_netpol_check.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from etj_operator.decide.objects.netpol import (
    NOT_ENFORCED,
    NOT_REACHED,
    PROBE,
    REACHED,
    Enforced,
    enforcement_warning,
    probe_pod,
    verdict,
)
from etj_operator.k8s.main import build_state, parse_args

IDS = {"namespace": "ml", "job": "train"}


@pytest.mark.parametrize("enforced", list(Enforced))
@pytest.mark.parametrize("network_policy", [True, False])
def test_a_warning_unless_enforcement_is_declared(enforced: Enforced, network_policy: bool) -> None:
    event = enforcement_warning(enforced, network_policy=network_policy, **IDS)
    if enforced == Enforced.TRUE:
        assert event is None
        return
    assert event is not None and (event.type, event.reason) == ("Warning", NOT_ENFORCED)
    assert "etj check network-policy -n ml train" in event.message  # how to find out
    assert "every pod of the cluster can reach this job's store" in event.message
    assert ("--no-network-policy" in event.message) == (not network_policy)


def test_the_flag_defaults_to_unknown_and_reaches_the_settings() -> None:
    assert build_state(parse_args([])).settings.network_policy_enforced == Enforced.UNKNOWN
    on = build_state(parse_args(["--network-policy-enforced=true"])).settings
    assert on.network_policy_enforced == Enforced.TRUE


STORE = {
    "metadata": {"name": "train-rdzv-0", "labels": {"etj.dev/job": "train", "etj.dev/role": "rendezvous"}},
    "spec": {
        "containers": [{"image": "etj-store:1", "imagePullPolicy": "Never"}],
        "nodeName": "od-3",
        "nodeSelector": {"pool": "od"},
        "tolerations": [{"key": "t", "operator": "Exists"}],
    },
}


def test_the_probe_is_outside_the_job_and_on_its_stores_node() -> None:
    pod = probe_pod(name="p", namespace="ml", store=STORE, store_ip="10.0.0.7")
    assert "etj.dev/job" not in pod["metadata"]["labels"]  # the job's policy admits the job's pods only
    assert (
        pod["spec"]["nodeName"] == "od-3"
        and "nodeSelector" not in pod["spec"]
        and pod["spec"]["tolerations"] == STORE["spec"]["tolerations"]
    )
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "etj-store:1" and container["command"][-2:] == ["10.0.0.7", "29401"]
    assert pod["spec"]["restartPolicy"] == "Never"


def test_the_probe_script_exits_reached_or_not() -> None:
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        ok = subprocess.run([sys.executable, "-c", PROBE, "127.0.0.1", str(port)], capture_output=True)
    assert ok.returncode == REACHED
    refused = subprocess.run([sys.executable, "-c", PROBE, "127.0.0.1", str(port)], capture_output=True)
    assert refused.returncode == NOT_REACHED


def test_the_verdict() -> None:
    assert verdict(REACHED, **IDS)[0] == 1 and "NOT ENFORCED" in verdict(REACHED, **IDS)[1]
    assert verdict(NOT_REACHED, **IDS)[0] == 0 and verdict(NOT_REACHED, **IDS)[1].startswith("enforced")
    assert verdict(None, **IDS)[0] == 2 and verdict(137, **IDS)[0] == 2

"""`etj check network-policy -n NS JOB`: does the cluster enforce the job's NetworkPolicy?

The declared side of the question is decide/objects/netpol.py.

It starts a probe pod outside the job, placed like the job's store and run from its image, that tries to
open the store's progress port, waits for it to end, deletes it and says what it saw: exit 0 enforced, 1
not enforced, 2 inconclusive (no Ready store, or the probe did not run to its end). Run it as a user who may
create pods in the namespace; the operator never runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import uuid
from typing import Any, cast

from kubernetes import client

from etj_operator.constants import LABEL_JOB, LABEL_ROLE, ROLE_RENDEZVOUS
from etj_operator.decide.objects.netpol import probe_pod, verdict
from etj_operator.k8s import kube_api


def _ready_store(core: client.CoreV1Api, namespace: str, job: str) -> dict[str, Any] | None:
    selector = f"{LABEL_JOB}={job},{LABEL_ROLE}={ROLE_RENDEZVOUS}"
    for pod in cast(Any, core.list_namespaced_pod(namespace, label_selector=selector)).items:
        body = client.ApiClient().sanitize_for_serialization(pod)
        conditions = (body.get("status") or {}).get("conditions") or []
        if body["status"].get("podIP") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in conditions
        ):
            return cast(dict[str, Any], body)
    return None


def _exit_code(core: client.CoreV1Api, namespace: str, name: str, timeout: float) -> int | None:
    """The probe's exit code once it has ended; None if it did not end within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod: Any = core.read_namespaced_pod(name, namespace)
        for status in pod.status.container_statuses or []:
            if status.state and status.state.terminated:
                return int(status.state.terminated.exit_code)
        time.sleep(1)
    return None


def check(core: client.CoreV1Api, namespace: str, job: str, timeout: float = 120) -> tuple[int, str]:
    store = _ready_store(core, namespace, job)
    if store is None:
        return 2, f"inconclusive: job {job} in {namespace} has no Ready store pod to probe"
    name = f"etj-netpol-probe-{uuid.uuid4().hex[:6]}"
    body = probe_pod(name=name, namespace=namespace, store=store, store_ip=store["status"]["podIP"])
    core.create_namespaced_pod(namespace, cast(Any, body))
    try:
        code = _exit_code(core, namespace, name, timeout)
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    return verdict(code, namespace=namespace, job=job)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="etj check network-policy", description=__doc__.splitlines()[0])
    p.add_argument("job", help="a running job whose store pod is Ready")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--timeout", type=float, default=120, help="seconds to wait for the probe to end")
    args = p.parse_args(argv)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    core = client.CoreV1Api(kube_api.api_client())
    status, message = check(core, args.namespace, args.job, args.timeout)
    print(message)
    return status

"""The job's closed data plane (docs/operator.md, "Threat model"), on real processes and the real apiserver.

- the store server (a real ``etj-train store`` process) answers ``/progress`` only with the job's token and
  refuses oversized bodies unread; the operator's client reads with the token;
- the operator creates, before any pod, the job's token Secret (pods name it, never carry the value) and a
  NetworkPolicy that admits only the job's own pods and, on the progress port, the operator.

The local cluster enforces no NetworkPolicy, so the policy is checked as the object the apiserver stored.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from etj_contract import env as etj_env
from etj_contract.ports import PROGRESS_PORT
from etj_contract.progress import MAX_BODY_BYTES, PROGRESS_PATH
from etj_contract.replicas import REPLICAS_PATH, Replicas
from etj_operator.decide.objects.dataplane import job_token, token_secret_name
from etj_operator.k8s.store_client import StoreClient
from etj_trainer.agent.local_launcher import free_port
from etj_trainer.core.progress import get_json, post_json
from etj_trainer.resize import bounds
from tests.integration.opbed import Bed, OperatorProcess
from tests.plugins.cluster import Cluster

TOKEN = "s3cret-token"
STORE_PORT = [0]  # the TCPStore's port of the module's store process


def _status(url: str, body: bytes | None, headers: dict[str, str]) -> int:
    req = urllib.request.Request(
        url, data=body, headers=headers, method="POST" if body is not None else "GET"
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError:
        return 0  # not listening (yet)


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `etj-train store` with the job's token in its environment, as the operator starts it."""
    tmp_path = tmp_path_factory.mktemp("store")
    http_port = free_port()
    env = {**os.environ, etj_env.PROGRESS_TOKEN.name: TOKEN}
    STORE_PORT[0] = free_port()
    cmd = [sys.executable, "-m", "etj_trainer.cli", "store", "--host", "127.0.0.1",
           "--port", str(STORE_PORT[0]), "--http-port", str(http_port)]  # fmt: skip
    log = open(tmp_path / "store.log", "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    url = f"http://127.0.0.1:{http_port}/progress"
    try:
        deadline = time.monotonic() + 120
        while _status(url.replace("progress", "healthz"), None, {}) != 200:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "store.log").read_text()
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_store_answers_progress_only_with_the_jobs_token(store_url: str) -> None:
    finished = json.dumps({"step": 9, "finished": True}).encode()
    # Anyone else who reaches the port can neither end the job nor read it.
    assert _status(store_url, finished, {"Content-Type": "application/json"}) == 401
    assert _status(store_url, finished, {"Authorization": "Bearer wrong"}) == 401
    assert _status(store_url, None, {}) == 401
    assert get_json(store_url, token="wrong") is None
    assert get_json(store_url, token=TOKEN) == {}  # nothing reported yet
    # The trainer's client sends the token from its environment (the operator sets it from the Secret).
    os.environ[etj_env.PROGRESS_TOKEN.name] = TOKEN
    try:
        post_json(store_url, {"step": 3})
        assert (get_json(store_url) or {}).get("step") == 3
    finally:
        del os.environ[etj_env.PROGRESS_TOKEN.name]
    # The probe stays open.
    assert _status(store_url.replace("progress", "healthz"), None, {}) == 200


def test_store_refuses_an_oversized_body_unread(store_url: str) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    huge = b'{"loss": 1.0, "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
    assert _status(store_url, huge, auth) == 413
    # Without a length the server would have to read until the client stops: refused too.
    host, port = store_url.split("/")[2].split(":")
    import http.client

    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", "/progress")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    assert conn.getresponse().status == 411
    conn.close()
    # The store is still there and still takes a normal report.
    assert _status(store_url, b'{"step": 4}', auth) == 204
    assert get_json(store_url, token=TOKEN) == {"step": 4, "resizes": [], "finished": False}


def test_the_operator_reads_progress_with_the_jobs_token(store_url: str) -> None:
    post_json(store_url, {"step": 5}, token=TOKEN)
    host, port = store_url.split("/")[2].split(":")

    async def read(token: str | None) -> dict[str, Any] | None:
        store = StoreClient()
        try:
            return await store.fetch_progress(host, int(port), token=token)
        finally:
            await store.close()

    assert asyncio.run(read(TOKEN)) == {"step": 5, "resizes": [], "finished": False}
    assert asyncio.run(read(None)) is None


def test_the_operator_sets_the_replica_bounds_that_running_agents_read(store_url: str) -> None:
    """`kubectl scale` reaches processes started before it (etj_contract.replicas): the operator POSTs the
    bounds with the job's token, the store pod keeps them, agents and rank 0 read them with the token."""
    host, port = store_url.split("/")[2].split(":")
    replicas = store_url.replace(PROGRESS_PATH, REPLICAS_PATH)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert bounds.read_from(store_url, token=TOKEN) is None  # nothing said yet: the env's bounds

    async def post(token: str | None) -> bool:
        store = StoreClient()
        try:
            return await store.post_replicas(host, Replicas(1, 4), int(port), token=token)
        finally:
            await store.close()

    assert asyncio.run(post(None)) is False  # anyone else cannot resize the job
    assert bounds.read_from(store_url, token=TOKEN) is None
    assert asyncio.run(post(TOKEN)) is True
    assert bounds.read_from(store_url, token=TOKEN) == Replicas(1, 4)
    assert get_json(replicas, token=TOKEN) == {"min": 1, "max": 4}
    for bad in (b'{"min": 3, "max": 2}', b'{"min": 0, "max": 2}', b'{"min": true, "max": 2}', b"[1, 4]"):
        assert _status(replicas, bad, auth) == 400, bad
    assert bounds.read_from(store_url, token=TOKEN) == Replicas(1, 4)  # a bad request changed nothing


# ---- the operator's objects on the real apiserver ------------------------------------------------------


@pytest.mark.cluster
def test_job_gets_its_token_secret_and_a_network_policy_before_its_pods(
    bed: Bed, cluster: Cluster, tmp_path: Path
) -> None:
    key = "test-operator-key"
    os.environ["ETJ_OPERATOR_TOKEN_KEY"] = key
    try:
        op = OperatorProcess(
            cluster.kubeconfig,
            bed.ns,
            tmp_path / "operator.log",
            "--operator-namespace=etj-system",
            "--operator-pod-label=app.kubernetes.io/component=operator",
        ).start()
    finally:
        del os.environ["ETJ_OPERATOR_TOKEN_KEY"]
    try:
        bed.node("spot-0", "spot")
        bed.node("od-0", "on-demand", gpus=0)
        bed.create_job("sealed", max_workers=1)
        bed.wait(
            "worker and store pods",
            lambda: bool(bed.pods("sealed")) and bool(bed.pods("sealed", "rendezvous")),
        )
        job = bed.job("sealed") or {}
        uid = job["metadata"]["uid"]

        # Named from the operator's key too (no one can make it before the operator: issue 37).
        name = token_secret_name(key.encode(), namespace=bed.ns, job="sealed", uid=uid)
        secret = cast(Any, bed.core.read_namespaced_secret(name, bed.ns))
        token = base64.b64decode(secret.data["token"]).decode()
        # Derived from the operator's key and the job's identity: a restarted operator knows it unread.
        assert token == job_token(key.encode(), namespace=bed.ns, job="sealed", uid=uid)
        assert [(o.kind, o.uid, o.controller) for o in secret.metadata.owner_references] == [
            ("ElasticTrainingJob", uid, True)
        ]
        # Every pod of the job takes the token from the Secret by name; no pod spec holds the value.
        for pod in [*bed.pods("sealed"), *bed.pods("sealed", "rendezvous")]:
            env = {e.name: e for e in pod.spec.containers[0].env}
            ref = env[etj_env.PROGRESS_TOKEN.name].value_from.secret_key_ref
            assert (ref.name, ref.key) == (name, "token")
            assert token not in json.dumps(client.ApiClient().sanitize_for_serialization(pod))

        policy = cast(
            Any,
            client.NetworkingV1Api(bed.cluster.api_client()).read_namespaced_network_policy(
                "sealed-etj", bed.ns
            ),
        )
        spec = client.ApiClient().sanitize_for_serialization(policy.spec)
        assert spec["podSelector"] == {"matchLabels": {"etj.dev/job": "sealed"}}
        assert spec["policyTypes"] == ["Ingress"]  # egress (datasets, object stores) stays open
        own, operator = spec["ingress"]
        # The job's own pods: every port (the store's, and the collectives' own choice of ports).
        assert own == {"from": [{"podSelector": {"matchLabels": {"etj.dev/job": "sealed"}}}]}
        # The operator: the progress port only, and only its own pods in its own namespace.
        assert operator == {
            "from": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "etj-system"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}},
                }
            ],
            "ports": [{"port": PROGRESS_PORT, "protocol": "TCP"}],
        }
        assert policy.metadata.owner_references[0].uid == uid
    finally:
        op.stop()
        print(op.logs())

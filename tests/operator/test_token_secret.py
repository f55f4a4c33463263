"""The job's token Secret has a name nobody can make first (issue 37 item 5): it was ``<job>-etj-token``,
so anyone allowed to create Secrets in the namespace could make it before the job, and the operator (which
has no ``get`` on Secrets) took the create's 409 for its own Secret: the job ran with their token. The
name is now derived from the operator's key and the job's uid, like the token, and every pod names it."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import kopf
import pytest

from etj_operator.decide.objects import dataplane
from etj_operator.decide.objects.names import legacy_token_secret_name
from etj_operator.decide.objects.pod_env import token_env, token_secret_of
from etj_operator.k8s.reconciler import JobRunner
from etj_operator.k8s.settings import Settings
from etj_operator.k8s.store_client import StoreClient
from tests.operator.factories import node, spec
from tests.operator.test_reconciler import RecordingKube, StaticWorld

KEY = b"k" * 32
IDS = {"namespace": "ns", "job": "train", "uid": "uid-1"}


def test_the_name_is_derived_from_the_key_and_the_jobs_identity() -> None:
    name = dataplane.token_secret_name(KEY, **IDS)
    assert re.fullmatch(r"train-etj-token-[0-9a-f]{10}", name), name
    assert name == dataplane.token_secret_name(KEY, **IDS)  # a restarted operator names the same Secret
    assert name != legacy_token_secret_name("train")
    # Unguessable without the key, and new for a re-created job (new uid) or in another namespace.
    assert name != dataplane.token_secret_name(b"another key", **IDS)
    assert name != dataplane.token_secret_name(KEY, **{**IDS, "uid": "uid-2"})
    assert name != dataplane.token_secret_name(KEY, **{**IDS, "namespace": "other"})
    # The name is public (any pod spec shows it); no bit of the token is in it.
    token = dataplane.job_token(KEY, **IDS)
    assert name.rsplit("-", 1)[1] not in token.encode().hex() and name.rsplit("-", 1)[1] not in token


class CreatingKube(RecordingKube):
    """Records what the loop creates: the job's own objects (ensure) and its pods."""

    def __init__(self) -> None:
        super().__init__()
        self.ensured: list[dict[str, Any]] = []
        self.pods: list[dict[str, Any]] = []

    async def ensure(self, body: dict[str, Any]) -> None:  # type: ignore[override]
        self.ensured.append(body)

    async def create_pod(self, body: dict[str, Any]) -> None:  # type: ignore[override]
        self.pods.append(body)


def test_every_pod_names_the_secret_the_operator_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf, "event", lambda *a, **kw: None)  # Events need kopf's running context
    kube = CreatingKube()
    world = StaticWorld([], nodes={f"n{i}": node(f"n{i}") for i in range(2)})
    runner = JobRunner("ns", "train", world, kube, Settings(token_key=KEY, progress_seconds=0), StoreClient())
    runner.body = {
        "metadata": {"name": "train", "namespace": "ns", "uid": "uid-1", "generation": 1},
        "spec": spec().model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    asyncio.run(runner.reconcile())

    (secret,) = [b for b in kube.ensured if b["kind"] == "Secret"]
    name = secret["metadata"]["name"]
    assert name == dataplane.token_secret_name(KEY, **IDS)
    assert secret["stringData"]["token"] == dataplane.job_token(KEY, **IDS)  # the value an older one holds
    roles = {p["metadata"]["labels"]["etj.dev/role"] for p in kube.pods}
    assert roles == {"rendezvous", "worker"}, roles
    assert {token_secret_of(p) for p in kube.pods} == {name}


def test_pods_of_an_older_operator_still_name_their_secret() -> None:
    """After an upgrade, running pods keep ``<job>-etj-token`` (owned by the job, same token: the operator
    never deletes it); the new operator's pods name the new Secret. Both are read the same way."""
    old = {"spec": {"containers": [{"env": [token_env(legacy_token_secret_name("train"))]}]}}
    assert token_secret_of(old) == "train-etj-token"
    assert token_secret_of({"spec": {"containers": [{"env": []}]}}) is None

"""Worker/store pods and the Service: the pod contract and Pod Security "restricted"."""

from __future__ import annotations

from typing import Any

import pytest

from etj_contract.ports import PROGRESS_PORT, STORE_READY_PATH, STORE_READY_TIMEOUT_S
from etj_operator.api.pod import RESERVED_ENV
from etj_operator.decide.objects.manifests import rendezvous_pod, rendezvous_service, worker_pod
from etj_operator.decide.objects.names import rendezvous_index
from tests.operator.factories import spec


def _pod(**overrides: Any) -> dict[str, Any]:
    return worker_pod(
        spec(**overrides),
        job="train",
        namespace="ml",
        uid="uid-1",
        token_secret="tok",
        slot=2,
        grace_seconds=90,
    )


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_worker_pod_identity_ownership_and_labels() -> None:
    pod = _pod()
    meta = pod["metadata"]
    assert meta["name"] == "train-worker-2"
    assert meta["labels"]["etj.dev/job"] == "train" and meta["labels"]["etj.dev/slot"] == "2"
    owner = meta["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "ElasticTrainingJob",
        "train",
        "uid-1",
        True,
    )
    assert pod["spec"]["terminationGracePeriodSeconds"] == 90
    assert pod["spec"]["restartPolicy"] == "Never"


def test_worker_env_follows_the_contract() -> None:
    env = _env(
        _pod(
            trainer={
                "image": "t:1",
                "resources": {"gpu": 2},
                "env": [{"name": "ETJ_DATA", "value": "digits"}],
            }
        )
    )
    assert set(RESERVED_ENV) <= set(env)
    assert env["ETJ_RDZV_ENDPOINT"] == "train-rdzv.ml.svc:29400"
    assert env["ETJ_PROGRESS_URL"] == "http://train-rdzv.ml.svc:29401/progress"
    assert (env["ETJ_MIN_WORKERS"], env["ETJ_MAX_WORKERS"], env["ETJ_NPROC_PER_WORKER"]) == ("1", "4", "2")
    assert env["ETJ_WORKER_ID"] == "train-worker-2" and env["ETJ_RDZV_ID"] == "uid-1"
    names = [
        e["name"]
        for e in _pod(trainer={"image": "t", "env": [{"name": "ETJ_DATA", "value": "x"}]})["spec"][
            "containers"
        ][0]["env"]
    ]
    assert names.index("ETJ_DATA") > names.index("ETJ_PROGRESS_URL")  # user env after the operator's


def test_workers_publish_their_pod_ip_not_their_hostname() -> None:
    # Found on kind: torch elastic's MASTER_ADDR defaulted to the pod's hostname, which no other pod resolves.
    container = _pod(trainer={"image": "t:1"})["spec"]["containers"][0]
    pod_ip = [e for e in container["env"] if e["name"] == "POD_IP"]
    assert pod_ip == [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def test_cpu_pods_run_procs_per_worker_processes() -> None:
    # gpu: 0 with procsPerWorker: 2 -- two CPU ranks per pod, and no GPU requested
    pod = _pod(trainer={"image": "t:1", "resources": {"gpu": 0, "cpu": 2}, "procsPerWorker": 2})
    assert _env(pod)["ETJ_NPROC_PER_WORKER"] == "2"
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "2"}


def test_worker_command_defaults_to_etj_train_worker() -> None:
    assert _pod()["spec"]["containers"][0]["command"] == ["etj-train", "worker"]


def test_a_users_own_script_runs_under_the_workers_agent() -> None:
    """`spec.trainer.args: [--script, PATH, ...]` keeps the agent (etj-train worker) and hands it the
    script (docs/trainer.md, "Bring your own training loop")."""
    args = ["--script", "/workspace/train.py", "--hidden", "64"]
    container = _pod(trainer={"image": "t:1", "args": args})["spec"]["containers"][0]
    assert container["command"] == ["etj-train", "worker"] and container["args"] == args


def test_workers_run_as_the_jobs_service_account_and_the_store_does_not() -> None:
    """trainer.serviceAccountName: the workers' cloud identity (IRSA / EKS Pod Identity for S3
    checkpoints); the store never touches the object store, so it keeps the namespace's default."""
    assert "serviceAccountName" not in _pod()["spec"]  # unset: the namespace's default
    job = spec(trainer={"image": "trainer:1", "resources": {"gpu": 1}, "serviceAccountName": "trainer-s3"})
    pod = worker_pod(
        job, job="train", namespace="ml", uid="uid-1", token_secret="tok", slot=0, grace_seconds=90
    )
    assert pod["spec"]["serviceAccountName"] == "trainer-s3"
    assert pod["spec"]["automountServiceAccountToken"] is False  # the trainer never calls the API
    store = rendezvous_pod(job, job="train", namespace="ml", uid="u", token_secret="tok")
    assert "serviceAccountName" not in store["spec"]


def test_the_store_is_ready_when_its_tcpstore_answers() -> None:
    """Issue 37: the probe was a TCP connect to the TCPStore's port, which passed while a partial query held
    the store image's poll() server; ``/readyz`` answers after a set and read-back through that port
    (tests/trainer/test_store_held.py), within the probe's timeout."""
    (store,) = rendezvous_pod(spec(), job="train", namespace="ml", uid="u", token_secret="tok")["spec"][
        "containers"
    ]
    probe = store["readinessProbe"]
    assert probe["httpGet"] == {"path": STORE_READY_PATH, "port": "progress"}
    assert {"name": "progress", "containerPort": PROGRESS_PORT} in store["ports"]
    assert probe["timeoutSeconds"] > STORE_READY_TIMEOUT_S and "tcpSocket" not in probe


@pytest.mark.parametrize("builder", ["worker", "store"])
def test_restricted_pod_security(builder: str) -> None:
    pod = (
        _pod()
        if builder == "worker"
        else rendezvous_pod(spec(), job="train", namespace="ml", uid="u", token_secret="tok")
    )
    psc = pod["spec"]["securityContext"]
    assert psc["runAsNonRoot"] and psc["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in pod["spec"]["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["readOnlyRootFilesystem"] is True
        assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])


def test_worker_resources_shm_and_checkpoint_volume() -> None:
    pod = _pod(
        trainer={"image": "t", "resources": {"gpu": 4, "cpu": 8, "memory": "60Gi", "shmSize": "8Gi"}},
        checkpoint={"pvc": {"claimName": "ckpt"}, "path": "/ckpt"},
    )
    c = pod["spec"]["containers"][0]
    assert (
        c["resources"]["requests"]
        == c["resources"]["limits"]
        == {"nvidia.com/gpu": "4", "cpu": "8", "memory": "60Gi"}
    )
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["etj-shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert vols["etj-checkpoints"]["persistentVolumeClaim"] == {"claimName": "ckpt"}
    assert {"name": "etj-checkpoints", "mountPath": "/ckpt"} in c["volumeMounts"]


CHECKPOINT_VOLUME_CASES = {
    # name: (checkpoint section, extra trainer fields, expected etj-checkpoints volume source or None)
    "no-storage-gets-a-pod-local-emptydir": ({"path": "/checkpoints"}, {}, {"emptyDir": {}}),
    "pvc-is-used-as-is": (
        {"pvc": {"claimName": "c"}, "path": "/checkpoints"},
        {},
        {"persistentVolumeClaim": {"claimName": "c"}},
    ),
    "uri-needs-no-volume": ({"uri": "s3://bucket/job", "path": "/checkpoints"}, {}, None),
    "under-tmp-is-already-writable": ({"path": "/tmp/ckpt"}, {}, None),
    "user-mount-covers-the-path": (
        {"path": "/data/ckpt"},
        {
            "volumes": [{"name": "data", "emptyDir": {}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        },
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(CHECKPOINT_VOLUME_CASES))
def test_checkpoint_path_is_always_writable_under_a_read_only_root(case: str) -> None:
    checkpoint, trainer_extra, expected = CHECKPOINT_VOLUME_CASES[case]
    pod = _pod(checkpoint=checkpoint, trainer={"image": "t", **trainer_extra})
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    if expected is None:
        assert "etj-checkpoints" not in vols
    else:
        assert {k: v for k, v in vols["etj-checkpoints"].items() if k != "name"} == expected
        assert {"name": "etj-checkpoints", "mountPath": checkpoint["path"]} in mounts


def _required_terms(pod: dict[str, Any]) -> list[list[dict[str, Any]]]:
    node = pod["spec"].get("affinity", {}).get("nodeAffinity", {})
    terms = node.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    return [t["matchExpressions"] for t in terms]


def test_spot_only_workers_require_spot_and_tolerate_spot_taints() -> None:
    pod = _pod(placement={"capacityTypes": ["spot"]})
    flat = [e for term in _required_terms(pod) for e in term]
    assert {"key": "eks.amazonaws.com/capacityType", "operator": "In", "values": ["SPOT"]} in flat
    assert {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]} in flat
    assert any(t["key"] == "kubernetes.azure.com/scalesetpriority" for t in pod["spec"]["tolerations"])


def test_on_demand_only_workers_exclude_every_spot_convention_and_no_spot_tolerations() -> None:
    pod = _pod(placement={"capacityTypes": ["on-demand"]})
    terms = _required_terms(pod)
    not_spot = terms[1]
    assert {"key": "eks.amazonaws.com/capacityType", "operator": "NotIn", "values": ["SPOT"]} in not_spot
    assert {"key": "cloud.google.com/gke-spot", "operator": "NotIn", "values": ["true"]} in not_spot
    assert pod["spec"]["tolerations"] == []


def test_both_capacity_types_prefer_the_first_and_keep_user_affinity() -> None:
    user = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    pod = _pod(placement={"capacityTypes": ["spot", "on-demand"], "affinity": user})
    assert _required_terms(pod) == [[{"key": "zone", "operator": "In", "values": ["a"]}]]
    preferred = pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert any(
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}
        in p["preference"]["matchExpressions"]
        for p in preferred
    )


def test_user_required_terms_are_anded_with_the_capacity_rule() -> None:
    user = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    terms = _required_terms(_pod(placement={"capacityTypes": ["spot"], "affinity": user}))
    assert terms and all({"key": "zone", "operator": "In", "values": ["a"]} in t for t in terms)


def test_store_runs_on_demand_behind_a_headless_service() -> None:
    pod = rendezvous_pod(spec(), job="train", namespace="ml", uid="u", token_secret="tok", index=2)
    assert pod["metadata"]["name"] == "train-rdzv-2"  # the Service, train-rdzv, selects it by label
    container = pod["spec"]["containers"][0]
    assert container["command"] == [
        "etj-train",
        "store",
        "--host",
        "$(POD_IP)",
        "--port",
        "29400",
        "--http-port",
        "29401",
    ]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container["env"]
    assert _required_terms(pod)[0] == [
        {"key": "etj.dev/capacity-type", "operator": "In", "values": ["on-demand"]}
    ]
    svc = rendezvous_service(job="train", namespace="ml", uid="u", store=2)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    # One store index only: a replacement starting elsewhere stays out of it until switched in.
    assert svc["spec"]["selector"] == {
        "etj.dev/job": "train",
        "etj.dev/role": "rendezvous",
        "etj.dev/store": "2",
    }
    assert pod["metadata"]["labels"].items() >= svc["spec"]["selector"].items()
    other = rendezvous_pod(spec(), job="train", namespace="ml", uid="u", token_secret="tok", index=3)
    assert not other["metadata"]["labels"].items() >= svc["spec"]["selector"].items()


def test_store_pod_is_guaranteed_never_blocks_karpenter_and_takes_a_priority_class() -> None:
    # issue 15: the store was Burstable (first evicted under memory pressure). Issue 26: its
    # karpenter.sh/do-not-disrupt blocked drift and expiry of its node for good; the PDB and the
    # operator's move on the disruption taint do the job instead.
    s = spec(placement={"rendezvous": {"priorityClassName": "etj-store"}})
    pod = rendezvous_pod(s, job="j", namespace="ns", uid="u", token_secret="tok", image="img")
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] and set(resources["limits"]) == {"cpu", "memory"}
    assert "karpenter.sh/do-not-disrupt" not in (pod["metadata"].get("annotations") or {})
    assert pod["spec"]["priorityClassName"] == "etj-store"
    assert (
        "priorityClassName"
        not in rendezvous_pod(spec(), job="j", namespace="ns", uid="u", token_secret="tok", image="i")["spec"]
    )


def test_store_disruption_budget_admits_no_eviction_of_the_store_only() -> None:
    from etj_operator.decide.objects.dataplane import store_disruption_budget

    pdb = store_disruption_budget(job="j", namespace="ns", uid="u")
    assert pdb["spec"] == {
        "maxUnavailable": 0,
        "selector": {"matchLabels": {"etj.dev/job": "j", "etj.dev/role": "rendezvous"}},
    }
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == "u"


@pytest.mark.parametrize(
    ("pod", "index"),
    [
        ("train-rdzv", -1),  # the fixed name of operators before fresh store names
        ("train-rdzv-0", 0),
        ("train-rdzv-12", 12),
        ("train-rdzv-x", None),
        ("train-rdzv-", None),
        ("train-worker-1", None),
        ("other-rdzv-1", None),
    ],
)
def test_rendezvous_index_reads_only_this_jobs_store_names(pod: str, index: int | None) -> None:
    assert rendezvous_index("train", pod) == index


@pytest.mark.parametrize("launcher", ["Etj", "Torchrun"])
def test_the_launcher_reaches_the_worker_as_etj_launcher(launcher: str) -> None:
    env = _env(_pod(trainer={"image": "t:1", "launcher": launcher}))
    assert env["ETJ_LAUNCHER"] == launcher

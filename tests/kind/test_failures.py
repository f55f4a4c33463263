"""Issue 26's failure handling under a real kubelet (the whole kind suite: `make e2e-kind`): a worker whose
container really exits non-zero is replaced on another node; failures spread wider apart than
failurePolicy.failureWindowSeconds do not fail the job; training processes killed mid-training, again and
again, raise CrashLooping; and a pod the job's NetworkPolicy admits still cannot run code in the agents or
change the world's bounds through the store.

The same behaviours are tested against the local apiserver in tests/integration/test_operator_failures.py
(there the test writes the kubelet's pod status and speaks for the agent) and
tests/trainer/test_store_trust.py (a local TCPStore); here the containers, their exits, the signals and the
network are real. That a pod in another namespace cannot even connect to the store's ports is the smoke
test's (tests/kind/test_smoke.py).

The crashes are the jobs' own: the trainer command is wrapped in ``sh -c`` that fails on purpose, deciding by
marker directories in the shared directory (every node mounts it; ``mkdir`` is atomic, so of two workers
starting together exactly one takes a marker), then execs the normal trainer.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from etj_contract.ports import PROGRESS_PORT, RDZV_PORT
from etj_contract.replicas import REPLICAS_PATH
from tests.kind.kindbed import (
    JSON,
    KindBed,
    RunningJob,
    exactly_once,
    kubectl,
    kubectl_path,
    running_job,
    two_worker_job,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.kind, pytest.mark.kind_full]

MARKERS_ENV = "KIND_TEST_MARKERS"  # the test's own: outside the ETJ_* names the trainer reads
NODE_ENV = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


def _markers(kind: KindBed, tag: str) -> Path:
    """A fresh directory in the shared directory, writable by the trainer (uid 1000) on every node."""
    path = kind.shared_dir / "markers" / f"{tag}-{uuid.uuid4().hex[:6]}"
    path.mkdir(parents=True)
    path.chmod(0o777)
    return path


def _crashing_job(epochs: int, min_step_s: float, script: str, markers: Path) -> JSON:
    """The demo's two-worker job whose workers run ``script`` (sh) instead of the trainer's command."""
    job = two_worker_job(epochs, min_step_s, command=["sh", "-c", script])
    job["spec"]["trainer"]["env"] += [{"name": MARKERS_ENV, "value": str(markers)}, NODE_ENV]
    return job


def _condition(run: RunningJob, type_: str) -> JSON:
    return next((c for c in run.status().get("conditions") or [] if c["type"] == type_), {})


def _warnings(kind: KindBed, run: RunningJob, reason: str) -> list[str]:
    return [
        e.get("message") or ""
        for e in kind.events(run.ns, run.name)
        if e.get("type") == "Warning" and e.get("reason") == reason
    ]


def _worker_changes(kind: KindBed, run: RunningJob, message: str) -> list[JSON]:
    """The job's Events whose message starts with ``message`` (the operator's "workers A -> B")."""
    return [e for e in kind.events(run.ns, run.name) if (e.get("message") or "").startswith(message)]


def _exec(kind: KindBed, run: RunningJob, pod: str, *command: str) -> str:
    out = kubectl(kind, "exec", "-n", run.ns, pod, "--", *command, timeout=120)
    assert out.returncode == 0, (pod, command, out.stdout, out.stderr)
    return out.stdout.strip()


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


# ---- a crash: the replacement avoids the node ------------------------------------------------------------

# The first worker to start exits 3 at once (its node recorded for the test), every later one trains.
CRASH_ONCE = f"""
if mkdir "${MARKERS_ENV}/crashed" 2>/dev/null; then
  echo "$NODE_NAME" > "${MARKERS_ENV}/crashed/node"
  echo "crashing on purpose on $NODE_NAME" >&2
  exit 3
fi
exec etj-train worker
"""


def _avoids(pod: JSON, node: str) -> bool:
    """The pod may not run on ``node``: every required node-selector term has hostname NotIn it."""
    affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    return bool(terms) and all(
        any(
            e.get("key") == "kubernetes.io/hostname" and e.get("operator") == "NotIn" and node in e["values"]
            for e in t.get("matchExpressions") or []
        )
        for t in terms
    )


def test_a_worker_that_crashed_is_replaced_on_another_node(kind: KindBed) -> None:
    epochs = 8
    markers = _markers(kind, "avoid")
    with running_job(kind, "avoid", _crashing_job(epochs, 0.5, CRASH_ONCE, markers), epochs) as run:
        bad = run.wait("a worker crashed", lambda: _read(markers / "crashed" / "node"), timeout=300)
        crashed = time.monotonic()

        def replacement() -> JSON | None:
            return next(
                (
                    p
                    for p in run.pods("worker")
                    if p["status"].get("phase") == "Running"
                    and bad in (p["metadata"].get("annotations") or {}).get("etj.dev/avoided-nodes", "")
                ),
                None,
            )

        new = run.wait("the replacement running", replacement, timeout=300)
        replaced_s = time.monotonic() - crashed
        assert new["spec"]["nodeName"] != bad, (bad, new["spec"]["nodeName"])
        assert _avoids(new, bad), new["spec"].get("affinity")
        avoiding = run.wait("an AvoidingNode Warning", lambda: _warnings(kind, run, "AvoidingNode"), 60)
        assert any(bad in m and "crashing on purpose" in m for m in avoiding), avoiding
        avoided = run.wait("status.avoidedNodes", lambda: run.status().get("avoidedNodes"), 60)
        assert [a["node"] for a in avoided] == [bad], avoided
        result = run.result()

    status = result.status.get("status") or {}
    assert result.phase == "Succeeded", (run.run_dir, status.get("conditions"))
    assert status.get("failures") == 1, status  # the one crash, counted against the budget
    exactly_once(run.run_dir, epochs)
    print(f"crash on {bad}: replacement running on {new['spec']['nodeName']} {replaced_s:.1f} s later")


# ---- failures further apart than the window -------------------------------------------------------------

FAILURE_WINDOW_S = 30
CRASH_AFTER_S = 40  # > the window: consecutive crashes are further apart than it, whatever the restarts take
# Crash 0 is the first worker's to start, crash 1 the first to start after crash 0 (not its peer that started
# alongside: that one trains on, or both would crash at once and fail the job inside one window); each trains
# for CRASH_AFTER_S, then the container exits 1 (sh is PID 1: its exit kills the trainer mid-step, as a
# fault of the machine would). Every later worker trains to the end.
CRASH_TWICE = f"""
crash() {{
  etj-train worker &
  sleep {CRASH_AFTER_S}
  date +%s.%N > "${MARKERS_ENV}/$1/at"
  echo "crash $1 on purpose on $NODE_NAME" >&2
  exit 1
}}
if mkdir "${MARKERS_ENV}/0" 2>/dev/null; then crash 0; fi
if [ -e "${MARKERS_ENV}/0/at" ] && mkdir "${MARKERS_ENV}/1" 2>/dev/null; then crash 1; fi
exec etj-train worker
"""


def test_failures_further_apart_than_the_window_do_not_fail_the_job(kind: KindBed) -> None:
    """maxFailures 1 and two real crashes: with the window each crash is alone in it, so the job trains on
    and Succeeds. Without it (failureWindowSeconds: 0) the budget counts the job's lifetime, 2 > 1, and
    the same job would be Failed at the second crash (decide/failures/bad_nodes.py budget_failures)."""
    epochs = 16
    markers = _markers(kind, "window")
    job = _crashing_job(epochs, 0.5, CRASH_TWICE, markers)
    job["spec"]["failurePolicy"] = {
        "maxFailures": 1,
        "failureWindowSeconds": FAILURE_WINDOW_S,
        # The window is under test here, placement in the test above: avoiding both crash nodes would leave
        # the later workers one of kind's three nodes.
        "avoidNodeSeconds": 0,
    }
    with running_job(kind, "window", job, epochs) as run:
        run.wait("the second crash", lambda: (markers / "1" / "at").exists(), timeout=900)
        failed = run.wait(
            "both crashes counted",
            lambda: (run.status().get("failures") or 0) >= 2 and run.status(),
            timeout=120,
        )
        assert failed.get("phase") != "Failed", failed.get("conditions")
        result = run.result()

    status = result.status.get("status") or {}
    crashes = [float((markers / str(n) / "at").read_text()) for n in (0, 1)]
    apart = crashes[1] - crashes[0]
    assert apart > FAILURE_WINDOW_S, crashes
    assert result.phase == "Succeeded", (run.run_dir, status.get("conditions"))
    # Both crashes were failures; without the window 2 > maxFailures would have failed the job.
    assert status.get("failures") == 2, status
    assert len(status.get("failureTimes") or []) <= 1, status  # the older one left the window
    assert len(_warnings(kind, run, "WorkerFailed")) >= 2
    exactly_once(run.run_dir, epochs)
    print(f"two crashes {apart:.1f} s apart (window {FAILURE_WINDOW_S} s, maxFailures 1): Succeeded")


# ---- a crash loop with progress between the crashes -----------------------------------------------------

# Run in a worker's container: SIGKILL to the training processes, the children of the agent's forkserver
# (forked children keep the forkserver's command line, so the forkserver is the one whose parent's differs).
KILL_TRAINING = r"""
import os, signal
def read(pid, name):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return b""
def ppid(pid):
    line = next((x for x in read(pid, "status").splitlines() if x.startswith(b"PPid:")), b"PPid: 0")
    return int(line.split()[1])
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
forking = {p for p in pids if b"forkserver" in read(p, "cmdline")}
servers = {p for p in forking if ppid(p) not in forking}
victims = [p for p in pids if ppid(p) in servers]
for p in victims:
    os.kill(p, signal.SIGKILL)
print(" ".join(map(str, victims)))
"""
# The operator stamps a crash when it reads the store's count (every 10 s): kills this far apart are stamped
# more than CRASH_COLLAPSE_S (10 s) apart, so none collapses into another as one fault.
CRASH_SPACING_S = 25


def _trained_on(run: RunningJob, step: int, killed: float) -> Callable[[], bool]:
    """Past ``step`` again, and CRASH_SPACING_S after the kill at ``killed`` (time.monotonic())."""
    return lambda: run.step() > step and time.monotonic() - killed >= CRASH_SPACING_S


def test_training_killed_again_and_again_raises_crash_looping_within_two_minutes(kind: KindBed) -> None:
    """Each kill is a crash inside the pod: the agent restarts its training process and reports the crash
    to the store (elastic_agent.count_crash), which the operator counts; no pod fails or is replaced, and
    the job makes progress between the kills, so the agent's own budget never gives up."""
    epochs = 14
    job = two_worker_job(epochs, 0.5)
    job["spec"]["replicas"] = {"min": 1, "max": 1}  # one agent: its restarts are the whole world's
    job["spec"]["checkpoint"]["intervalSteps"] = 5  # a restart redoes at most a few steps
    with running_job(kind, "crashloop", job, epochs) as run:
        workers = run.wait("the worker training", lambda: run.training_workers(1, min_step=5))
        ((pod, _),) = workers.items()
        uid = run.pods("worker")[0]["metadata"]["uid"]
        kills: list[float] = []
        at_kill = 0
        for i in range(3):
            if kills:
                again = _trained_on(run, at_kill, kills[-1])
                run.wait(f"training on after kill {i}, {CRASH_SPACING_S} s after it", again, timeout=300)
            at_kill = run.step()
            victims = _exec(kind, run, pod, "python", "-c", KILL_TRAINING)
            assert victims, "no training process to kill"
            kills.append(time.monotonic())
        try:
            run.wait(
                "CrashLooping=True",
                lambda: _condition(run, "CrashLooping").get("status") == "True",
                timeout=max(1.0, 120 - (time.monotonic() - kills[0])),
            )
        except AssertionError:
            print(run.status())
            raise
        took = time.monotonic() - kills[0]
        cond = _condition(run, "CrashLooping")
        assert cond["reason"] == "RepeatedCrashes", cond
        counted = re.match(r"(\d+) crashes in the last", cond["message"])
        assert counted and int(counted.group(1)) >= 3, cond
        event = run.wait("a CrashLooping Warning", lambda: _warnings(kind, run, "CrashLooping"), 60)
        status = run.status()
        assert (status.get("progress") or {}).get("crashes", 0) >= 3, status  # reported by the agent
        assert not status.get("failures"), status  # no pod failed: restarts inside the pod
        assert [p["metadata"]["uid"] for p in run.pods("worker")] == [uid], "the worker pod was replaced"
        assert _condition(run, "Progressing").get("status") == "True"  # it did make progress
        result = run.result()

    status = result.status.get("status") or {}
    assert result.phase == "Succeeded", (run.run_dir, status.get("conditions"))
    # The only worker leaving by itself after the last step is the job finishing: this job's kind run
    # found the Event saying WorkerLost (fixed in decide/status/job_status.py, tests/operator/test_status.py).
    ends = wait_for(
        "the Event of the last worker's exit", lambda: _worker_changes(kind, run, "workers 1 -> 0"), 60
    )
    assert [e.get("reason") for e in ends] == ["JobFinished"], ends
    exactly_once(run.run_dir, epochs)
    spacing = ", ".join(f"{b - a:.0f}" for a, b in itertools.pairwise(kills))
    print(f"3 kills ({spacing} s apart): CrashLooping {took:.1f} s after the first; {event[0]}")


# ---- nothing from the store is trusted, from a pod the policy admits -------------------------------------

# Run in a pod of the job's namespace that carries the job's label, so the job's NetworkPolicy admits it
# (decide/objects/dataplane.py: ingress from the job's own pods on any port): a plain TCPStore client, no
# token.
ATTACK = r"""
import base64, json, os, pickle, random, sys, time, urllib.error, urllib.request
from datetime import timedelta
from torch.distributed import TCPStore

host, port, http_port, replicas_path, run_id, marker = sys.argv[1:]
FORGERIES = 20

class Payload:
    def __reduce__(self):  # unpickling it runs os.mkdir(marker): any code would run the same way
        return (os.mkdir, (marker,))

evil = base64.b64encode(pickle.dumps(Payload())).decode()
# use_libuv=False: the image's torch may be built without libuv, which refuses the default even for a client
store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30), use_libuv=False)
writes = 0
# The first agent to touch a forgery refuses it and writes its own state over it within a keep-alive (1 s),
# so each forgery reaches about one agent: FORGERIES of them, at random spacing (no phase lock with one
# agent's timers), reach every agent.
for _ in range(FORGERIES):
    for key in ("torch.rendezvous." + run_id, "etj.rendezvous." + run_id):  # torch's key and etj's
        store.set(key, evil)
    store.set("etj/replicas", "1:1")  # the bounds, where an older image read them
    writes += 1
    time.sleep(random.uniform(0.5, 2.0))
body = json.dumps({"min": 1, "max": 1}).encode()
req = urllib.request.Request(f"http://{host}:{http_port}{replicas_path}", data=body, method="POST",
                             headers={"Content-Type": "application/json"})
try:
    code = urllib.request.urlopen(req, timeout=10).status
except urllib.error.HTTPError as e:
    code = e.code
print(json.dumps({"writes": writes, "replicas_without_token": code}))
"""
# The bounds as the agents read them before a round: over HTTP, with the job's token (resize/bounds.py).
READ_BOUNDS = "import os; from etj_trainer.resize import bounds; print(bounds.read_from(os.environ['ETJ_PROGRESS_URL']))"  # noqa: E501


def _attacker(
    kind: KindBed, run: RunningJob, command: list[str] | None = None, env: list[JSON] | None = None
) -> str:
    """A pod in the job's namespace with the job's label (no role: the operator ignores it), running
    ``command`` (default: sleep, for `kubectl exec`) with ``env``."""
    name = f"attacker-{uuid.uuid4().hex[:5]}"
    body = {
        "metadata": {"name": name, "labels": {"etj.dev/job": run.name}},
        "spec": {
            "containers": [
                {
                    "name": "attack",
                    "image": kind.trainer_image,
                    "imagePullPolicy": "Never",
                    "command": command or ["sleep", "3600"],
                    "env": env or [],
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }
    kind.kube.request("POST", f"/api/v1/namespaces/{run.ns}/pods", body=body)
    run.wait(
        f"pod {name} running",
        lambda: kind.kube.get(f"/api/v1/namespaces/{run.ns}/pods/{name}")["status"].get("phase") == "Running",
        timeout=300,
    )
    return name


def _refusing(kind: KindBed, run: RunningJob, pod: str) -> Callable[[], bool]:
    """Whether ``pod``'s agent has logged a rendezvous state that failed its check (sealed_rendezvous.py)."""

    def logged() -> bool:
        out = kubectl(kind, "logs", "-n", run.ns, pod, timeout=60)
        return "failed its check" in out.stdout + out.stderr

    return logged


def test_a_pod_the_policy_admits_cannot_run_code_or_set_bounds_through_the_store(kind: KindBed) -> None:
    epochs = 12
    markers = _markers(kind, "trust")
    marker = markers / "pwned"  # an agent that unpickled the forgery would create it (uid 1000 may)
    job = two_worker_job(epochs, 0.5)
    with running_job(kind, "trust", job, epochs) as run:
        workers = run.wait("two workers training", lambda: run.training_workers(2, min_step=5))
        attacker = _attacker(kind, run)
        try:
            regrown_s = _attack(kind, run, workers, attacker, marker)
        finally:
            kind.kube.request("DELETE", f"/api/v1/namespaces/{run.ns}/pods/{attacker}")
        result = run.result()

    status = result.status.get("status") or {}
    assert result.phase == "Succeeded", (run.run_dir, status.get("conditions"))
    assert not marker.exists(), "the store's bytes ran as code in an agent"
    assert not status.get("failures"), status  # the forgery failed no worker
    exactly_once(run.run_dir, epochs)
    print(f"forgeries refused by {len(workers)} agents; world 2 again {regrown_s:.1f} s after a leave")


def _attack(kind: KindBed, run: RunningJob, workers: dict[str, str], attacker: str, marker: Path) -> float:
    """The attack from ``attacker`` and its checks; returns the seconds the world took to grow back to 2
    after the round that followed it."""
    job_path = f"/apis/etj.dev/v1alpha1/namespaces/{run.ns}/elastictrainingjobs/{run.name}"
    uid = kind.kube.get(job_path)["metadata"]["uid"]  # ETJ_RDZV_ID: in every agent's rendezvous keys
    host = f"{run.name}-rdzv.{run.ns}.svc"
    args = [host, str(RDZV_PORT), str(PROGRESS_PORT), REPLICAS_PATH, uid, str(marker)]
    attacked = _exec(kind, run, attacker, "python", "-c", ATTACK, *args)
    assert '"writes": 20' in attacked, attacked  # admitted: it reached the TCPStore and wrote
    assert '"replicas_without_token": 401' in attacked, attacked

    # Every agent read the forgery and refused it (sealed_rendezvous.py logs it), and none ran it.
    for pod in workers:
        refused = _refusing(kind, run, pod)
        run.wait(f"{pod} refusing the forged state", refused, timeout=60)
    assert not marker.exists(), "the store's bytes ran as code in an agent"
    bounds = _exec(kind, run, next(iter(workers)), "python", "-c", READ_BOUNDS)
    assert bounds in ("None", "Replicas(min=1, max=2)"), bounds  # the operator's, or none said yet

    # A join after the forged bounds: a worker leaves, its replacement joins, and the world is 2 again.
    # Rank 0 admits joiners, and agents complete rounds, only up to the bounds they read (resize/bounds.py):
    # had they taken the forged 1:1, the replacement would have been turned away.
    return _leave_and_regrow(kind, run, workers)


def _leave_and_regrow(kind: KindBed, run: RunningJob, workers: dict[str, str]) -> float:
    """Delete one of ``workers``; the seconds until the world was 2 again with its replacement, by the
    trainer's own resize records (2 -> 1, then 1 -> 2)."""
    leaver = sorted(workers)[0]
    # Whole seconds, as status times are: an in-place leave re-forms the world within the second of the
    # delete, so its record's time can read earlier than the delete's exact instant.
    left_at, left = datetime.now(UTC).replace(microsecond=0), time.monotonic()
    kind.kube.request("DELETE", f"/api/v1/namespaces/{run.ns}/pods/{leaver}")

    def regrown() -> bool:
        # Only the trainer's own record of a resize carries its pause: the operator records a pod count
        # change as soon as the replacement runs, before the world has admitted it.
        later = [
            (r["from"], r["to"])
            for r in run.status().get("resizeHistory") or []
            if datetime.fromisoformat(r["time"]) >= left_at and r.get("pauseSeconds") is not None
        ]
        return (2, 1) in later and (1, 2) in later[later.index((2, 1)) :]

    run.wait("the world 2 -> 1, then 1 -> 2 with the replacement", regrown, timeout=600)
    return time.monotonic() - left


# ---- a pod with the job's label but not its token: never a rank, cannot hold the store (issue 37) ----

# Everything a pod the job's NetworkPolicy admits can do to the store without the token, at once, for
# ``seconds``, while a worker leaves and its replacement joins:
# - queue itself with the trainer's own joiner (resize/join.py ``ask``: what every worker pod's spec shows,
#   the store's endpoint and the job's uid, and a guessed token), round after round: before issue 37 such a
#   client was admitted as a rank and sent the model, optimizer, sampler and RNG state;
# - forge tickets, sizes and admissions for every worker name, under the raw key names and the guessed
#   token's (a joiner that took a forged ticket would have joined the attacker's "world");
# - hold the HTTP server with slow senders (300 connections sending their headers a byte a second): before,
#   they held all 256 slots and the operator stopped reading progress;
# - hold the TCPStore with partial queries (a query's first byte, then nothing): before, torch's poll()
#   server waited for the rest and every client of the store stalled.
# It prints one JSON summary: how often it asked and whether it was ever admitted, what it sent.
STORE_ATTACK = r"""
import json, os, socket, sys, threading, time
from datetime import timedelta
os.environ["ETJ_PROGRESS_TOKEN"] = "a-guess"
from torch.distributed import TCPStore
from etj_trainer.core.mac import job_sealer
from etj_trainer.resize import join

host, port, http_port, uid, seconds = sys.argv[1:6]
workers = sys.argv[6:]
deadline = time.monotonic() + float(seconds)
sent = {"slow_http": 0, "partial_queries": 0, "forgeries": 0}
lock = threading.Lock()

def count(what):
    with lock:
        sent[what] += 1

def slow_sender():  # slowloris: headers a byte a second, reopened when dropped
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection((host, int(http_port)), timeout=10)
            count("slow_http")
            s.sendall(b"GET /progress HTTP/1.1\r\nHost: x\r\n")
            while time.monotonic() < deadline:
                s.sendall(b"X")
                time.sleep(1)
        except OSError:
            time.sleep(0.5)

def partial_query():  # a query's first byte, then nothing; reopened when the store closes it
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection((host, int(port)), timeout=10)
            count("partial_queries")
            s.sendall(b"\x00")
            while time.monotonic() < deadline and s.recv(1):
                pass
        except OSError:
            pass
        time.sleep(0.5)

def forger():  # tickets, sizes and admissions for every worker, under raw names and the guessed token's
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30), use_libuv=False)
    prefixes = [f"etj-join/{uid}", "etj-join", job_sealer().name("etj-join")]
    while time.monotonic() < deadline:
        for prefix in prefixes:
            for w in workers:
                store.set(f"{prefix}/ticket/{w}", json.dumps({"key": "join/evil/1", "rank": 0, "old": 99}))
            store.set(f"{prefix}/size", "99")
            store.set(f"{prefix}/admission/evil/1", json.dumps({"size": 99}))
            count("forgeries")
        time.sleep(1)

threads = [threading.Thread(target=slow_sender, daemon=True) for _ in range(300)]
threads += [threading.Thread(target=partial_query, daemon=True) for _ in range(20)]
threads += [threading.Thread(target=forger, daemon=True)]
for t in threads:
    t.start()
print("attacking", flush=True)
asked, admitted = 0, None
while time.monotonic() < deadline and admitted is None:
    try:
        admitted = join.ask(wait_s=5, node=f"evil-{asked}")
    except Exception as e:  # a refusal the store makes is as good as a withdrawal
        print("error", type(e).__name__, e, flush=True)
    asked += 1
    print("ADMITTED" if admitted else "refused", flush=True)
    time.sleep(1)
with lock:
    print(json.dumps({"asked": asked, "admitted": repr(admitted) if admitted else None, **sent}), flush=True)
time.sleep(3600)  # stay up for the logs
"""


def _shown_env(pod: JSON) -> list[JSON]:
    """The plain values of ``pod``'s first container's env: what anyone who can read the pod spec sees
    (the token comes from a Secret, by reference, and is not among them)."""
    container = pod["spec"]["containers"][0]
    return [{"name": e["name"], "value": e["value"]} for e in container.get("env") or [] if "value" in e]


@pytest.mark.timeout(1500)
def test_a_pod_with_the_jobs_label_can_neither_hold_the_store_nor_steer_a_join(kind: KindBed) -> None:
    epochs = 16
    attack_s = 240
    with running_job(kind, "storeattack", two_worker_job(epochs, 0.5), epochs) as run:
        workers = run.wait("two workers training", lambda: run.training_workers(2, min_step=5))
        spec = kind.kube.get(f"/api/v1/namespaces/{run.ns}/pods/{sorted(workers)[0]}")
        uid = kind.kube.get(f"/apis/etj.dev/v1alpha1/namespaces/{run.ns}/elastictrainingjobs/{run.name}")[
            "metadata"
        ]["uid"]
        host = f"{run.name}-rdzv.{run.ns}.svc"
        names = [f"{run.name}-worker-{i}" for i in range(4)]  # the present workers and their replacements
        command = ["python", "-c", STORE_ATTACK, host, str(RDZV_PORT), str(PROGRESS_PORT), uid, str(attack_s)]
        attacker = _attacker(kind, run, command + names, _shown_env(spec))
        try:

            def logs() -> str:
                return kubectl(kind, "logs", "-n", run.ns, attacker, timeout=60).stdout

            run.wait("the attack under way", lambda: "attacking" in logs(), timeout=120)
            # The operator reads progress over the store's HTTP port, the one the slow senders hold: its
            # record of the step keeps advancing under the attack.
            step_under_attack = run.step()
            run.wait(
                "progress read under the attack", lambda: run.step() >= step_under_attack + 5, timeout=300
            )
            progress_read = run.step() - step_under_attack
            # The attacker queues beside the real replacement of a worker that leaves: the world grows
            # back with the replacement, never with the attacker.
            regrown_s = _leave_and_regrow(kind, run, workers)
            summary = run.wait(
                "the attacker's rounds done", lambda: '"asked"' in logs() and logs(), timeout=600
            )
        finally:
            kind.kube.request("DELETE", f"/api/v1/namespaces/{run.ns}/pods/{attacker}")
        result = run.result()

    done = json.loads(next(line for line in summary.splitlines() if line.startswith("{")))
    assert "ADMITTED" not in summary and done["admitted"] is None, summary[-3000:]
    # It did attack: it asked round after round, opened slow senders and partial queries, forged.
    assert done["asked"] >= 3 and summary.count("refused") >= 3, done
    assert done["slow_http"] >= 300 and done["partial_queries"] >= 20 and done["forgeries"] >= 10, done
    status = result.status.get("status") or {}
    assert result.phase == "Succeeded", (run.run_dir, status.get("conditions"))
    assert not status.get("failures"), status
    assert max(r["to"] for r in status.get("resizeHistory") or [{"to": 0}]) <= 2, status  # never a third rank
    exactly_once(run.run_dir, epochs)
    print(
        f"attacker refused {done['asked']} times ({done}); the operator read {progress_read} steps of "
        f"progress under the attack; world 2 again {regrown_s:.1f} s after a leave"
    )


# ---- pods that never start: the job says why, and fails at its deadline (issue 37, item 4) ---------------
# The local bed cannot produce these (kwok makes every pod Running, process nodes ignore images and leave a
# missing Secret's variables unset): tests/integration/test_operator_start_blocks.py covers Unschedulable
# there, and tests/operator/test_start_blocks.py the decision.

# A registry name that never resolves (.invalid, RFC 2606): the kubelet's pull fails at once, offline too.
MISSING_IMAGE = "registry.invalid/etj/no-such-image:1"
PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff")


def _never_starting_job(kind: KindBed, deadline: int = 900, **trainer: Any) -> JSON:
    """The demo's job with ``trainer`` fields changed, pulling what is not loaded (nothing trains)."""
    # 2 epochs: the demo's warm-up is 1 epoch, and the CRD refuses a warm-up as long as the training
    job = two_worker_job(2, 0.0, imagePullPolicy="IfNotPresent", image=kind.trainer_image)
    job["spec"]["trainer"].update(trainer)
    job["spec"]["failurePolicy"]["podStartDeadlineSeconds"] = deadline
    return job


@contextmanager
def _submitted(kind: KindBed, tag: str, job: JSON) -> Iterator[tuple[str, str]]:
    """``job`` in a namespace of its own, submitted as is: (namespace, name)."""
    ns, name = f"etj-{tag}-{uuid.uuid4().hex[:5]}", tag
    assert kubectl(kind, "create", "namespace", ns).returncode == 0
    job["metadata"] = {"name": name, "namespace": ns}
    try:
        applied = subprocess.run(
            [kubectl_path(), "--kubeconfig", str(kind.kubeconfig), "apply", "-f", "-"],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert applied.returncode == 0, applied.stderr
        yield ns, name
    finally:
        kubectl(kind, "delete", "namespace", ns, "--wait=false")


def _job_status(kind: KindBed, ns: str, name: str) -> JSON:
    path = f"/apis/etj.dev/v1alpha1/namespaces/{ns}/elastictrainingjobs/{name}"
    status: JSON = (kind.kube.get_or_none(path) or {}).get("status") or {}
    return status


def _job_condition(kind: KindBed, ns: str, name: str, type_: str) -> JSON:
    return next((c for c in _job_status(kind, ns, name).get("conditions") or [] if c["type"] == type_), {})


def test_a_worker_image_that_cannot_be_pulled_is_said_within_a_minute_and_fails_the_job(
    kind: KindBed,
) -> None:
    # The store runs the loaded image; the workers' image cannot be pulled.
    job = _never_starting_job(kind, deadline=60, image=MISSING_IMAGE, storeImage=kind.trainer_image)
    with _submitted(kind, "noimage", job) as (ns, name):
        start = time.monotonic()
        wait_for(
            "PodsBlocked=True with the kubelet's pull failure",
            lambda: _job_condition(kind, ns, name, "PodsBlocked").get("reason") in PULL_FAILURES,
            90,
        )
        said = time.monotonic() - start
        blocked = _job_condition(kind, ns, name, "PodsBlocked")
        assert MISSING_IMAGE in blocked["message"] and "worker pod" in blocked["message"], blocked
        table = kubectl(kind, "get", "etj", name, "-n", ns).stdout
        assert any(r in table for r in PULL_FAILURES), table
        wait_for("the job Failed", lambda: _job_status(kind, ns, name).get("phase") == "Failed", 180)
        failed = _job_condition(kind, ns, name, "Failed")
        assert failed["reason"] in PULL_FAILURES and "podStartDeadlineSeconds 60" in failed["message"], failed
        pulls = [
            e
            for e in kind.events(ns, name)
            if e.get("type") == "Warning" and e.get("reason") in PULL_FAILURES
        ]
        # Once, though the kubelet retried the pull several times in the minute.
        assert len(pulls) == 1 and MISSING_IMAGE in pulls[0]["message"], pulls
        print(f"PodsBlocked {blocked['reason']} {said:.1f} s after the job was created")


def test_a_store_image_that_cannot_be_pulled_is_named_not_the_store(kind: KindBed) -> None:
    job = _never_starting_job(kind, storeImage=MISSING_IMAGE)
    with _submitted(kind, "nostore", job) as (ns, name):
        wait_for(
            "PodsBlocked=True naming the store pod's image",
            lambda: _job_condition(kind, ns, name, "PodsBlocked").get("message", "").startswith("store pod"),
            90,
        )
        blocked = _job_condition(kind, ns, name, "PodsBlocked")
        assert blocked["reason"] in PULL_FAILURES and MISSING_IMAGE in blocked["message"], blocked
        assert _job_condition(kind, ns, name, "Ready")["reason"] in PULL_FAILURES


def test_a_missing_secret_is_said_with_the_kubelets_words(kind: KindBed) -> None:
    job = _never_starting_job(kind)
    secret = {"name": "S3_KEY", "valueFrom": {"secretKeyRef": {"name": "etj-no-such-secret", "key": "k"}}}
    job["spec"]["trainer"]["env"].append(secret)
    with _submitted(kind, "nosecret", job) as (ns, name):
        wait_for(
            "PodsBlocked=True/CreateContainerConfigError",
            lambda: (
                _job_condition(kind, ns, name, "PodsBlocked").get("reason") == "CreateContainerConfigError"
            ),
            90,
        )
        blocked = _job_condition(kind, ns, name, "PodsBlocked")
        assert 'secret "etj-no-such-secret" not found' in blocked["message"], blocked
        assert any(
            e.get("type") == "Warning" and e.get("reason") == "CreateContainerConfigError"
            for e in kind.events(ns, name)
        )

"""``etj-train local``: elasticity on a laptop.

Starts ``etj-train store`` and N ``etj-train worker`` agents on loopback (exactly what the operator starts
as pods), each running ``--procs-per-node`` training processes (ranks; a pod's ``procsPerWorker``), then
follows the progress channel and changes membership at given steps. Schedule syntax, comma separated
``STEP:ACTION``, counted in nodes (all of a node's ranks come and go together): ``+K`` start K agents,
``-K`` SIGTERM the K newest agents not already told to go (a graceful spot notice), ``!K`` SIGKILL them
and everything they started (a hard loss), ``^K`` set the job's maximum to K nodes (``kubectl scale``:
the operator POSTs the bounds to the store, and agents started later get K in their environment).
Example: ``--nodes 2 --procs-per-node 2 --schedule 20:+1,40:-2,60:+1``, or ``10:^4,10:+2`` to scale a
job of 2 to 4. The schedule starts once the first N nodes all train together: on a busy machine the
world may first form with fewer (the others join in a resize of their own), and a ``-1`` must not hit a
node still starting.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etj_contract import env as etj_env
from etj_contract.progress import PROGRESS_PATH
from etj_contract.replicas import REPLICAS_PATH, Replicas
from etj_trainer.core.progress import get_json, post_json


def launch_store(
    log: Path | None = None, port: int = 0, http_port: int = 0, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start `etj-train store` on loopback (free ports unless given); return the process and its ports.

    Given ports: a replacement store at the address the agents already hold, as the operator's new store
    pod is behind the Service name they hold."""
    port, http_port = port or free_port(), http_port or free_port()
    cmd = [sys.executable, "-m", "etj_trainer.cli", "store", "--host", "127.0.0.1",
           "--port", str(port), "--http-port", str(http_port)]  # fmt: skip
    out = open(log, "ab") if log is not None else None  # noqa: SIM115 - the child owns it
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if out else None)
    finally:
        if out is not None:
            out.close()
    return proc, port, http_port


@dataclass
class ScheduleEvent:
    step: int
    action: str  # "+", "-", "!", "^"
    count: int


def parse_schedule(text: str) -> list[ScheduleEvent]:
    events = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        step, action = item.split(":", 1)
        if action[0] not in "+-!^":
            raise ValueError(f"bad schedule action {action!r} (use +K, -K, !K or ^K)")
        events.append(ScheduleEvent(int(step), action[0], int(action[1:] or "1")))
    return sorted(events, key=lambda e: e.step)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalAgents:
    env: dict[str, str]
    log_dir: Path
    store: subprocess.Popen[bytes] | None = None
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)
    progress_url: str = ""
    events: list[dict[str, object]] = field(default_factory=list)
    # Agents already told to go (-K, !K). A SIGTERMed agent takes a while to exit (it stops its workers
    # first); the next -K/!K must pick a node still in the world, or a hard kill lands on a node that has
    # left and the world never sees a crash (seen under load: no "recovering in place", 3->2 then 2->3).
    # The Popen objects, not pids: a pid is free for a later agent once a gone one has exited.
    gone: set[subprocess.Popen[bytes]] = field(default_factory=set)

    def start_store(self) -> None:
        self.store, port, http_port = launch_store(self.log_dir / "store.log", env=self.env)
        self.env[etj_env.RDZV_ENDPOINT.name] = f"127.0.0.1:{port}"
        self.progress_url = self.env[etj_env.PROGRESS_URL.name] = f"http://127.0.0.1:{http_port}/progress"
        # What every pod's spec shows (never the token): the store's endpoint and the job's uid.
        public = (etj_env.RDZV_ENDPOINT, etj_env.RDZV_ID)
        (self.log_dir / "job.env").write_text(
            "".join(f"{v.name}={self.env.get(v.name, '')}\n" for v in public)
        )
        deadline = time.monotonic() + 60
        while self.progress() is None:
            if time.monotonic() > deadline or self.store.poll() is not None:
                raise RuntimeError("etj-train store did not come up; see store.log")
            time.sleep(0.2)

    @property
    def token(self) -> str | None:
        return self.env.get(etj_env.PROGRESS_TOKEN.name)

    def progress(self) -> dict[str, Any] | None:
        return get_json(self.progress_url, token=self.token)

    def start_agent(self) -> None:
        i = len(self.agents)
        env = {**self.env, etj_env.WORKER_ID.name: f"worker-{i}"}
        out = open(self.log_dir / f"worker-{i}.log", "wb")  # noqa: SIM115
        self.agents.append(
            subprocess.Popen(
                [sys.executable, "-m", "etj_trainer.cli", "worker"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Its own process group: a hard kill (!K) takes the node whole -- agent, forkserver, workers.
                start_new_session=True,
            )
        )

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [a for a in self.agents if a.poll() is None]

    def in_world(self) -> list[subprocess.Popen[bytes]]:
        """The live agents not yet told to go: what a leave or a kill picks from (newest first)."""
        return [a for a in reversed(self.alive()) if a not in self.gone]

    def apply(self, ev: ScheduleEvent) -> None:
        self.events.append({"time": time.time(), "step": ev.step, "action": f"{ev.action}{ev.count}"})
        print(f"etj-train local: step {ev.step}: {ev.action}{ev.count}", file=sys.stderr, flush=True)
        if ev.action == "^":  # what the operator does on `kubectl scale` (etj_contract.replicas)
            bounds = Replicas(int(self.env.get(etj_env.MIN_WORKERS.name, "1")), ev.count)
            post_json(
                self.progress_url.replace(PROGRESS_PATH, REPLICAS_PATH), bounds.to_json(), token=self.token
            )
            self.env[etj_env.MAX_WORKERS.name] = str(ev.count)
        elif ev.action == "+":
            for _ in range(ev.count):
                self.start_agent()
        else:
            for a in self.in_world()[: ev.count]:
                self.gone.add(a)
                if ev.action == "-":
                    a.send_signal(signal.SIGTERM)  # what a pod's agent gets on a graceful leave
                else:
                    # A lost node: everything on it dies at once, not just the agent (whose workers would
                    # otherwise train on as full ranks and the world would never shrink).
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(a.pid, signal.SIGKILL)

    def stop(self) -> None:
        for p in [*self.agents, self.store]:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in [*self.agents, self.store]:
            if p is not None:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        for a in self.agents:  # nothing a node started outlives the run
            with contextlib.suppress(ProcessLookupError):
                os.killpg(a.pid, signal.SIGKILL)


def _run_env(
    nodes: int, procs_per_node: int, train_env: dict[str, str], log_dir: Path, run_id: str
) -> dict[str, str]:
    """The agents' environment: the job's size and rendezvous, then the caller's ``train_env``."""
    env = {
        **os.environ,
        etj_env.JOB_NAME.name: "local",
        etj_env.RDZV_ID.name: run_id,
        etj_env.NPROC_PER_WORKER.name: str(procs_per_node),
        etj_env.MIN_WORKERS.name: "1",
        etj_env.MAX_WORKERS.name: str(max(nodes, 1)),
        etj_env.STARTUP_WORKERS.name: str(nodes),  # the first world forms with all of them (first_round.py)
        **train_env,
    }
    env.setdefault(etj_env.CHECKPOINT_DIR.name, str(log_dir / "checkpoints"))
    # A token of its own, as the operator gives every job: the store's values and endpoint are authenticated.
    env.setdefault(etj_env.PROGRESS_TOKEN.name, secrets.token_hex(16))
    env.setdefault(etj_env.LOCAL_CHECKPOINT_DIR.name, f"/dev/shm/etj-local-{run_id}")
    return env


def run_local(
    nodes: int,
    schedule: list[ScheduleEvent],
    train_env: dict[str, str],
    log_dir: Path,
    timeout_s: float = 900,
    stagger_s: float = 0.0,
    procs_per_node: int = 1,
    wait_whole: bool = False,
) -> dict[str, object]:
    """Run a job of ``nodes`` agents x ``procs_per_node`` ranks; returns the last progress document (plus
    the applied events and the agents' exit codes).

    ``stagger_s``: seconds between the initial nodes' starts (pods that are scheduled apart).
    ``wait_whole``: an event waits, past its step, until the world is whole -- every node started and not
    told to go trains in it -- so each resize completes before the next (a kill never hits a joiner still
    starting on a busy machine; a schedule of simultaneous events leaves it off).
    """
    pending = list(schedule)
    last: dict[str, object] = {}
    with local_agents(nodes, train_env, log_dir, stagger_s, procs_per_node) as cluster:
        deadline = time.monotonic() + timeout_s
        full = False  # the first `nodes` have trained together: the schedule may start
        while cluster.alive() and time.monotonic() < deadline:
            doc = cluster.progress() or {}
            if doc:
                last = doc
            step = int(doc.get("step", 0) or 0)
            size = int(doc.get("worldSize", 0) or 0)
            full = full or size >= nodes * procs_per_node
            while full and pending and step >= pending[0].step:
                if wait_whole and size != len(cluster.in_world()) * procs_per_node:
                    break
                cluster.apply(pending.pop(0))
                if wait_whole:
                    break  # the next one reads the world this one makes
            time.sleep(0.1)
        last = cluster.progress() or last
        codes = [a.wait(timeout=60) for a in cluster.agents]
    return {**last, "agentExitCodes": codes, "events": cluster.events}


@contextlib.contextmanager
def local_agents(
    nodes: int,
    train_env: dict[str, str],
    log_dir: Path,
    stagger_s: float = 0.0,
    procs_per_node: int = 1,
) -> Iterator[LocalAgents]:
    """The store and ``nodes`` agents started, stopped (with everything they started) on the way out: for
    a caller that drives the membership itself (``apply``), as run_local does by the progress channel and
    a test of a stock script (which reports no steps) does by what the script writes."""
    log_dir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    env = _run_env(nodes, procs_per_node, train_env, log_dir, run_id)
    # Ours to remove afterwards only when we chose it: a directory the caller named is theirs.
    made_local_dir = etj_env.LOCAL_CHECKPOINT_DIR.name not in {**os.environ, **train_env}
    cluster = LocalAgents(env=env, log_dir=log_dir)
    try:
        cluster.start_store()
        for i in range(nodes):
            if i and stagger_s:
                time.sleep(stagger_s)  # the scenario: this node starts later
            cluster.start_agent()
        yield cluster
    finally:
        cluster.stop()
        if made_local_dir:
            shutil.rmtree(env[etj_env.LOCAL_CHECKPOINT_DIR.name], ignore_errors=True)


def main(nodes: int, schedule: str, train_env: dict[str, str], log_dir: Path, procs_per_node: int = 1) -> int:
    result = run_local(nodes, parse_schedule(schedule), train_env, log_dir, procs_per_node=procs_per_node)
    print(json.dumps(result, indent=2))
    return 0 if result.get("finished") else 1

"""A client without the job's token cannot take part in the in-place resizes (issue 37, item 1).

Black-box attacks on a real TCPStore: the attacker is a separate process that knows what every pod's
environment shows -- the store's endpoint and the job's uid (``ETJ_RDZV_ID``) -- and, to make it stronger,
the names a joiner or a membership goes by, but not the token. It runs the trainer's own code with a
guessed token and writes under the store names the protocols used before they were sealed. The job's side
runs with the token. Each attack must change nothing: the attacker is not admitted (so no group forms with
it and no state reaches it), a real joiner takes rank 0's ticket, a recovery adopts the survivors' own list
and does not wait on a forged heartbeat, and nothing a peer sends is unpickled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from etj_contract import env as etj_env
from etj_trainer.resize import join, recover

TOKEN = "the-jobs-token"
UID = "3b1e-job-uid"  # ETJ_RDZV_ID: in every pod's environment, so known to the attacker
MEMBERSHIP = "1700000000.000000"  # a membership's id; the attacker is given it too


@pytest.fixture
def job(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dist.TCPStore, dict[str, str]]]:
    """The job's store, this process as the job's side (with the token), and the attacker's environment."""
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(60))
    endpoint = f"127.0.0.1:{master.port}"
    monkeypatch.setenv(etj_env.RDZV_ENDPOINT.name, endpoint)
    monkeypatch.setenv(etj_env.RDZV_ID.name, UID)
    monkeypatch.setenv(etj_env.PROGRESS_TOKEN.name, TOKEN)
    attacker = {k: v for k, v in os.environ.items() if k != etj_env.PROGRESS_TOKEN.name}
    yield master, {**attacker, etj_env.PROGRESS_TOKEN.name: "a-guess"}


def _attack(env: dict[str, str], code: str, wait: bool = True) -> subprocess.Popen[str]:
    """The attacker: a process of its own, with a raw client ``s`` of the store and the trainer's modules."""
    prelude = (
        "import json, os, sys, time\n"
        "from datetime import timedelta\n"
        "from etj_trainer.core import store_client\n"
        "from etj_trainer.resize import join, recover\n"
        f"s = store_client.connect(os.environ['{etj_env.RDZV_ENDPOINT.name}'], timedelta(60))\n"
        f"uid = '{UID}'\n"
        "try:  # the names the trainer's own code makes with the guessed token\n"
        "    from etj_trainer.core.mac import job_sealer\n"
        "    guess = lambda protocol: job_sealer().name(protocol)\n"
        "except ImportError:  # before the fix: the names were the same for everyone\n"
        "    guess = lambda protocol: protocol\n"
    )
    p = subprocess.Popen([sys.executable, "-c", prelude + code], env=env, text=True, stdout=subprocess.PIPE)
    if wait:
        assert p.wait(90) == 0
    return p


def test_a_tokenless_client_that_queues_itself_is_never_admitted(job: Any) -> None:
    """Run before the fix: a process with the endpoint and uid and the trainer's own ``join.ask`` was
    admitted as rank 2 of 3 and received the model, optimizer, sampler and RNG state."""
    _master, attacker_env = job
    door = join.Door.open()
    raw = (  # the protocol as it was, on the names it used
        "i = s.add(f'etj-join/{uid}/n', 1) - 1\ns.set(f'etj-join/{uid}/waiting/{i}', 'evil-raw:1')\n"
    )
    attacker = _attack(
        attacker_env,
        raw + "print('queued', flush=True)\nprint(join.ask(wait_s=8, node='evil'))\n",
        wait=False,
    )
    assert attacker.stdout is not None and attacker.stdout.readline().strip() == "queued"
    admitted: list[str] = []
    for step in range(40):  # rank 0's step boundaries while the attacker waits
        admitted += door.admit(MEMBERSHIP, step, world=2, max_ranks=4).joiners
        time.sleep(0.1)
    out, _ = attacker.communicate(timeout=60)
    door.close(shut=True)
    assert admitted == [] and not door.pending
    assert out.strip().endswith("None"), out  # no ticket: it forms no group with the world, gets no state


def test_a_forged_ticket_written_before_rank_0s_is_ignored(job: Any) -> None:
    """A tokenless client writes a joiner's ticket (and the size) first, pointing at a "world" of its own
    (where, before the fix, the joiner would unpickle what it was sent): the joiner takes rank 0's."""
    _master, attacker_env = job
    forged = "json.dumps({'key': 'evil', 'rank': 1, 'old': 1})"
    _attack(
        attacker_env,
        f"for p in (f'etj-join/{{uid}}', join._prefix()):\n"
        f"    s.set(f'{{p}}/ticket/pod-b', {forged}); s.set(f'{{p}}/size/evil', '2')\n",
    )
    door = join.Door.open()
    got: list[join.Ticket | None] = []
    joiner = threading.Thread(target=lambda: got.append(join.ask(wait_s=60, node="pod-b")))
    joiner.start()
    adm = join.Admission("", 2, (), 2)
    deadline = time.monotonic() + 60
    while not adm.joiners and joiner.is_alive() and time.monotonic() < deadline:
        adm = door.admit(MEMBERSHIP, 7, world=2, max_ranks=4)
        time.sleep(0.05)
    joiner.join(60)
    door.close(shut=True)
    assert got == [join.Ticket(adm.key, 2, 3, 2)] and adm.joiners == ("pod-b",)


def test_a_forged_admission_is_ignored_by_the_other_old_ranks(job: Any) -> None:
    """A tokenless client writes the admission of a boundary first, claiming a world of 99 ranks under its
    own key: an old rank that is not rank 0 acts on rank 0's admission only."""
    _master, attacker_env = job
    forged = "json.dumps(['evil', 2, ['evil'], 99])"
    _attack(
        attacker_env,
        f"for p in (f'etj-join/{{uid}}', join._prefix()):\n"
        f"    s.set(f'{{p}}/admission/{MEMBERSHIP}/7', {forged})\n",
    )
    door = join.Door.open()
    seen: list[join.Admission] = []
    other = threading.Thread(target=lambda: seen.append(join.admission(None, MEMBERSHIP, 7, 1, 2, 4)))
    other.start()
    time.sleep(0.5)  # let it read what is there first (before the fix: the forged admission)
    mine = join.admission(door, MEMBERSHIP, 7, 0, 2, 4)
    other.join(60)
    door.close(shut=True)
    assert seen == [mine] and mine.new_size == 2


# ---- crash recovery: two survivors of a world of 3 whose rank 2 died --------------------------------------


def _survivor(rank: int, env: dict[str, str], out: str) -> None:
    os.environ.update(env)
    t0 = time.monotonic()
    decision = recover.recover_world(MEMBERSHIP, rank, 3, 1)
    Path(out, str(rank)).write_text(json.dumps([decision.in_place, decision.new_size, time.monotonic() - t0]))
    if dist.is_initialized():
        dist.destroy_process_group()


FORGED_HEARTBEAT = (  # rank 2 "beats" on, under the old name and under the guessed token's
    "t = time.monotonic()\n"
    f"while time.monotonic() - t < {recover.GIVE_UP_S + 10}:\n"
    f"    s.add('etj-hb/{MEMBERSHIP}/2', 1); s.add(recover._hb_key('{MEMBERSHIP}', 2), 1)\n"
    "    time.sleep(0.05)\n"
)
FORGED_MEMBERS = (  # the member list, written first: rank 1 alone, so rank 0 is left out
    f"for p in ('etj-recover/{MEMBERSHIP}', guess('etj-recover') + '/{MEMBERSHIP}'):\n"
    "    s.set(f'{p}/members', '1'); s.set(f'{p}/alive/2', '1')\n"
    "print('written', flush=True)\n"
)
RECOVERY_ATTACKS = {
    "a forged member list (and a forged registration of the dead rank)": FORGED_MEMBERS,
    "a forged heartbeat of the dead rank": "print('written', flush=True)\n" + FORGED_HEARTBEAT,
}


@pytest.mark.parametrize("attack", list(RECOVERY_ATTACKS), ids=list(RECOVERY_ATTACKS))
def test_a_recovery_acts_on_the_survivors_records_only(job: Any, attack: str) -> None:
    _master, attacker_env = job
    attacker = _attack(attacker_env, RECOVERY_ATTACKS[attack], wait=False)
    assert attacker.stdout is not None and attacker.stdout.readline().strip() == "written"
    time.sleep(0.3)  # the heartbeat is moving
    env = {
        k: os.environ[k]
        for k in (etj_env.RDZV_ENDPOINT.name, etj_env.RDZV_ID.name, etj_env.PROGRESS_TOKEN.name)
    }
    try:
        with tempfile.TemporaryDirectory() as out:
            mp.spawn(_survivor, args=(env, out), nprocs=2, join=True)
            results = [json.loads(Path(out, str(r)).read_text()) for r in (0, 1)]
    finally:
        attacker.kill()
        attacker.wait()
    assert [r[:2] for r in results] == [[True, 2], [True, 2]]
    assert max(r[2] for r in results) < recover.GIVE_UP_S / 2  # rank 2 found dead, not waited on


# ---- nothing a peer sends is unpickled -------------------------------------------------------------------


class _Payload:
    """What a peer pickles: unpickling it creates ``marker`` (stands in for os.system)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.marker,))


def _peer(rank: int, init: str, marker: str, out: str) -> None:
    from etj_trainer.resize.state_sync import broadcast_state

    dist.init_process_group(
        "gloo", init_method=f"file://{init}", rank=rank, world_size=2, timeout=timedelta(30)
    )
    if rank == 0:  # the peer: sends a pickle where the state's header goes
        dist.broadcast_object_list([_Payload(marker)], src=0)
        Path(out).write_text("sent")
    else:
        try:
            broadcast_state(None, 0, 1, lambda *_: None, torch.device("cpu"))
        except Exception as e:  # refused: the header is not one this trainer sends
            Path(out + ".victim").write_text(type(e).__name__)
    dist.destroy_process_group()


def test_a_pickle_sent_as_the_states_header_runs_no_code() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        marker = str(Path(tmp) / "ran")
        mp.spawn(_peer, args=(str(Path(tmp) / "init"), marker, str(Path(tmp) / "out")), nprocs=2, join=True)
        assert not Path(marker).exists()
        assert Path(tmp, "out.victim").read_text() == "ValueError"

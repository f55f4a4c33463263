"""What only a real kubelet and a real machine loss do (the whole kind suite: `make e2e-kind`).

A kind node is a Docker container: `docker kill` takes the machine away at once, with its kubelet, its
pods and their sockets; no drain, no SIGTERM, no notice. The node turns NotReady only when its heartbeats
stop (node-monitor-grace-period), and its pods stay bound to it until the operator or the pod garbage
collector removes them. `docker start` is capacity coming back: the same node registers Ready again.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.kind.kindbed import KindBed, exactly_once, running_job, two_worker_job

pytestmark = [pytest.mark.slow, pytest.mark.kind, pytest.mark.kind_full]

EPOCHS = 16


def spot_workers_job() -> dict[str, Any]:
    """Two workers on the two spot nodes, the store alone on the on-demand node; long enough (>= 1 s a
    step, ~370 steps) for a loss to be noticed, recovered from and undone while it trains."""
    return two_worker_job(EPOCHS, 1.0, spot_only=True)


def _resizes(status: dict[str, Any]) -> list[dict[str, Any]]:
    return list(status.get("resizeHistory") or [])


def test_a_killed_worker_node_the_job_goes_on_in_place_and_gets_the_worker_back(kind: KindBed) -> None:
    with running_job(kind, "nodekill", spot_workers_job(), EPOCHS) as run:
        workers = run.wait("two workers training", lambda: run.training_workers(2, min_step=5))
        store_node = set(run.running_on("rendezvous").values())
        victim_pod, victim = next((p, n) for p, n in sorted(workers.items()) if n not in store_node)
        survivor = next(p for p in workers if p != victim_pod)
        at_kill = run.step()
        kind.kill_node(victim)

        run.wait(
            "the survivor training alone",
            lambda: run.status().get("worldSize") == 1 and run.step() >= at_kill + 5,
            timeout=900,
        )
        assert survivor in run.running_on("worker"), "the survivor was restarted or replaced"
        kind.start_node(victim)
        back_at = run.step()
        run.wait(
            "two workers again after the node came back",
            lambda: run.status().get("worldSize") == 2 and run.step() > back_at,
            timeout=900,
        )
        assert survivor in run.running_on("worker"), "the survivor was restarted or replaced"
        result = run.result()

    status = result.status.get("status") or {}
    assert result.phase == "Succeeded", (run.run_dir, status.get("conditions"))
    history = _resizes(status)
    assert any(r["from"] == 2 and r["to"] == 1 for r in history), history
    assert any(r["from"] == 1 and r["to"] == 2 for r in history), history
    assert not status.get("failures"), status  # a lost machine is not a crash of the trainer
    exactly_once(run.run_dir, EPOCHS)


def test_a_killed_store_node_a_new_store_and_the_world_reforms(kind: KindBed) -> None:
    with running_job(kind, "storekill", spot_workers_job(), EPOCHS) as run:
        run.wait(
            "two workers training",
            lambda: run.status().get("worldSize") == 2 and run.step() >= 5,
        )
        ((store_pod, store_node),) = run.running_on("rendezvous").items()
        workers = run.running_on("worker")
        assert store_node not in workers.values(), (store_node, workers)
        kind.kill_node(store_node)
        # The operator replaces a store whose node is lost; the only on-demand node is that one, so the new
        # store waits for it: capacity comes back once the old store pod is gone.
        run.wait(
            "the lost store pod removed",
            lambda: (
                store_pod not in {p["metadata"]["name"] for p in run.pods("rendezvous")}
                or any(
                    p["metadata"]["name"] == store_pod and p["metadata"].get("deletionTimestamp")
                    for p in run.pods("rendezvous")
                )
            ),
            timeout=600,
        )
        kind.start_node(store_node)
        resumed_at = run.step()
        run.wait(
            "training again with a new store",
            lambda: (
                run.running_on("rendezvous")
                and store_pod not in run.running_on("rendezvous")
                and run.step() > resumed_at + 3
            ),
            timeout=900,
        )
        assert set(run.running_on("worker")) == set(workers), "a worker was restarted or replaced"
        result = run.result()

    status = result.status.get("status") or {}
    assert result.phase == "Succeeded", (run.run_dir, status.get("conditions"))
    assert not status.get("failures"), status
    assert all((r.get("stepsLost") or 0) <= 1 for r in _resizes(status)), _resizes(status)
    exactly_once(run.run_dir, EPOCHS)

"""Shared test configuration: the real-control-plane fixtures and the GPU skip rule."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["tests.plugins.cluster"]


def _own_bed_per_xdist_worker() -> None:
    """Under pytest-xdist (`make test` runs `-n 2`) each worker process gets a local cluster of its own: its
    own name (state under ~/.cache/etj/clusters/<name>), its own ports and so its own loopback pod network
    (proclet/env.py's pod_network follows the port base). Set before any fixture reads them."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    index = int(worker.removeprefix("gw"))
    name = os.environ.get("ETJ_CLUSTER_NAME", "etj")
    base = int(os.environ.get("ETJ_CLUSTER_PORT_BASE", "16400"))
    # 1,000 ports apart, above the default bed's and the benches' own (18400, 18600): 20400, 21400, ...
    os.environ["ETJ_CLUSTER_NAME"] = f"{name}-{worker}"
    os.environ["ETJ_CLUSTER_PORT_BASE"] = str(base + 4000 + 1000 * index)


_own_bed_per_xdist_worker()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # CI never has a GPU: GPU tests skip cleanly instead of failing.
    try:
        import torch

        has_gpu = bool(torch.cuda.is_available())
    except Exception:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

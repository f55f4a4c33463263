"""Shared test configuration: the real-control-plane fixtures and the GPU skip rule."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.plugins.cluster"]


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

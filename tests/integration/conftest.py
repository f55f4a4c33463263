"""Fixtures of the operator integration tests: a Bed (nodes, jobs, polling) and a running operator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.opbed import Bed, OperatorProcess
from tests.plugins.cluster import Cluster


@pytest.fixture
def bed(cluster: Cluster, namespace: str) -> Iterator[Bed]:
    b = Bed(cluster, namespace)
    yield b
    b.cleanup()


@pytest.fixture
def operator(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log").start()
    yield op
    op.stop()
    print(op.logs())  # captured: pytest shows it only when the test failed

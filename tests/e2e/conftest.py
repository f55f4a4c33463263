from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.e2econfig import E2EConfig


@pytest.fixture(scope="module")
def kubeconfig(request: pytest.FixtureRequest) -> Path:
    """The cluster the e2e jobs run on: ETJ_E2E_KUBECONFIG's, else the local control plane."""
    config = E2EConfig.from_env()
    if config.kubeconfig is not None:
        return config.kubeconfig
    cluster = request.getfixturevalue("cluster")
    return Path(cluster.kubeconfig)

"""The Kubernetes API client every etj call goes through: its configuration, and a timeout on every request.

The synchronous client waits forever by default. One call that hangs (a half-open connection to an
apiserver replica that went away, a stuck proxy) would stall its job's loop, and with it every drain of
that job, until the operator restarts. ``TimedApiClient`` gives each request a connect and a read timeout
unless the caller passes its own; the retry loop in ``client.KubeClient`` then treats it like any other
failed call.
"""

from __future__ import annotations

import os
from typing import Any

from kubernetes import client, config

# (connect, read) seconds. Every etj call is a single small object or a list of one job's pods: the
# apiserver answers in milliseconds, so 30 s is a hung call, not a slow one.
REQUEST_TIMEOUT: tuple[float, float] = (5.0, 30.0)


class TimedApiClient(client.ApiClient):
    """An ApiClient whose every request has ``timeout`` unless the call gives one."""

    def __init__(self, configuration: client.Configuration, timeout: tuple[float, float] = REQUEST_TIMEOUT):
        super().__init__(configuration)
        self.timeout = timeout

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        # The generated API methods always pass _request_timeout, as None when the caller gave none.
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self.timeout
        return super().call_api(*args, **kwargs)


def load_configuration() -> client.Configuration:
    """In-cluster credentials, else the kubeconfig at $KUBECONFIG (``--kubeconfig`` sets it)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        # Explicit path: the client computes its default from $KUBECONFIG at import time, before
        # `--kubeconfig` could set it.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    cfg: client.Configuration = client.Configuration.get_default_copy()
    # Drains of many pods at once run in parallel threads; give them enough connections.
    cfg.connection_pool_maxsize = 64
    return cfg


def api_client(timeout: tuple[float, float] = REQUEST_TIMEOUT) -> TimedApiClient:
    return TimedApiClient(load_configuration(), timeout)

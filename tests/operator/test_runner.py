"""Operator wiring that broke once: login with a custom registry, --kubeconfig, flags."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import kopf
import pytest
from kopf._core.intents.causes import Activity  # not re-exported by kopf

from etj_operator.api.models import CapacityType
from etj_operator.k8s import handlers
from etj_operator.k8s.main import _rules, build_state, parse_args


def test_custom_registry_has_a_login_handler() -> None:
    # Regression: a plain OperatorRegistry lacks kopf's default login handlers ("Ran out of valid
    # credentials"); the operator must register its own.
    found = handlers.KOPF_REGISTRY._activities.get_handlers(activity=Activity.AUTHENTICATION)
    assert [h.fn for h in found] == [handlers.login]


def test_login_reads_kubeconfig_from_the_environment_at_call_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: the kubernetes client fixes its default kubeconfig path at import time, so a
    # --kubeconfig set later was ignored. Our login must see the variable when it runs.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    info: Any = cast(Any, handlers.login)(logger=logging.getLogger("t"), settings=kopf.OperatorSettings())
    assert info is not None and info.server == "https://127.0.0.1:1" and info.token == "t"


def test_flags() -> None:
    args = parse_args(
        [
            "-n",
            "a",
            "-n",
            "b",
            "--spot-label",
            "example.com/lifecycle=spot",
            "--default-capacity-type",
            "spot",
            "--metrics-port",
            "0",
        ]
    )
    assert args.namespace == ["a", "b"] and args.metrics_port == 0
    rules = _rules(args)
    assert rules.default == CapacityType.SPOT
    assert rules.capacity_type({"example.com/lifecycle": "spot"}) == CapacityType.SPOT
    assert build_state(args).settings.progress_seconds == 10.0
    with pytest.raises(SystemExit):
        _rules(parse_args(["--spot-label", "novalue"]))


def test_watch_handlers_run_on_the_event_loop() -> None:
    # Regression: sync handlers run in kopf's executor threads, where kicking a job loop's
    # asyncio.Event does not wake the loop; drains then waited for the next timer (seconds).
    import inspect

    registry = handlers.KOPF_REGISTRY
    fns = [h.fn for h in registry._watching.get_all_handlers()] + [
        h.fn for h in registry._indexing.get_all_handlers()
    ]
    assert fns and all(inspect.iscoroutinefunction(fn) for fn in fns), [
        getattr(f, "__name__", f) for f in fns
    ]

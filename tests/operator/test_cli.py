"""`etj`: the operator's command line finds the test bed's commands through entry points, never by import."""

from __future__ import annotations

import tomllib
from importlib.metadata import EntryPoint

import pytest

from etj_operator import cli
from tests.chart.helmbed import REPO

CALLS: list[list[str]] = []


def hello(argv: list[str]) -> int:
    """say hello (a command another package adds)"""
    CALLS.append(argv)
    return 7


def _with(monkeypatch: pytest.MonkeyPatch, *eps: EntryPoint) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [ep for ep in eps if ep.group == group])


def test_a_command_an_installed_package_adds_runs_with_the_rest_of_the_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _with(monkeypatch, EntryPoint("hello", "tests.operator.test_cli:hello", cli.PLUGIN_GROUP))
    CALLS.clear()
    assert cli.main(["hello", "up", "--name", "x"]) == 7
    assert CALLS == [["up", "--name", "x"]]


def test_help_lists_added_commands_with_their_docstring(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _with(monkeypatch, EntryPoint("hello", "tests.operator.test_cli:hello", cli.PLUGIN_GROUP))
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "say hello" in out and "operator" in out and "crd" in out


def test_a_declared_command_whose_package_is_not_installed_is_left_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The operator image: the metadata names etj_testbed's commands, the package is not there.
    _with(monkeypatch, EntryPoint("cluster", "etj_not_installed.cli:cluster", cli.PLUGIN_GROUP))
    assert cli.plugins() == {}
    with pytest.raises(SystemExit):
        cli.main(["cluster", "up"])
    assert "invalid choice: 'cluster'" in capsys.readouterr().err


def test_the_project_declares_the_test_beds_commands_and_they_load() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["entry-points"][cli.PLUGIN_GROUP]
    assert set(declared) == {"cluster", "demo", "kueue"}
    for name, value in declared.items():
        command = EntryPoint(name, value, cli.PLUGIN_GROUP).load()
        assert value.startswith("etj_testbed.") and callable(command) and command.__doc__

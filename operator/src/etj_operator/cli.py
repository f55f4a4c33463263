"""The `etj` command: `etj operator run`, `etj crd generate`, and the commands other installed packages add.

The test bed (`etj_testbed`: `etj cluster`, `etj demo`) adds its commands through the `etj.commands`
entry-point group (pyproject.toml), so the operator never imports it and the operator image, which does not
install it, has an `etj` without them.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points

PLUGIN_GROUP = "etj.commands"

Command = Callable[[list[str]], int]


def _importable(ep: EntryPoint) -> bool:
    try:
        return importlib.util.find_spec(ep.module) is not None
    except ModuleNotFoundError:  # its package is absent: the operator image declares, not ships, the test bed
        return False


def plugins() -> dict[str, EntryPoint]:
    """The installed packages' commands, by name: each entry point names a function `(argv) -> exit code`.

    The project's metadata declares the test bed's commands in every install; the operator image has no
    test bed, so only the entry points whose module is there count."""
    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP) if _importable(ep)}


def _operator(rest: list[str]) -> int:
    from etj_operator.k8s.main import run_operator

    return run_operator(rest)


def _crd(rest: list[str]) -> int:
    from etj_operator.api.crd import main as crd_main

    return crd_main(rest)


def _check(rest: list[str]) -> int:
    from etj_operator.k8s.netpol_check import main as check_main

    return check_main(rest)


BUILTIN: dict[str, tuple[Command, str, str]] = {
    # name: (command, the sub-action it accepts and drops, help)
    "operator": (_operator, "run", "run the operator: `etj operator run [--namespace NS] ...`"),
    "crd": (_crd, "generate", "`etj crd generate`: write crds/ from the pydantic models"),
    "check": (_check, "network-policy", "`etj check network-policy -n NS JOB`: is NetworkPolicy enforced?"),
}


def _help_of(ep: EntryPoint) -> str:
    doc = getattr(ep.load(), "__doc__", None) or ep.value
    return doc.strip().splitlines()[0]


def build_parser(found: dict[str, EntryPoint]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="etj", description="ElasticTrainingJob: elastic PyTorch on K8s")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, _, help_text) in BUILTIN.items():
        sub.add_parser(name, help=help_text, add_help=False)
    for name, ep in sorted(found.items()):
        sub.add_parser(name, help=_help_of(ep), add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Every command parses its own flags: the rest of the line goes to the module that owns it.
    if argv and argv[0] in BUILTIN:
        command, action, _ = BUILTIN[argv[0]]
        rest = argv[1:]
        if rest and rest[0] == action:
            rest = rest[1:]
        return command(rest)
    found = plugins()
    if argv and argv[0] in found:
        plugin: Command = found[argv[0]].load()
        return plugin(argv[1:])
    build_parser(found).parse_args(argv)  # --help, or an error naming the commands there are
    return 2


if __name__ == "__main__":
    sys.exit(main())

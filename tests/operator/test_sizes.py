"""The house rule on size: no module over 400 lines, no function over 60, unless it says why.

A long module says so in its docstring, a long function in its own, with one line that starts with
"Long because:" (the reason a reader would otherwise ask for). Walked with ``ast`` over etj_operator's
source, the test bed (``testbed/src``) and the benchmarks (``bench/``), so a new long function fails here,
not in review. (The trainer's own walk is tests/trainer/test_layout.py.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import etj_operator

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
REASON = "Long because:"
SOURCE = Path(etj_operator.__file__).resolve().parent
REPO = Path(__file__).resolve().parents[2]
# Each tree the rule covers, by the name a failure reports it under.
ROOTS = {"operator": SOURCE, "testbed": REPO / "testbed" / "src", "bench": REPO / "bench"}


def _explains(docstring: str | None) -> bool:
    return any(line.strip().startswith(REASON) for line in (docstring or "").splitlines())


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def oversized(path: Path) -> list[str]:
    """What in ``path`` is over the limits without a reason: "module (N lines)", "name() (N lines)"."""
    text = path.read_text()
    tree = ast.parse(text, filename=str(path))
    found: list[str] = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES and not _explains(ast.get_docstring(tree)):
        found.append(f"module ({lines} lines)")
    for fn in _functions(tree):
        length = (fn.end_lineno or fn.lineno) - fn.lineno + 1  # the def line to the last, decorators not
        if length > MAX_FUNCTION_LINES and not _explains(ast.get_docstring(fn)):
            found.append(f"{fn.name}() ({length} lines)")
    return found


def test_the_walk_sees_the_operator_the_bed_and_the_bench() -> None:
    modules = {
        f"{name}/{p.relative_to(root).as_posix()}" for name, root in ROOTS.items() for p in root.rglob("*.py")
    }
    assert {
        "operator/decide/plan/planner.py",
        "operator/k8s/reconciler.py",
        "testbed/etj_testbed/localcluster/proclet/harness.py",
        "testbed/etj_testbed/demo/local.py",
        "bench/chaos.py",
        "bench/economics/accounting.py",
    } <= modules


@pytest.mark.parametrize("tree", sorted(ROOTS))
def test_no_module_or_function_is_long_without_a_reason(tree: str) -> None:
    root = ROOTS[tree]
    found = {p.relative_to(root).as_posix(): bad for p in sorted(root.rglob("*.py")) if (bad := oversized(p))}
    assert found == {}, f"split these, or give a one-line '{REASON}' reason in their docstring: {found}"


def test_the_check_flags_what_it_should(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long_fn = tmp_path / "long_fn.py"
    long_fn.write_text(f"def f() -> None:\n{body}\n")
    assert oversized(long_fn) == [f"f() ({MAX_FUNCTION_LINES + 1} lines)"]
    long_fn.write_text(f'def f() -> None:\n    """Long because: a test."""\n{body}\n')
    assert oversized(long_fn) == []
    long_module = tmp_path / "long_module.py"
    long_module.write_text("\n".join(f"x{i} = {i}" for i in range(MAX_MODULE_LINES + 1)) + "\n")
    assert oversized(long_module) == [f"module ({MAX_MODULE_LINES + 1} lines)"]
    long_module.write_text('"""A module.\n\nLong because: a test.\n"""\n' + long_module.read_text())
    assert oversized(long_module) == []

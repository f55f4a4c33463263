"""The operator's house rule on size: no module over 400 lines, no function over 60, unless it says why.

A long module says so in its docstring, a long function in its own, with one line that starts with
"Long because:" (the reason a reader would otherwise ask for). Walked with ``ast`` over etj_operator's
source, so a new long function fails here, not in review.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import etj_operator

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
REASON = "Long because:"
SOURCE = Path(etj_operator.__file__).resolve().parent


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


def test_the_walk_sees_the_operator() -> None:
    modules = {p.relative_to(SOURCE).as_posix() for p in SOURCE.rglob("*.py")}
    assert {"decide/planner.py", "decide/plan_steps.py", "k8s/reconciler.py"} <= modules


def test_no_module_or_function_is_long_without_a_reason() -> None:
    found = {
        p.relative_to(SOURCE).as_posix(): bad for p in sorted(SOURCE.rglob("*.py")) if (bad := oversized(p))
    }
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

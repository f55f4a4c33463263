"""The trainer's house rules (docs/architecture.md), checked on the code itself.

* No import cycles inside etj_trainer, module by module (the layers contract in pyproject.toml, run by
  ``make lint``, checks the subpackages; this checks the modules within them too). TYPE_CHECKING-only
  imports count: an annotation that needs a cycle is a dependency that needs a narrower interface.
* No production module over 400 lines and no function over 60, unless its docstring has a line starting
  ``Long because:`` with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

import etj_trainer


def import_cycles(graph: grimp.ImportGraph, root: str = "etj_trainer") -> list[list[str]]:
    """Every strongly connected set of more than one module under ``root`` (Tarjan), sorted."""
    mods = sorted(m for m in graph.modules if m == root or m.startswith(root + "."))
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in mods) for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(m: str) -> None:
        # recursive: the trainer has ~50 modules, far below the recursion limit
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in edges[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            scc = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                scc.append(n)
                if n == m:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for m in mods:
        if m not in index:
            visit(m)
    return sorted(found)


def test_etj_trainer_has_no_import_cycles() -> None:
    assert import_cycles(grimp.build_graph("etj_trainer")) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    # The check itself: the loop imports the step; a step importing the loop back is a cycle.
    graph = grimp.build_graph("etj_trainer")
    graph.add_import(importer="etj_trainer.loop.step", imported="etj_trainer.loop.job")
    cycles = import_cycles(graph)
    assert any({"etj_trainer.loop.job", "etj_trainer.loop.step"} <= set(c) for c in cycles), cycles


# Sizes. A module or function over its limit names its reason on a docstring line of its own.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60
REASON = "Long because:"
PACKAGE = Path(etj_trainer.__file__).parent
DOCUMENTED = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _has_reason(node: ast.AST) -> bool:
    doc = ast.get_docstring(node) if isinstance(node, DOCUMENTED) else None
    return doc is not None and any(line.strip().startswith(REASON) for line in doc.splitlines())


def oversized(source: str, name: str) -> list[str]:
    """What in one module is over its limit without a reason."""
    tree = ast.parse(source)
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES and not _has_reason(tree):
        found.append(f"{name}: {lines} lines")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > MAX_FUNCTION_LINES and not _has_reason(node):
                found.append(f"{name}:{node.lineno} {node.name}(): {n} lines")
    return found


def test_no_module_or_function_is_over_its_size_without_a_reason() -> None:
    found = [
        msg
        for path in sorted(PACKAGE.rglob("*.py"))
        for msg in oversized(path.read_text(), str(path.relative_to(PACKAGE)))
    ]
    assert found == [], f"split these, or say why on a docstring line starting {REASON!r}: {found}"


def test_the_size_check_finds_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert oversized(f"def f() -> None:\n{body}\n", "m.py") == [f"m.py:1 f(): {MAX_FUNCTION_LINES + 1} lines"]
    reasoned = f'def f() -> None:\n    """Long because: a test."""\n{body}\n'
    assert oversized(reasoned, "m.py") == []


# Narrow views. A layer that reads the one above through a Protocol (docs/architecture.md) reads a few
# things: a protocol of many members is a god object seen through a keyhole the size of the door.
MAX_PROTOCOL_MEMBERS = 6


def _is_typing_protocol(base: ast.expr) -> bool:
    """``Protocol``, ``Protocol[T]`` or ``typing.Protocol`` (not asyncio's transport protocols)."""
    base = base.value if isinstance(base, ast.Subscript) else base
    if isinstance(base, ast.Attribute):
        return base.attr == "Protocol" and isinstance(base.value, ast.Name) and base.value.id == "typing"
    return isinstance(base, ast.Name) and base.id == "Protocol"


def wide_protocols(source: str, name: str) -> list[str]:
    """Every Protocol class in one module with more members (attributes, properties, methods) than allowed."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        if not any(_is_typing_protocol(b) for b in node.bases):
            continue
        members = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AnnAssign)]
        if len(members) > MAX_PROTOCOL_MEMBERS:
            found.append(f"{name}:{node.lineno} {node.name}: {len(members)} members")
    return found


def test_no_protocol_has_more_than_a_few_members() -> None:
    found = [
        msg for path in sorted(PACKAGE.rglob("*.py")) for msg in wide_protocols(path.read_text(), path.name)
    ]
    assert found == [], f"split these into smaller protocols: {found}"


def test_the_protocol_check_finds_a_wide_protocol() -> None:
    body = "\n".join(f"    def m{i}(self) -> int: ..." for i in range(MAX_PROTOCOL_MEMBERS + 1))
    source = f"from typing import Protocol\n\nclass Host(Protocol):\n{body}\n"
    assert wide_protocols(source, "m.py") == [f"m.py:3 Host: {MAX_PROTOCOL_MEMBERS + 1} members"]
    assert wide_protocols(source.replace("(Protocol)", ""), "m.py") == []
    assert wide_protocols(source.replace("(Protocol)", "(asyncio.Protocol)"), "m.py") == []


# The loop is private behind etj_trainer.elastic (pyproject.toml's contracts hold the package itself);
# the benchmarks and the examples are scripts outside it, so this checks them: the public API only.
REPO = PACKAGE.parents[2]


def loop_imports(source: str) -> list[str]:
    """The modules under etj_trainer.loop a script imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        found += [n for n in names if n == "etj_trainer.loop" or n.startswith("etj_trainer.loop.")]
    return found


def test_benchmarks_and_examples_use_the_public_loop_api_only() -> None:
    scripts = [p for d in ("bench", "examples") for p in sorted((REPO / d).rglob("*.py"))]
    assert scripts, REPO
    found = {str(p.relative_to(REPO)): m for p in scripts if (m := loop_imports(p.read_text()))}
    assert found == {}, f"import these from etj_trainer.elastic: {found}"


def test_the_public_api_check_finds_an_import_of_the_loop() -> None:
    assert loop_imports("from etj_trainer.loop.step import Step\nimport etj_trainer.elastic\n") == [
        "etj_trainer.loop.step"
    ]
    assert loop_imports("from etj_trainer.loop import job\n") == ["etj_trainer.loop"]

"""The trainer's house rules (docs/architecture.md), checked on the code itself.

* No import cycles inside etj_trainer, module by module (the layers contract in pyproject.toml, run by
  ``make lint``, checks the subpackages; this checks the modules within them too). TYPE_CHECKING-only
  imports count: an annotation that needs a cycle is a dependency that needs a narrower interface.
"""

from __future__ import annotations

import grimp


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

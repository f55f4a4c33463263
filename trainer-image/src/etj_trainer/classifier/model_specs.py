"""What a model spec (``ETJ_MODEL``, ``--model``) names, checked before any worker builds it.

Standard library only at import: ``etj-train worker`` checks its job's inputs before it imports torch (its
forkserver imports torch meanwhile, agent/worker.py), so there the check is *shallow*: the module is found
and defines the callable in its source, without running it. ``etj-train local|train`` check *deep*: the
module is imported and torchvision's model names are listed (models.py builds them).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util

# The built-in models' module before the trainer's subpackages (issue 27): job specs written then
# (ETJ_MODEL, --model) name it, and must keep working.
OLD_MODULES = {"etj_trainer.models": "etj_trainer.classifier.models"}


def model_problem(spec: str, deep: bool = True) -> str | None:
    """What is wrong with a model spec (None: nothing found): a ``module:callable`` whose module does not
    import (deep) or cannot be found (shallow) or has no such callable, or an unknown torchvision name
    (deep only: listing them imports torchvision)."""
    if ":" not in spec:
        if not deep:
            return None
        import torchvision

        known = spec in torchvision.models.list_models()
        return None if known else f"{spec}: not a torchvision model name, nor module:callable"
    module_name, attr = spec.split(":", 1)
    module_name = OLD_MODULES.get(module_name, module_name)
    if deep:
        try:
            module = importlib.import_module(module_name)
        except Exception as e:  # any error importing it is the user's to see, named
            return f"{spec}: module {module_name!r} does not import ({type(e).__name__}: {e})"
        has = callable(getattr(module, attr, None))
    else:
        try:
            found = importlib.util.find_spec(module_name)
        except (ImportError, ValueError) as e:
            return f"{spec}: module {module_name!r} does not import ({type(e).__name__}: {e})"
        if found is None:
            return f"{spec}: module {module_name!r} does not import (ModuleNotFoundError: no such module)"
        has = _defines(found.origin, attr)
    return None if has else f"{spec}: module {module_name!r} has no callable {attr!r}"


def _defines(origin: str | None, name: str) -> bool:
    """Whether a module's source binds ``name`` at its top level (True when there is no source to read:
    an extension module, a namespace package)."""
    if origin is None or not origin.endswith(".py"):
        return True
    try:
        with open(origin, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return True  # the worker's import will say what is wrong with it
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        imported = node.names if isinstance(node, ast.Import | ast.ImportFrom) else []
        if any((a.asname or a.name.split(".")[0]) == name for a in imported):
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False

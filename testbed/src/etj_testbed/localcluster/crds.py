"""Waiting until CustomResourceDefinitions are served.

``kubectl wait --for=condition=Established`` fails at once, instead of waiting, while a CRD just created has
no ``status.conditions`` yet ("accessor error: <nil>"): on a loaded machine the apiextensions controller
can take that long, and a clean-clone ``make test`` had 103 tests error on it through the session fixture.
So the condition is polled here, treating "no conditions yet" as "not yet".
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any


def established(doc: Mapping[str, Any]) -> bool:
    """Whether every CRD in ``doc`` (one CRD, or a list from ``kubectl get crd -o json``) is Established."""
    items = doc.get("items") if "items" in doc else [doc]
    if not items:
        return False
    return all(
        any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (item.get("status") or {}).get("conditions") or []
        )
        for item in items
    )


def wait_established(kubectl: Callable[..., str], *target: str, timeout: float = 120.0) -> None:
    """Poll ``kubectl get TARGET -o json`` (``kubectl`` returns stdout) until ``established``."""
    deadline = time.monotonic() + timeout
    while not established(json.loads(kubectl("get", *target, "-o", "json"))):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{' '.join(target)} not Established after {timeout:.0f} s")
        time.sleep(0.25)

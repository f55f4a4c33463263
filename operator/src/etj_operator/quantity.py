"""Just enough of Kubernetes resource.Quantity for countable resources (GPUs, pods)."""

from __future__ import annotations

import re

_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_RE = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([a-zA-Z]*)$")


def parse_count(value: object) -> int | None:
    """Whole units of a quantity ("4", 4, "2k"); None when it is not a whole count (e.g. "500m", "1.5")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return None
    match = _RE.match(value.strip())
    if not match:
        return None
    number, suffix = match.groups()
    mult = _DECIMAL.get(suffix) or _BINARY.get(suffix)
    if mult is None:
        return None
    amount = float(number) * mult
    return int(amount) if amount == int(amount) else None

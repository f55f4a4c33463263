"""Just enough of Kubernetes resource.Quantity: whole counts (GPUs, pods) and milli-units (cpu, memory)."""

from __future__ import annotations

import re
from decimal import Decimal

_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_RE = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([a-zA-Z]*)$")
_EXPONENT = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE]([+-]?[0-9]+)$")
# cpu and memory are counted in thousandths of their unit ("500m" cpu is 500), so that both fit integers.
MILLI_RESOURCES = ("cpu", "memory")


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


def parse_milli(value: object) -> int | None:
    """Thousandths of a quantity, rounded up ("500m" -> 500, "2" -> 2000, "1Ki" -> 1024000); None when it
    does not parse. Rounded up like the scheduler does, so a request is never under-counted."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value * 1000
    if not isinstance(value, str):
        return None
    text = value.strip()
    exp = _EXPONENT.match(text)
    if exp:
        amount = Decimal(exp.group(1)) * Decimal(10) ** int(exp.group(2))
    else:
        match = _RE.match(text)
        if not match:
            return None
        number, suffix = match.groups()
        if suffix == "m":
            mult = Decimal(1) / 1000
        elif suffix == "u":
            mult = Decimal(1) / 10**6
        elif suffix == "n":
            mult = Decimal(1) / 10**9
        else:
            raw = _DECIMAL.get(suffix) or _BINARY.get(suffix)
            if raw is None:
                return None
            mult = Decimal(raw)
        amount = Decimal(number) * mult
    milli = amount * 1000
    whole = int(milli)
    return whole if milli == whole else whole + 1

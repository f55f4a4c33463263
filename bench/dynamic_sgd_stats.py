"""What both Dynamic SGD experiments share (dynamic_sgd_experiment.py, dynamic_sgd_cnn.py): the optimiser's
momentum, the fingerprint of weights and data order, and the paired per-seed statistics of a dynamic arm
against the jump (an exact sign test for the verdict, a paired t statistic for context).
"""

from __future__ import annotations

import hashlib
import math
import statistics
from typing import Any

import numpy as np

MOMENTUM = 0.9


def sha(*arrays: np.ndarray) -> str:
    """A short fingerprint of arrays (initial weights, sample order): equal across arms, or the
    comparison is not paired."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def mean_std(xs: list[float]) -> dict[str, float | None]:
    finite = [x for x in xs if math.isfinite(x)]
    if not finite:
        return {"mean": None, "std": None}
    return {
        "mean": round(statistics.mean(finite), 4),
        "std": round(statistics.stdev(finite), 4) if len(finite) > 1 else 0.0,
    }


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided binomial sign test (ties dropped)."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2**n
    return min(1.0, 2 * tail)


def t_two_sided_p(t: float, df: int) -> float:
    """Two-sided p of Student's t with integer ``df`` (closed form, Abramowitz & Stegun 26.7.3/26.7.4)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    term, series = 1.0, 1.0
    if df % 2:  # A = 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ... up to cos^(df-3)))
        for j in range(1, (df - 1) // 2):
            term *= c2 * (2 * j) / (2 * j + 1)
            series += term
        inside = 2 / math.pi * (theta + (s * math.cos(theta) * series if df > 1 else 0.0))
    else:  # A = sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ... up to cos^(df-2))
        for j in range(1, df // 2):
            term *= c2 * (2 * j - 1) / (2 * j)
            series += term
        inside = s * series
    return min(1.0, max(0.0, 1.0 - inside))


def compare(dyn: list[float], jump: list[float], lower_is_better: bool = True) -> dict[str, Any]:
    """Paired per-seed comparison of a dynamic arm against the jump (diverged runs count as the worst)."""
    sign = 1.0 if lower_is_better else -1.0
    wins = sum(1 for d, j in zip(dyn, jump, strict=True) if sign * (d - j) < 0)
    losses = sum(1 for d, j in zip(dyn, jump, strict=True) if sign * (d - j) > 0)
    diffs = [d - j for d, j in zip(dyn, jump, strict=True) if math.isfinite(d) and math.isfinite(j)]
    t_stat = t_p = None
    if len(diffs) > 1 and statistics.stdev(diffs) > 0:
        t = statistics.mean(diffs) / (statistics.stdev(diffs) / math.sqrt(len(diffs)))
        t_stat, t_p = round(t, 3), round(t_two_sided_p(t, len(diffs) - 1), 4)
    p = sign_test_p(wins, losses)
    if p < 0.05 and wins > losses:
        verdict = "dynamic_better"
    elif p < 0.05 and losses > wins:
        verdict = "jump_better"
    else:
        verdict = "no_significant_difference"
    return {
        "seeds_dynamic_better": wins,
        "seeds_jump_better": losses,
        "mean_paired_diff_dynamic_minus_jump": round(statistics.mean(diffs), 4) if diffs else None,
        "paired_t": t_stat,
        "paired_t_p": t_p,  # two-sided, df = finite pairs - 1 (context; the verdict is the sign test)
        "sign_test_p": round(p, 4),
        "verdict": verdict,
    }

"""A proportion's 95 % interval: k successes of n independent trials (a passkey or needle cell: n samples).

Wilson (1927) score interval, the default: coverage close to nominal from n = 5 on, averaged over p; Clopper and
Pearson (1934), the exact interval, at least nominal everywhere (conservative). Both give 0 of n a positive upper
end (Wilson at n = 9: [0, 29.9 %]; Clopper-Pearson: [0, 33.6 %]), never [0, 0].
"""
from __future__ import annotations

import math
from typing import NamedTuple

from .distributions import CONFIDENCE, betainc, normal_quantile


class Proportion(NamedTuple):
    """k of n, its rate and its interval [lo, hi] (fractions in [0, 1]); ``rule`` names the interval."""

    k: int
    n: int
    rate: float
    lo: float
    hi: float
    rule: str


def _check(k: int, n: int) -> None:
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"a proportion needs 0 <= k <= n and n >= 1, got {k} of {n}")


def wilson(k: int, n: int, confidence: float = CONFIDENCE) -> Proportion:
    """Wilson's score interval for k of n: (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    (Wilson 1927, JASA 22:209; Agresti & Coull 1998, eq. 2)."""
    _check(k, n)
    z = normal_quantile(confidence)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # at k = 0 (k = n) the bound is 0 (1) exactly: centre = half there, which floating point leaves ~1e-17 apart
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return Proportion(k, n, p, lo, hi, "Wilson")


def beta_quantile(q: float, a: float, b: float) -> float:
    """The q-quantile of Beta(a, b), by bisection on the regularized incomplete beta function to 1e-12."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if betainc(a, b, mid) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> Proportion:
    """The exact interval for k of n: [B((1-c)/2; k, n-k+1), B((1+c)/2; k+1, n-k)], 0 at k = 0 and 1 at k = n
    (Clopper & Pearson 1934, Biometrika 26:404)."""
    _check(k, n)
    alpha = 1 - confidence
    lo = 0.0 if k == 0 else beta_quantile(alpha / 2, k, n - k + 1)
    hi = 1.0 if k == n else beta_quantile(1 - alpha / 2, k + 1, n - k)
    return Proportion(k, n, k / n, lo, hi, "Clopper-Pearson")

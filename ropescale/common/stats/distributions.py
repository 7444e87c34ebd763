"""The distributions the intervals and tests read, numpy-free and scipy-free: the regularized incomplete beta function
(the one special function: Student's t, the binomial and the beta quantiles all reduce to it), Student's t tail and
quantile, the binomial tail and the normal quantile. Checked against scipy.special / scipy.stats in the tests."""
from __future__ import annotations

import math

CONFIDENCE = 0.95  # the level of every interval on the floor
ALPHA = 0.05  # a reading says "resolved" at q < ALPHA (a family's BH q; a lone test's q is its p)


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Press et al., *Numerical
    Recipes* 3rd ed., Sec. 6.4, modified Lentz), using the symmetry I_x(a, b) = 1 - I_{1-x}(b, a) where the
    fraction converges slowly."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    ln_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(ln_front) * beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(ln_front) * beta_continued_fraction(b, a, 1 - x) / b


def beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (Numerical Recipes 3rd ed., eq. 6.4.5, evaluated by modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed exactly."""
    if k <= 0:
        return 1.0
    return min(1.0, sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1)))


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom, t >= 0: I_{df/(df+t^2)}(df/2, 1/2) / 2
    (Abramowitz & Stegun 26.7.1 with 26.5.27)."""
    if t < 0:
        return 1.0 - t_sf(-t, df)
    return 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q: float, df: int) -> float:
    """The q-quantile of Student's t (0 < q < 1), by bisection on :func:`t_sf` to 1e-12."""
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q}")
    if q < 0.5:
        return -t_quantile(1 - q, df)
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1 - q:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_sf(mid, df) > 1 - q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def normal_quantile(confidence: float) -> float:
    """The two-sided normal quantile z_{(1+c)/2}: the z with P(Z > z) = (1 - c) / 2, P(Z > z) = erfc(z / sqrt 2) / 2
    (Abramowitz & Stegun 7.1.2, 26.2.29), by bisection."""
    target = (1 - confidence) / 2
    lo, hi = 0.0, 10.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(mid / math.sqrt(2)) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2

"""The tests behind every reading (the one home of each, beside :mod:`.uncertainty`, whose bootstrap they share):

- :func:`sign_flip` / :func:`paired_sign_flip`: the paired sign-flip permutation test of a mean difference (IE - IB
  per sample id; one row against another per sample id; searched factors against YaRN per window). Under "no
  difference" the two members of a pair are exchangeable, so each pair's difference is as likely to carry either
  sign (Fisher 1935, *The Design of Experiments* Sec. 21; Good 2005, *Permutation, Parametric, and Bootstrap Tests
  of Hypotheses*, Sec. 3.1). Exact (all 2^n sign vectors) up to ``EXACT_MAX_N`` pairs, else ``PERMUTATIONS``
  random sign vectors with p = (1 + hits) / (1 + draws) (Phipson & Smyth 2010), as ``scipy.stats.permutation_test``
  computes it;
- :func:`mse_sign_flip`: the same null for a row's MSE(P-IE vs P-IB) (CNNSum Table 2): the IE/IB labels of every
  sample flipped at random in every cell, the MSE recomputed; its p beside the noise floor (the floor is the
  MSE's *expectation* under that null, not a test), and how often the null MSE reaches the paper's red mark
  (MSE >= 5, Table 2's caption) at the row's n;
- :func:`t_over_seeds`: Student's t interval and two-sided p of a mean over independent seeds (df = seeds - 1), the
  test for a figure whose independent unit is the seed (a fine-tune, a search);
- :func:`sign_consistency`: how many of C cells keep one sign in every one of S seeds, against the count coin-flip
  signs give (each cell with probability 2^(1-S)), with its one-sided binomial p;
- :func:`two_level_bootstrap`: a cell pooled over seeds, its interval from resampling seeds, then samples within
  each drawn seed (Davison & Hinkley 1997, *Bootstrap Methods and their Application*, Sec. 3.8: resample the top
  level with replacement, then the lower level within each drawn unit), so the seed-to-seed spread is in it.

A reading says "resolved (p = ...)" when p < ``ALPHA`` and "not resolved (interval ...)" otherwise
(:meth:`Significance.reading`). Pure functions of numbers and ``{id: score}`` mappings; nothing here reads files or
prints. Deterministic: the same input and seed give the same p on every machine numpy's PCG64 runs on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Mapping, Optional, Sequence

import numpy as np

from .uncertainty import CONFIDENCE, RESAMPLES, SEED, Estimate, _canonical, _finite, _Table, cell, percentile_interval

ALPHA = 0.05
EXACT_MAX_N = 16  # 2^16 = 65,536 sign vectors: exact; more pairs: Monte Carlo
PERMUTATIONS = 20_000  # Monte Carlo sign vectors: p's Monte Carlo sd <= 0.0016 at p = 0.05
RED_MSE = 5.0  # CNNSum Table 2's caption: "Red highlights the large value (>= 5.0) in MSE (P-IE vs P-IB)"
_EPS = np.finfo(float).eps * 100  # scipy.stats.permutation_test's tolerance for theoretically equal values


@dataclass(frozen=True)
class Significance:
    """A test's outcome: the observed ``statistic`` (a mean difference, an MSE, a count), its ``p``, ``n``
    independent units (pairs, seeds, cells), the interval [lo, hi] read when it is not resolved, whether the null
    distribution was enumerated (``exact``) or drawn (``draws``), and ``df`` for a t test."""

    name: str
    statistic: Optional[float]
    p: Optional[float]
    n: int
    lo: Optional[float] = None
    hi: Optional[float] = None
    exact: bool = False
    draws: int = 0
    df: Optional[int] = None
    extra: dict = field(default_factory=dict)

    @property
    def resolved(self) -> bool:
        return self.p is not None and self.p < ALPHA

    def reading(self, nd: int = 1) -> str:
        """``resolved (p = 0.004)`` or ``not resolved (interval [-0.8, +4.1])`` (``not resolved (p = 0.31)``
        without an interval; ``no test`` without a p)."""
        if self.p is None:
            return "no test"
        if self.resolved:
            return f"resolved (p = {p_text(self.p)})"
        if self.lo is None or self.hi is None:
            return f"not resolved (p = {p_text(self.p)})"
        return f"not resolved (interval [{self.lo:+.{nd}f}, {self.hi:+.{nd}f}])"

    def to_dict(self) -> dict:
        return {"test": self.name, "statistic": self.statistic, "p": self.p, "n": self.n, "lo": self.lo,
                "hi": self.hi, "exact": self.exact, "draws": self.draws, "df": self.df, **self.extra}


def p_text(p: Optional[float]) -> str:
    """Two significant digits (``0.031``, ``0.00042``), ``1`` at 1; ``-`` for none."""
    if p is None:
        return "-"
    if p >= 0.9995:
        return "1"
    return f"{p:.2g}" if p < 0.01 else f"{p:.2f}" if p >= 0.1 else f"{p:.3f}"


# ------------------------------------------------------------------------------------------------ sign flips
def _signs(n: int, exact: bool, draws: int, rng: np.random.Generator) -> np.ndarray:
    """(k, n) sign vectors: all 2^n (row r: bit j of r set = pair j flipped) or ``draws`` random ones."""
    if exact:
        bits = (np.arange(2 ** n, dtype=np.int64)[:, None] >> np.arange(n, dtype=np.int64)) & 1
        return 1.0 - 2.0 * bits
    return rng.choice(np.array([-1.0, 1.0]), size=(draws, n))


def sign_flip(diffs: Sequence[float], *, permutations: int = PERMUTATIONS, seed: int = SEED,
              exact: Optional[bool] = None, confidence: float = CONFIDENCE) -> Significance:
    """The two-sided paired sign-flip permutation test of mean(diffs) = 0: p = P(|mean(s * d)| >= |mean(d)|) over
    sign vectors s (exact when n <= ``EXACT_MAX_N`` unless ``exact`` says otherwise). The interval is the
    percentile bootstrap of the mean difference (:func:`.uncertainty.cell`, the pairs resampled)."""
    d = np.array([float(x) for x in diffs])
    n = len(d)
    if n == 0:
        return Significance("sign-flip permutation", None, None, 0)
    exact = n <= EXACT_MAX_N if exact is None else exact
    obs = float(d.mean())
    null = np.abs(_signs(n, exact, permutations, np.random.default_rng(seed)) @ d / n)
    hits = int(np.count_nonzero(null >= abs(obs) - abs(_EPS * obs)))
    p = hits / len(null) if exact else (hits + 1) / (len(null) + 1)
    est = cell(list(d), seed=seed, confidence=confidence)
    return Significance("sign-flip permutation", obs, min(p, 1.0), n, est.lo, est.hi, exact, 0 if exact else len(null))


def paired_sign_flip(a: Mapping[Hashable, float], b: Mapping[Hashable, float], **kw) -> Significance:
    """:func:`sign_flip` of a[id] - b[id] over the ids both have (e.g. IE and IB of one cell, two rows on the same
    eval samples); ids in only one are left out and counted in ``extra['unpaired']``."""
    a, b = _canonical(a), _canonical(b)
    ids = [i for i in a if i in b]
    t = sign_flip([a[i] - b[i] for i in ids], **kw)
    return Significance(t.name, t.statistic, t.p, t.n, t.lo, t.hi, t.exact, t.draws,
                extra={"unpaired": sum(1 for i in a if i not in b) + sum(1 for i in b if i not in a)})


def mse_sign_flip(cells: Mapping[str, tuple[Mapping[Hashable, float], Mapping[Hashable, float]]], *,
                  red: float = RED_MSE, permutations: int = PERMUTATIONS, seed: int = SEED) -> Significance:
    """A row's MSE(P-IE vs P-IB) = mean over its cells of (mean IE - mean IB)^2 tested against "no prompt effect":
    every sample's IE and IB scores swapped with probability 1/2, independently in every cell; p = P(MSE* >= MSE).
    ``extra``: ``p_red`` = P(MSE* >= ``red``), the chance that a row with no prompt effect reaches the paper's red
    mark at this n, and ``null_mean`` (the null's mean, the mean over cells of sum_i d_i^2 / n^2: the sign-flip
    counterpart of the noise floor :func:`.uncertainty.mse_noise_floor`, which centres the d_i and divides by
    n - 1). Every sample must be scored under both prompts (else p is None). Exact when the row has at most
    ``EXACT_MAX_N`` samples in all, else ``permutations`` draws."""
    ds = []
    for ie, ib in cells.values():
        ie, ib = _canonical(ie), _canonical(ib)
        if not ie or set(ie) != set(ib):
            return Significance("MSE sign-flip permutation", None, None, 0)
        ds.append(np.array([ie[i] - ib[i] for i in ie]))
    if not ds:
        return Significance("MSE sign-flip permutation", None, None, 0)
    total = sum(len(d) for d in ds)
    exact = total <= EXACT_MAX_N
    obs = float(np.mean([d.mean() ** 2 for d in ds]))
    rng = np.random.default_rng(seed)
    if exact:
        signs = _signs(total, True, 0, rng)
        cuts = np.cumsum([0] + [len(d) for d in ds])
        null = np.mean([(signs[:, cuts[k]:cuts[k + 1]] @ d / len(d)) ** 2 for k, d in enumerate(ds)], axis=0)
    else:
        null = np.mean([(_signs(len(d), False, permutations, rng) @ d / len(d)) ** 2 for d in ds], axis=0)
    hits = int(np.count_nonzero(null >= obs - abs(_EPS * obs)))
    p = hits / len(null) if exact else (hits + 1) / (len(null) + 1)
    return Significance("MSE sign-flip permutation", obs, min(p, 1.0), min(len(d) for d in ds), exact=exact,
                draws=0 if exact else len(null),
                extra={"cells": len(ds), "p_red": float(np.mean(null >= red)), "red": red,
                       "null_mean": float(null.mean())})


# ------------------------------------------------------------------------------------------------ over seeds
def t_over_seeds(values: Sequence[float], *, confidence: float = CONFIDENCE) -> Significance:
    """Student's one-sample t test of mean = 0 over independent seeds (a per-seed figure or a per-seed
    difference): t = mean / (sd / sqrt(S)), df = S - 1, two-sided p, and the t interval mean +- t_{df} sd / sqrt(S)
    (as ``scipy.stats.ttest_1samp`` and its ``confidence_interval``)."""
    x = [v for v in (_finite(v) for v in values) if v is not None]
    s = len(x)
    if s < 2:
        return Significance("t over seeds", x[0] if x else None, None, s)
    mean = sum(x) / s
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (s - 1))
    df = s - 1
    half = t_quantile((1 + confidence) / 2, df) * sd / math.sqrt(s)
    if sd == 0:
        p = 1.0 if mean == 0 else 0.0
    else:
        p = 2 * t_sf(abs(mean) / (sd / math.sqrt(s)), df)
    return Significance("t over seeds", mean, min(p, 1.0), s, mean - half, mean + half, df=df, extra={"sd": sd})


def sign_consistency(per_seed: Sequence[Mapping[Hashable, float]]) -> Significance:
    """Of the cells every seed has (a finite value in each of the S mappings), how many keep one strict sign in all
    S seeds; with coin-flip signs a cell does with probability 2^(1-S), so the count is Binomial(C, 2^(1-S)) and p
    is P(X >= count) (one-sided: more agreement than chance; ``scipy.stats.binomtest(..., alternative='greater')``).
    Cells are taken as independent: a reading names what they share (one model's row, one seed's eval set)."""
    s = len(per_seed)
    if s < 2:
        return Significance("sign consistency (binomial)", None, None, 0)
    cells = [c for c in per_seed[0] if all(_finite(m.get(c)) is not None for m in per_seed)]
    same = sum(1 for c in cells if all(m[c] > 0 for m in per_seed) or all(m[c] < 0 for m in per_seed))
    p0 = 2.0 ** (1 - s)
    p = binomial_sf(same, len(cells), p0)
    return Significance("sign consistency (binomial)", float(same), p, len(cells),
                extra={"seeds": s, "expected": len(cells) * p0, "p_cell": p0,
                       "cells": [c for c in cells if all(m[c] > 0 for m in per_seed)
                                 or all(m[c] < 0 for m in per_seed)]})


@dataclass(frozen=True)
class PooledEstimate(Estimate):
    """A cell pooled over seeds (:func:`two_level_bootstrap`): ``mean`` the mean of the seeds' cells, ``n`` the
    samples of all seeds, ``seeds`` how many, ``se`` the sd of the two-level bootstrap draws."""

    seeds: int = 0

    def to_dict(self) -> dict:
        return {**super().to_dict(), "seeds": self.seeds}


def two_level_bootstrap(seeds: Mapping[Hashable, Sequence[Mapping[Hashable, float]]], *,
                        weights: Optional[Sequence[float]] = None, resamples: int = RESAMPLES, seed: int = SEED,
                        confidence: float = CONFIDENCE) -> PooledEstimate:
    """A cell pooled over seeds with its two-level percentile bootstrap interval. ``seeds``: {seed: [group {id:
    score}, ...]}, the same groups in every seed (e.g. [Prompt-IE, Prompt-IB], or [A IE, A IB, B IE, B IB] with
    ``weights`` [.5, .5, -.5, -.5] for a paired difference of two rows); a seed's cell is ``sum_g w_g mean_g``
    (default w_g = 1 / groups: :func:`.uncertainty.cell_of_prompts`). The statistic is the mean of the seeds'
    cells. Each resample draws S seeds with replacement, then resamples each drawn seed's sample ids (a sample's
    groups together, :class:`.uncertainty._Table`), independently for every draw of a seed."""
    tabs = [_Table([_canonical(g) for g in groups]) for groups in seeds.values() if groups]
    if not tabs:
        return PooledEstimate(None, 0, confidence=confidence)
    g = tabs[0].values.shape[1]
    if any(t.values.shape[1] != g for t in tabs):
        raise ValueError("every seed needs the same groups")
    w = np.full(g, 1.0 / g) if weights is None else np.asarray(weights, dtype=float)
    per_seed = np.array([t.means() @ w for t in tabs])
    n = int(sum(len(t.ids) for t in tabs))
    s = len(tabs)
    if s < 2 or min(int(t.n.min()) for t in tabs) < 2:
        return PooledEstimate(float(per_seed.mean()), n, confidence=confidence, seeds=s)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, s, size=(resamples, s))
    draws = np.empty((resamples, s))
    for k, t in enumerate(tabs):
        mask = pick == k
        if mask.any():
            draws[mask] = t.bootstrap(int(mask.sum()), rng) @ w
    stat = draws.mean(axis=1)
    lo, hi = percentile_interval(stat, confidence)
    return PooledEstimate(float(per_seed.mean()), n, float(stat.std(ddof=1)), lo, hi, confidence, seeds=s)


# ------------------------------------------------------------------------------------------------ distributions
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
        return math.exp(ln_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln_front) * _betacf(b, a, 1 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
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

"""The tests behind every reading, each naming its unit and its smallest attainable p:

- :func:`sign_flip` / :func:`paired_sign_flip`: the paired sign-flip permutation test of a mean difference (IE - IB
  per sample id; one row against another per sample id; searched factors against YaRN per window). Under "no
  difference" the two members of a pair are exchangeable, so each pair's difference is as likely to carry either
  sign (Fisher 1935, *The Design of Experiments* Sec. 21; Good 2005, *Permutation, Parametric, and Bootstrap Tests
  of Hypotheses*, Sec. 3.1). Exact (all 2^n sign vectors) up to ``EXACT_MAX_N`` pairs, else ``PERMUTATIONS``
  random sign vectors with p = (1 + hits) / (1 + draws) (Phipson & Smyth 2010), as ``scipy.stats.permutation_test``
  computes it. Its smallest p over n units is 2 / 2^m, m the units whose difference is not zero (two-sided: the
  observed signs and their mirror; a zero difference has no sign to flip), 0.25 at n = 3 windows: the unit decides
  it, so the unit is named;
- :func:`mse_sign_flip`: the same null for a row's MSE(P-IE vs P-IB) (CNNSum Table 2): the IE/IB labels of every
  sample flipped at random in every cell, the MSE recomputed; its p beside the noise floor
  (:func:`.mse.mse_noise_floor`, the MSE's expectation under that null, not a test), and how often the null MSE
  reaches the paper's red mark (MSE >= 5, Table 2's caption) at the row's n;
- :func:`t_over_seeds`: Student's t interval and two-sided p of a mean over independent seeds (df = seeds - 1), the
  test for a figure whose independent unit is the seed (a fine-tune, a search); no floor on p (continuous); seeds
  that agree exactly on a nonzero value are no test (p None: no spread measured, not p = 0);
- :func:`t_over_windows`: the block-aware test of buckets within windows (a loss-by-position curve's buckets, each
  a - b on the same window): the window is the block, its buckets' mean difference the unit's value, t over windows.

A reading says "resolved" at q < ``ALPHA``, q the test's Benjamini-Hochberg q in its declared family
(:func:`.multiplicity.family`; a lone test's q is its p), and a reading of no effect states the interval and the
effects it excludes (:meth:`Significance.reading`). Pure functions of numbers and ``{id: score}`` mappings; nothing
here reads files or prints. Deterministic: the same input and seed give the same p wherever numpy's PCG64 runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Hashable, Mapping, Optional, Sequence

import numpy as np

from .distributions import ALPHA, CONFIDENCE, t_quantile, t_sf
from .means import cell
from .resampling import SEED, canonical, finite

EXACT_MAX_N = 16  # 2^16 = 65,536 sign vectors: exact; more pairs: Monte Carlo
PERMUTATIONS = 20_000  # Monte Carlo sign vectors: p's Monte Carlo sd <= 0.0016 at p = 0.05
RED_MSE = 5.0  # CNNSum Table 2's caption: "Red highlights the large value (>= 5.0) in MSE (P-IE vs P-IB)"
EPS = np.finfo(float).eps * 100  # scipy.stats.permutation_test's tolerance for theoretically equal values


@dataclass(frozen=True)
class Significance:
    """A test's outcome: the observed ``statistic`` (a mean difference, an MSE, a count), its ``p``, ``n``
    independent units of kind ``unit`` (sample, window, seed, cell), ``min_p`` the smallest p the test can give at
    this n, the interval [lo, hi] read when it is not resolved, whether the null distribution was enumerated
    (``exact``) or drawn (``draws``), ``df`` for a t test, and ``q`` its BH q in a declared family of ``family``
    tests (:func:`.multiplicity.family`; None: a lone test, read at q = p)."""

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
    unit: str = "sample"
    min_p: Optional[float] = None
    q: Optional[float] = None
    family: int = 1

    @property
    def q_read(self) -> Optional[float]:
        """The q a reading uses: the family's BH q, or p for a lone test."""
        return self.p if self.q is None else self.q

    @property
    def resolved(self) -> bool:
        return self.q_read is not None and self.q_read < ALPHA

    def with_q(self, q: Optional[float], family: int) -> "Significance":
        return replace(self, q=q, family=family)

    def reading(self, nd: int = 1) -> str:
        """``resolved (p = 0.004, q = 0.012)`` or ``not resolved (interval [-0.8, +4.1], excludes effects below
        -0.8 and above +4.1; p = 0.31, q = 0.6)`` (without an interval: its p and q; ``no test`` without a p,
        ``no test (no spread measured)`` where the units agree exactly, :func:`t_over_seeds`)."""
        if self.p is None:
            return "no test (no spread measured)" if self.extra.get("sd") == 0 else "no test"
        pq = f"p = {p_text(self.p)}" + ("" if self.q is None else f", q = {p_text(self.q)}")
        if self.resolved:
            return f"resolved ({pq})"
        if self.lo is None or self.hi is None:
            return f"not resolved ({pq})"
        interval = f"interval [{self.lo:+.{nd}f}, {self.hi:+.{nd}f}], {excluded_text(self.lo, self.hi, nd)}"
        return f"not resolved ({interval}; {pq})"

    def to_dict(self) -> dict:
        return {"test": self.name, "statistic": self.statistic, "p": self.p, "n": self.n, "unit": self.unit,
                "min_p": self.min_p, "q": self.q, "family": self.family, "lo": self.lo, "hi": self.hi,
                "exact": self.exact, "draws": self.draws, "df": self.df, **self.extra}


def excluded_text(lo: float, hi: float, nd: int = 1) -> str:
    """What a 95 % interval [lo, hi] rules out: ``excludes effects below -10.9 and above +1.0`` (a 10-point effect
    inside it is not excluded: absence of a resolved effect is not evidence of absence beyond the interval)."""
    return f"excludes effects below {lo:+.{nd}f} and above {hi:+.{nd}f}"


def p_text(p: Optional[float]) -> str:
    """Two significant digits (``0.031``, ``0.00042``), ``1`` at 1; ``-`` for none."""
    if p is None:
        return "-"
    if p >= 0.9995:
        return "1"
    return f"{p:.2g}" if p < 0.01 else f"{p:.2f}" if p >= 0.1 else f"{p:.3f}"


# ------------------------------------------------------------------------------------------------ sign flips
def signs(n: int, exact: bool, draws: int, rng: np.random.Generator) -> np.ndarray:
    """(k, n) sign vectors: all 2^n (row r: bit j of r set = pair j flipped) or ``draws`` random ones."""
    if exact:
        bits = (np.arange(2 ** n, dtype=np.int64)[:, None] >> np.arange(n, dtype=np.int64)) & 1
        return 1.0 - 2.0 * bits
    return rng.choice(np.array([-1.0, 1.0]), size=(draws, n))


def sign_flip_min_p(nonzero: int, exact: bool, draws: int = 0) -> float:
    """The smallest p of a two-sided sign-flip test whose units have ``nonzero`` differences that are not zero:
    2 / 2^nonzero exact (the observed signs and their mirror tie, and flipping a zero changes nothing: 1 when every
    difference is zero); by Monte Carlo 1 / (draws + 1) (Phipson & Smyth 2010), or that exact floor where larger
    (the p the draws estimate cannot go below it)."""
    floor = min(1.0, 2.0 / 2 ** nonzero) if nonzero else 1.0
    return floor if exact else max(floor, 1.0 / (draws + 1))


def sign_flip(diffs: Sequence[float], *, permutations: int = PERMUTATIONS, seed: int = SEED,
              exact: Optional[bool] = None, confidence: float = CONFIDENCE, unit: str = "sample") -> Significance:
    """The two-sided paired sign-flip permutation test of mean(diffs) = 0 over n ``unit`` s: p = P(|mean(s * d)| >=
    |mean(d)|) over sign vectors s (exact when n <= ``EXACT_MAX_N`` unless ``exact`` says otherwise). The interval is
    the mean difference's (:func:`.means.cell`: the t interval); ``min_p`` counts the nonzero differences
    (:func:`sign_flip_min_p`)."""
    d = np.array([float(x) for x in diffs])
    n = len(d)
    if n == 0:
        return Significance("sign-flip permutation", None, None, 0, unit=unit)
    exact = n <= EXACT_MAX_N if exact is None else exact
    obs = float(d.mean())
    null = np.abs(signs(n, exact, permutations, np.random.default_rng(seed)) @ d / n)
    hits = int(np.count_nonzero(null >= abs(obs) - abs(EPS * obs)))
    p = hits / len(null) if exact else (hits + 1) / (len(null) + 1)
    est = cell(list(d), seed=seed, confidence=confidence)
    draws = 0 if exact else len(null)
    return Significance("sign-flip permutation", obs, min(p, 1.0), n, est.lo, est.hi, exact, draws, unit=unit,
                        min_p=sign_flip_min_p(int(np.count_nonzero(d)), exact, draws))


def paired_sign_flip(a: Mapping[Hashable, float], b: Mapping[Hashable, float], **kw) -> Significance:
    """:func:`sign_flip` of a[id] - b[id] over the ids both have (e.g. IE and IB of one cell, two rows on the same
    eval samples); ids in only one are left out and counted in ``extra['unpaired']``."""
    a, b = canonical(a), canonical(b)
    ids = [i for i in a if i in b]
    t = sign_flip([a[i] - b[i] for i in ids], **kw)
    return replace(t, extra={"unpaired": sum(1 for i in a if i not in b) + sum(1 for i in b if i not in a)})


def mse_sign_flip(cells: Mapping[str, tuple[Mapping[Hashable, float], Mapping[Hashable, float]]], *,
                  red: float = RED_MSE, permutations: int = PERMUTATIONS, seed: int = SEED) -> Significance:
    """A row's MSE(P-IE vs P-IB) = mean over its cells of (mean IE - mean IB)^2 tested against "no prompt effect":
    every sample's IE and IB scores swapped with probability 1/2, independently in every cell; p = P(MSE* >= MSE).
    ``extra``: ``p_red`` = P(MSE* >= ``red``), the chance that a row with no prompt effect reaches the paper's red
    mark at this n, and ``null_mean`` (the null's mean, the mean over cells of sum_i d_i^2 / n^2: the sign-flip
    counterpart of the noise floor :func:`.mse.mse_noise_floor`, which centres the d_i and divides by n - 1). Every
    sample must be scored under both prompts (else p is None). Exact when the row has at most ``EXACT_MAX_N`` samples
    in all, else ``permutations`` draws; the smallest exact p is 2^C / 2^N over the N nonzero differences of the C
    cells that have one (a cell's mirror leaves its square, a zero's flip changes nothing; by Monte Carlo 1 /
    (draws + 1) or that floor where larger)."""
    name = "MSE sign-flip permutation"
    ds = []
    for ie, ib in cells.values():
        ie, ib = canonical(ie), canonical(ib)
        if not ie or set(ie) != set(ib):
            return Significance(name, None, None, 0)
        ds.append(np.array([ie[i] - ib[i] for i in ie]))
    if not ds:
        return Significance(name, None, None, 0)
    total = sum(len(d) for d in ds)
    exact = total <= EXACT_MAX_N
    obs = float(np.mean([d.mean() ** 2 for d in ds]))
    rng = np.random.default_rng(seed)
    if exact:
        sv = signs(total, True, 0, rng)
        cuts = np.cumsum([0] + [len(d) for d in ds])
        null = np.mean([(sv[:, cuts[k]:cuts[k + 1]] @ d / len(d)) ** 2 for k, d in enumerate(ds)], axis=0)
    else:
        null = np.mean([(signs(len(d), False, permutations, rng) @ d / len(d)) ** 2 for d in ds], axis=0)
    hits = int(np.count_nonzero(null >= obs - abs(EPS * obs)))
    p = hits / len(null) if exact else (hits + 1) / (len(null) + 1)
    return Significance(name, obs, min(p, 1.0), min(len(d) for d in ds), exact=exact,
                        draws=0 if exact else len(null),
                        extra={"cells": len(ds), "p_red": float(np.mean(null >= red)), "red": red,
                               "null_mean": float(null.mean())},
                        min_p=mse_min_p(ds, exact, 0 if exact else len(null)))


def mse_min_p(ds: Sequence[np.ndarray], exact: bool, draws: int = 0) -> float:
    """The smallest p of :func:`mse_sign_flip` over cells of differences ``ds``: 2^C / 2^N, N the nonzero
    differences and C the cells holding one (each such cell's mirror keeps its square; a zero's flip changes
    nothing), attained when every cell's nonzero differences share one sign; by Monte Carlo 1 / (draws + 1) or that
    floor where larger."""
    nonzero = [int(np.count_nonzero(d)) for d in ds]
    floor = 2.0 ** (sum(1 for k in nonzero if k) - sum(nonzero))
    return floor if exact else max(floor, 1.0 / (draws + 1))


# ------------------------------------------------------------------------------------------------ over seeds
def t_over_seeds(values: Sequence[float], *, confidence: float = CONFIDENCE, unit: str = "seed") -> Significance:
    """Student's one-sample t test of mean = 0 over independent seeds (a per-seed figure or a per-seed
    difference): t = mean / (sd / sqrt(S)), df = S - 1, two-sided p, and the t interval mean +- t_{df} sd / sqrt(S)
    (as ``scipy.stats.ttest_1samp`` and its ``confidence_interval``); ``extra``: sd and the seeds' range. Seeds with
    no spread (sd = 0) give no t: p = 1 when they all read 0 (no difference at all), else p None and no interval
    (no spread measured: two seeds with one nonzero difference are not a resolved effect; its reading says so)."""
    x = [v for v in (finite(v) for v in values) if v is not None]
    s = len(x)
    if s < 2:
        return Significance("t over seeds", x[0] if x else None, None, s, unit=unit)
    mean = sum(x) / s
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (s - 1))
    df = s - 1
    extra = {"sd": sd, "range": [min(x), max(x)]}
    if sd == 0:
        return Significance("t over seeds", mean, 1.0 if mean == 0 else None, s, df=df, extra=extra, unit=unit,
                            min_p=0.0)
    half = t_quantile((1 + confidence) / 2, df) * sd / math.sqrt(s)
    p = 2 * t_sf(abs(mean) / (sd / math.sqrt(s)), df)
    return Significance("t over seeds", mean, min(p, 1.0), s, mean - half, mean + half, df=df, extra=extra, unit=unit,
                        min_p=0.0)


def t_over_windows(buckets: Sequence[Sequence[float]], *, confidence: float = CONFIDENCE) -> Significance:
    """The block-aware paired test of a - b over buckets within windows: each window's buckets (adjacent position
    ranges of one text, so correlated) averaged into the window's mean difference, then Student's one-sample t
    test over the windows (:func:`t_over_seeds` with unit "window": df = windows - 1, as ``scipy.stats.ttest_1samp``
    of the windows' means). The statistic is the mean of the windows' means (each window one unit whatever its
    bucket count). ``extra``: ``buckets`` (how many), ``per_window`` (the windows' means), ``same_sign`` (buckets
    whose difference has the statistic's sign: a description, not a test).

    Why the whole window is the block, not sign flips of blocks of adjacent buckets: a block sign flip is exact only
    when the blocks are independent, and buckets of one text are not; simulated (3 windows x 7 buckets, AR(1)
    buckets, no effect, 2,000 draws), flipping single buckets rejects at 5 % in 12 % of draws at lag-1 correlation
    0.3 and 26 % at 0.6, blocks of 3 buckets in 7 % and 11 %, blocks of 4 in 4 % and 6 % (12 % at 0.9), while
    this t test holds 5 % at every correlation (tests/test_stats_tests.py): the buckets' correlation is unknown and
    7 buckets a window cannot estimate it. The buckets still count: they make each window's mean less noisy.
    Smallest attainable p: 0 (continuous; no floor from the unit count, unlike the sign flip over 3 windows' 0.25),
    but at 3 windows p < 0.05 needs |t| > 4.30 (t_{0.975, 2}); the test assumes the windows' means near normal."""
    per_window = [[v for v in (finite(x) for x in w) if v is not None] for w in buckets]
    per_window = [w for w in per_window if w]
    means = [sum(w) / len(w) for w in per_window]
    t = t_over_seeds(means, confidence=confidence, unit="window")
    sign = 0.0 if t.statistic is None else math.copysign(1.0, t.statistic)
    extra = {**t.extra, "buckets": sum(len(w) for w in per_window), "per_window": means,
             "same_sign": sum(1 for w in per_window for v in w if v * sign > 0)}
    return replace(t, name="t over windows (buckets within window)", extra=extra)


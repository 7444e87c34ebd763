"""A mean's 95 % interval, by the number and kind of its units (DESIGN.md "the statistics floor"): Student's t
interval, mean +- t_{n-1} se, at every n (Student 1908; as ``scipy.stats.ttest_1samp(...).confidence_interval``):

- a cell of per-sample scores (:func:`cell`, :func:`cell_of_prompts`) and a paired difference (:func:`ie_minus_ib`):
  se the analytic standard error of the combination of means (:func:`.resampling.var_of_combination`: where every
  id is scored in every group it is exactly sd / sqrt(n) of the per-id combination, so the interval is the
  one-sample t interval of the per-id means or differences), df = the smallest group's n - 1 (ids in one group
  only: fewer df than Welch's, so no narrower);
- a mean over few units, windows or seeds (:func:`t_interval`): the same t interval with the units' range beside it;
- a cell pooled over seeds (:func:`over_seeds`): the t interval over the seeds' cells (the seed is the unit), the
  two-level bootstrap (:func:`two_level_bootstrap`) kept as a secondary figure only: over 3 seeds it covers 78-90 %.

Why the t interval at every n, not a bootstrap (simulated in ``tests/test_stats_coverage.py``, 95 % intervals on
normal data): the percentile bootstrap (Efron & Tibshirani 1993, Ch. 13) covers 75 % at n = 3, 90 % at 9 and 92 %
at 16 (its spread is the plug-in sd, ddof 0, with normal rather than t quantiles); Hesterberg's expanded percentile
interval (2015, *The American Statistician* 69:371-386: the percentile interval at the tail level
Phi(-sqrt(n/(n-1)) t_{n-1, 0.975}) instead of 2.5 %) reaches 94 % at 9 and 16 but not at 3 (a resample's mean
cannot leave the 3 samples' range: 75 %), and on skewed data gains at most 1-2 points over t (3,000 draws:
exponential at n = 9, 89.7 against 89.2 %; lognormal at 16, 86.6 against 85.8 %), both under-covering there.
The t interval covers 95 % at 3, 9 and 16 alike, is one rule with no switch at some n, draws nothing (the same cell
with or without a seed) and is scipy's (Hesterberg's abstract: the percentile interval is "less accurate than using
t-intervals for small samples"). On few skewed units it under-covers (exponential 88 % at n = 3, lognormal 84 %,
printed by the test): the pages say which cells rest on few skewed units. ``resamples`` and ``seed`` stay in the
cells' signatures for their callers; the t rule does not use them.

A score with a known range (``bounds=(lo, hi)``: a share in 0..100, an accuracy in 0..1) gets one more rule, on the
same interval: the t interval clipped to the range (rule "t (clipped)" where a bound cuts it; clipping a confidence
interval to the parameter space keeps its coverage, since the true mean lies in the range: Mandelkern 2002,
*Statistical Science* 17:149-172), and where the units have no spread (sd 0: a t interval of no width, e.g. sixteen
zeros) the interval of the share read as a proportion, Wilson's (Wilson 1927; :func:`.proportions.wilson`) for
x = sum of (unit - lo) / (hi - lo) successes of n units (rule "Wilson (no spread)"): 16 zeros of a 0..100 share read
0 [0, 19.4], never [0, 0]. A one-sided range (a loss: ``(0, inf)``) clips only. Coverage on binomial and Beta
shares in ``tests/test_stats_bounded.py``. Without ``bounds`` (the default) every interval is the plain t interval.

Every estimate names its ``rule`` and its ``unit``. Pure functions of numbers and ``{id: score}`` mappings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Mapping, Optional, Sequence

import numpy as np

from .distributions import CONFIDENCE, t_quantile
from .proportions import wilson
from .resampling import RESAMPLES, SEED, Table, as_mapping, canonical, finite, percentile_interval, var_of_combination

T_RULE = "t"
CLIPPED_RULE = "t (clipped)"
NO_SPREAD_RULE = "Wilson (no spread)"
Bounds = Optional[tuple]


@dataclass(frozen=True)
class Estimate:
    """A cell: the mean over its units (for several prompts, the mean of each prompt's mean), n (the independent
    units: distinct sample ids, a sample scored under two prompts counted once), the standard error and the interval
    [lo, hi] (None below 2 units), the ``rule`` that made it, the ``unit`` counted in n and, for a mean over few
    units, their range ``spread`` (min, max)."""

    mean: Optional[float]
    n: int
    se: Optional[float] = None
    lo: Optional[float] = None
    hi: Optional[float] = None
    confidence: float = CONFIDENCE
    rule: str = T_RULE
    unit: str = "sample"
    spread: Optional[tuple] = None

    def excludes(self, value: float = 0.0) -> bool:
        """Whether the interval lies wholly on one side of ``value`` (False without an interval)."""
        return self.lo is not None and self.hi is not None and (self.lo > value or self.hi < value)

    def to_dict(self) -> dict:
        return {"mean": self.mean, "n": self.n, "se": self.se, "lo": self.lo, "hi": self.hi, "rule": self.rule,
                "unit": self.unit, "range": None if self.spread is None else list(self.spread)}

    def text(self, nd: int = 1) -> str:
        """``45.0 [38.2, 51.9]`` (``-`` for no mean; the mean alone without an interval); a mean over few units
        with their range: ``45.0 [38.2, 51.9] (40.1-49.0)``."""
        if self.mean is None:
            return "-"
        if self.lo is None or self.hi is None:
            return f"{self.mean:.{nd}f}"
        rng = "" if self.spread is None else f" ({self.spread[0]:.{nd}f}-{self.spread[1]:.{nd}f})"
        return f"{self.mean:.{nd}f} [{self.lo:.{nd}f}, {self.hi:.{nd}f}]{rng}"


@dataclass(frozen=True)
class Difference(Estimate):
    """IE - IB of one cell: the difference of the two prompts' means, its standard error and paired interval;
    ``n_pairs`` ids scored under both prompts, the ids scored under only one (reported, never dropped: they count in
    their prompt's mean and are resampled on their own)."""

    n_pairs: int = 0
    unpaired_ie: tuple = ()
    unpaired_ib: tuple = ()

    @property
    def paired(self) -> bool:
        """Every sample has its partner: the interval is the plain paired one of the per-id differences."""
        return self.n_pairs > 0 and not self.unpaired_ie and not self.unpaired_ib

    def to_dict(self) -> dict:
        return {**super().to_dict(), "n_pairs": self.n_pairs, "unpaired_ie": list(self.unpaired_ie),
                "unpaired_ib": list(self.unpaired_ib)}


@dataclass(frozen=True)
class PooledEstimate(Estimate):
    """A cell pooled over seeds (:func:`over_seeds`): ``mean`` the mean of the seeds' cells, ``n`` the samples of
    all seeds, ``seeds`` how many; [lo, hi] the t interval over the seeds (``rule`` "t", ``unit`` "seed"), ``spread``
    the seeds' range; ``boot_lo`` / ``boot_hi`` the two-level bootstrap interval (secondary)."""

    seeds: int = 0
    boot_lo: Optional[float] = None
    boot_hi: Optional[float] = None

    def to_dict(self) -> dict:
        return {**super().to_dict(), "seeds": self.seeds, "two_level": None if self.boot_lo is None
                else [self.boot_lo, self.boot_hi]}


# ------------------------------------------------------------------------------------------------ a score's range
def check_bounds(bounds, values: Sequence[float] = ()) -> tuple[float, float]:
    """``bounds`` as (lo, hi) floats with lo < hi (one may be infinite: a loss's (0, inf)); every value inside them
    (ValueError otherwise)."""
    try:
        lo, hi = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be (lo, hi), got {bounds!r}") from None
    if not lo < hi:  # a nan fails too
        raise ValueError(f"bounds must be numbers with lo < hi, got {bounds!r}")
    width = hi - lo
    tol = 1e-9 * (width if math.isfinite(width) else max(1.0, *(abs(b) for b in (lo, hi) if math.isfinite(b))))
    bad = [v for v in values if not lo - tol <= v <= hi + tol]
    if bad:
        raise ValueError(f"a score of {bad[0]!r} lies outside its range [{lo:g}, {hi:g}]")
    return lo, hi


def bounded(mean: float, n: int, se: float, lo: float, hi: float, bounds,
            confidence: float = CONFIDENCE) -> tuple[float, float, str]:
    """(lo, hi, rule) of a mean of n units whose score lies in ``bounds``: the t interval [lo, hi] clipped to the
    range (Mandelkern 2002: the clipped interval keeps its coverage), or with no spread (se 0) Wilson's interval
    (Wilson 1927) for x = n (mean - a) / (b - a) successes of n, mapped back to [a, b]; a one-sided range clips
    only (no share to read: a cell with no spread keeps its t interval)."""
    a, b = check_bounds(bounds)
    width = b - a
    if math.isfinite(width) and se <= 1e-12 * width:  # no spread: the t interval has no width
        x = min(float(n), max(0.0, n * (mean - a) / width))
        w = wilson(x, n, confidence)
        lo = a if x == 0 else a + width * w.lo  # 0 of n starts at the bound exactly (not at a rounding error)
        hi = b if x == n else a + width * w.hi
        return lo, hi, NO_SPREAD_RULE
    clo, chi = max(a, lo), min(b, hi)
    return clo, chi, (CLIPPED_RULE if (clo, chi) != (lo, hi) else T_RULE)


# ------------------------------------------------------------------------------------------------ few units
def t_half_width(sd: float, n: int, confidence: float = CONFIDENCE) -> float:
    """Student's t half-width t_{(1+c)/2, n-1} sd / sqrt(n) (Student 1908; as scipy.stats.t.interval)."""
    return t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)


def t_interval(values: Sequence[float], *, unit: str = "window", confidence: float = CONFIDENCE,
               bounds: Bounds = None) -> Estimate:
    """A mean over few independent units (windows, seeds): mean +- t_{n-1} sd / sqrt(n) (Student 1908; as
    ``scipy.stats.ttest_1samp(...).confidence_interval``), with the units' range beside it; no interval below 2.
    ``bounds``: the score's range (:func:`bounded`)."""
    x = [v for v in (finite(v) for v in values) if v is not None]
    if bounds is not None:
        check_bounds(bounds, x)
    if not x:
        return Estimate(None, 0, rule=T_RULE, unit=unit, confidence=confidence)
    mean = sum(x) / len(x)
    if len(x) < 2:
        return Estimate(mean, 1, rule=T_RULE, unit=unit, confidence=confidence, spread=(x[0], x[0]))
    sd = float(np.std(x, ddof=1))
    se = sd / math.sqrt(len(x))
    half = t_half_width(sd, len(x), confidence)
    lo, hi, rule = mean - half, mean + half, T_RULE
    if bounds is not None:
        lo, hi, rule = bounded(mean, len(x), se, lo, hi, bounds, confidence)
    return Estimate(mean, len(x), se, lo, hi, confidence, rule, unit, (min(x), max(x)))


# ------------------------------------------------------------------------------------------------ per-sample cells
def cell(values: Sequence[float] | Mapping[Hashable, float], *, resamples: int = RESAMPLES, seed: int = SEED,
         confidence: float = CONFIDENCE, bounds: Bounds = None) -> Estimate:
    """A cell's mean, n, standard error and interval: mean +- t_{n-1} sd / sqrt(n) (Student 1908; as
    ``scipy.stats.ttest_1samp(values).confidence_interval``); no interval below 2 samples. ``bounds``: the score's
    range (:func:`bounded`). ``resamples`` and ``seed`` are not used (the module's docstring)."""
    return cell_of_prompts([values], resamples=resamples, seed=seed, confidence=confidence, bounds=bounds)


def _interval(tab: Table, groups: list, w: np.ndarray, confidence: float):
    """(se, lo, hi, rule) of sum_g w_g mean_g: mean +- t_{df} se (Student 1908), se from
    :func:`.resampling.var_of_combination`, df = the smallest group's n - 1."""
    se = math.sqrt(max(var_of_combination(groups, w), 0.0))
    mean = float(tab.means() @ w)
    half = t_quantile((1 + confidence) / 2, int(tab.n.min()) - 1) * se
    return se, mean - half, mean + half, T_RULE


def cell_of_prompts(groups: Sequence[Sequence[float] | Mapping[Hashable, float]], *, resamples: int = RESAMPLES,
                    seed: int = SEED, confidence: float = CONFIDENCE, bounds: Bounds = None) -> Estimate:
    """The extrapolation view's cell (``Report.extrapolation``): the mean over the prompts present of each
    prompt's mean over its samples, with n = the independent samples (distinct ids: 16 eval samples under two
    prompts are n = 16), the standard error and the t interval (a sample scored under both prompts counts once:
    for a fully paired table, the one-sample t interval of the per-id means). A group given as a plain sequence has
    ids of its own (it pairs with nothing). ``bounds``: the score's range (:func:`bounded`, n the independent
    samples). ``resamples`` and ``seed`` are not used."""
    groups = [g for g in (as_mapping(g, k) for k, g in enumerate(groups)) if g]
    if not groups:
        return Estimate(None, 0, confidence=confidence)
    if bounds is not None:
        check_bounds(bounds, [v for g in groups for v in g.values()])
    tab = Table(groups)
    w = np.full(len(groups), 1.0 / len(groups))
    mean = float(tab.means() @ w)
    n = len(tab.ids)
    if tab.n.min() < 2:
        return Estimate(mean, n, confidence=confidence)
    se, lo, hi, rule = _interval(tab, groups, w, confidence)
    if bounds is not None:
        lo, hi, rule = bounded(mean, n, se, lo, hi, bounds, confidence)
    return Estimate(mean, n, se, lo, hi, confidence, rule)


def ie_minus_ib(ie: Mapping[Hashable, float], ib: Mapping[Hashable, float], *, resamples: int = RESAMPLES,
                seed: int = SEED, confidence: float = CONFIDENCE) -> Difference:
    """IE - IB of one cell (CNNSum Sec. 4.3 compares the two prompts per subset): mean(IE) - mean(IB) over each
    prompt's samples, n the independent samples (distinct ids), the standard error of that difference and its
    paired t interval (fully paired: the one-sample t interval of the per-id differences; ids under one prompt only
    count in their prompt's mean and are listed). ``resamples`` and ``seed`` are not used."""
    ie, ib = canonical(ie), canonical(ib)
    unpaired_ie = tuple(i for i in ie if i not in ib)
    unpaired_ib = tuple(i for i in ib if i not in ie)
    n_pairs = sum(1 for i in ie if i in ib)
    if not ie or not ib:
        return Difference(None, len({*ie, *ib}), confidence=confidence, n_pairs=0, unpaired_ie=unpaired_ie,
                          unpaired_ib=unpaired_ib)
    tab = Table([ie, ib])
    w = np.array([1.0, -1.0])
    mean = float(tab.means() @ w)
    n = len(tab.ids)
    se = lo = hi = None
    rule = T_RULE
    if tab.n.min() >= 2:
        se, lo, hi, rule = _interval(tab, [ie, ib], w, confidence)
    return Difference(mean, n, se, lo, hi, confidence, rule, n_pairs=n_pairs, unpaired_ie=unpaired_ie,
                      unpaired_ib=unpaired_ib)


# ------------------------------------------------------------------------------------------------ over seeds
def over_seeds(seeds: Mapping[Hashable, Sequence[Mapping[Hashable, float]]], *,
               weights: Optional[Sequence[float]] = None, resamples: int = RESAMPLES, seed: int = SEED,
               confidence: float = CONFIDENCE, bounds: Bounds = None) -> PooledEstimate:
    """A cell pooled over seeds: the mean of the seeds' cells with the t interval over them (the seed is the unit:
    mean +- t_{S-1} sd / sqrt(S), Student 1908) and their range; the two-level bootstrap interval
    (:func:`two_level_bootstrap`) beside it as ``boot_lo`` / ``boot_hi``. ``seeds`` and ``weights`` as there;
    ``bounds``: the score's range (:func:`bounded` over the S seeds' cells)."""
    tabs = [Table([canonical(g) for g in groups]) for groups in seeds.values() if groups]
    if not tabs:
        return PooledEstimate(None, 0, confidence=confidence, rule=T_RULE, unit="seed")
    w = _weights(tabs, weights)
    per_seed = [float(t.means() @ w) for t in tabs]
    t = t_interval(per_seed, unit="seed", confidence=confidence, bounds=bounds)
    n = int(sum(len(tb.ids) for tb in tabs))
    boot = two_level_bootstrap(seeds, weights=weights, resamples=resamples, seed=seed, confidence=confidence)
    return PooledEstimate(t.mean, n, t.se, t.lo, t.hi, confidence, t.rule, "seed", t.spread, seeds=len(tabs),
                          boot_lo=boot.lo, boot_hi=boot.hi)


def _weights(tabs: list, weights: Optional[Sequence[float]]) -> np.ndarray:
    g = tabs[0].values.shape[1]
    if any(t.values.shape[1] != g for t in tabs):
        raise ValueError("every seed needs the same groups")
    return np.full(g, 1.0 / g) if weights is None else np.asarray(weights, dtype=float)


def two_level_bootstrap(seeds: Mapping[Hashable, Sequence[Mapping[Hashable, float]]], *,
                        weights: Optional[Sequence[float]] = None, resamples: int = RESAMPLES, seed: int = SEED,
                        confidence: float = CONFIDENCE) -> PooledEstimate:
    """A cell pooled over seeds with its two-level percentile bootstrap interval (Davison & Hinkley 1997, *Bootstrap
    Methods and their Application*, Sec. 3.8: resample the top level with replacement, then the lower level within
    each drawn unit). A secondary figure only (:func:`over_seeds` is the rule): over 3 seeds it covers 78-90 %.
    ``seeds``: {seed: [group {id: score}, ...]}, the same groups in every seed (e.g. [Prompt-IE, Prompt-IB], or
    [A IE, A IB, B IE, B IB] with ``weights`` [.5, .5, -.5, -.5] for a paired difference of two rows); a seed's cell
    is ``sum_g w_g mean_g`` (default w_g = 1 / groups: :func:`cell_of_prompts`). Each resample draws S seeds with
    replacement, then resamples each drawn seed's sample ids, independently for every draw of a seed."""
    tabs = [Table([canonical(g) for g in groups]) for groups in seeds.values() if groups]
    if not tabs:
        return PooledEstimate(None, 0, confidence=confidence, unit="seed")
    w = _weights(tabs, weights)
    per_seed = np.array([t.means() @ w for t in tabs])
    n = int(sum(len(t.ids) for t in tabs))
    s = len(tabs)
    if s < 2 or min(int(t.n.min()) for t in tabs) < 2:
        return PooledEstimate(float(per_seed.mean()), n, confidence=confidence, unit="seed", seeds=s)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, s, size=(resamples, s))
    draws = np.empty((resamples, s))
    for k, t in enumerate(tabs):
        mask = pick == k
        if mask.any():
            draws[mask] = t.bootstrap(int(mask.sum()), rng) @ w
    stat = draws.mean(axis=1)
    lo, hi = percentile_interval(stat, confidence)
    return PooledEstimate(float(per_seed.mean()), n, float(stat.std(ddof=1)), lo, hi, confidence,
                          "two-level bootstrap", "seed", seeds=s, boot_lo=lo, boot_hi=hi)

"""A cell's uncertainty and a row's effective context length: the one home (DESIGN.md) of the bootstrap interval of
a cell, the paired IE - IB interval, the MSE(P-IE vs P-IB) noise floor, the effective context length (NoLiMa's
relative rule; the absolute rule of a fixed threshold, RULER's, which is RULER's effective length only with RULER's
kind of threshold -- a reference model's score -- and the above-floor length with a floor's) and short-context
retention (LongRoPE2). The tests the readings use are beside it, in :mod:`.significance`. Pure functions of per-sample
scores and cell values (numbers, or ``{sample id: score}`` mappings); nothing here reads files or prints.

Conventions (every function):
- a cell's samples are ``{id: score}``; two prompts' samples *pair* where their ids are equal (the same eval sample
  under Prompt-IE and Prompt-IB). Resampling keeps a pair together: the ids are resampled, not the scores, so the
  correlation between the prompts on one sample is in every interval (a stratified bootstrap: ids present in the
  same set of groups form one stratum, resampled with replacement to its own size, so every group keeps its n);
- intervals are percentile bootstrap intervals (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, Ch. 13):
  ``RESAMPLES`` resamples drawn by ``numpy.random.default_rng(seed)``, the interval the ``(1 - confidence) / 2`` and
  ``(1 + confidence) / 2`` quantiles of the resampled statistic (numpy's default, linear interpolation between order
  statistics). Same input, same seed: the same interval, on every machine numpy's PCG64 runs on;
- standard errors are the analytic ones (sample variances with ddof=1), see :func:`var_of_combination`;
- a cell with fewer than 2 samples has a mean and no interval (a scores CSV gives one number per cell: n = 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Mapping, Optional, Sequence

import numpy as np

CONFIDENCE = 0.95
# resamples: an endpoint's Monte Carlo sd (over seeds) is ~1.5 % of the interval's width at n = 16 and n = 200
# (measured: 1.4 % and 1.7 %; 2.2-2.5 % at 1000, 0.9-1.1 % at 4000), a cell takes 20-45 ms at n = 200
RESAMPLES = 2000
SEED = 0
NOLIMA_KEEP = 0.85  # NoLiMa: the effective length keeps >= 85 % of the base score


# ------------------------------------------------------------------------------------------------ results

def mse_ie_ib(ie: dict, ib: dict) -> Optional[float]:
    """CNNSum Table 2 'MSE (P-IE vs P-IB)' (Sec 4.3): the mean over the model's subsets of (IE - IB)^2; None when a
    subset has only one of the two prompts (a subset with neither, like GPT-4o's 3XL, is not one of its subsets)."""
    ie = {c: v for c, v in ie.items() if v is not None}
    ib = {c: v for c, v in ib.items() if v is not None}
    if not ie or set(ie) != set(ib):
        return None
    return sum((ie[c] - ib[c]) ** 2 for c in ie) / len(ie)

@dataclass(frozen=True)
class Estimate:
    """A cell: the mean over its samples (for several prompts, the mean of each prompt's mean), n (the independent
    samples: distinct sample ids, a sample scored under two prompts counted once), the standard error and the
    percentile bootstrap interval [lo, hi] (None below 2 samples)."""

    mean: Optional[float]
    n: int
    se: Optional[float] = None
    lo: Optional[float] = None
    hi: Optional[float] = None
    confidence: float = CONFIDENCE

    def excludes(self, value: float = 0.0) -> bool:
        """Whether the interval lies wholly on one side of ``value`` (False without an interval)."""
        return self.lo is not None and self.hi is not None and (self.lo > value or self.hi < value)

    def to_dict(self) -> dict:
        return {"mean": self.mean, "n": self.n, "se": self.se, "lo": self.lo, "hi": self.hi}

    def text(self, nd: int = 1) -> str:
        """``45.0 [38.2, 51.9]`` (``-`` for no mean; the mean alone without an interval)."""
        if self.mean is None:
            return "-"
        if self.lo is None or self.hi is None:
            return f"{self.mean:.{nd}f}"
        return f"{self.mean:.{nd}f} [{self.lo:.{nd}f}, {self.hi:.{nd}f}]"


@dataclass(frozen=True)
class Difference(Estimate):
    """IE - IB of one cell: the difference of the two prompts' means, its standard error and paired bootstrap
    interval; ``n_pairs`` ids scored under both prompts, the ids scored under only one (reported, never dropped:
    they count in their prompt's mean and are resampled on their own)."""

    n_pairs: int = 0
    unpaired_ie: tuple = ()
    unpaired_ib: tuple = ()

    @property
    def paired(self) -> bool:
        """Every sample has its partner: the interval is the plain paired bootstrap of the per-id differences."""
        return self.n_pairs > 0 and not self.unpaired_ie and not self.unpaired_ib

    def to_dict(self) -> dict:
        return {**super().to_dict(), "n_pairs": self.n_pairs, "unpaired_ie": list(self.unpaired_ie),
                "unpaired_ib": list(self.unpaired_ib)}


@dataclass(frozen=True)
class MSE:
    """MSE(P-IE vs P-IB) of a row (``mse_ie_ib``), its noise floor (the MSE expected with no prompt effect,
    :func:`mse_noise_floor`), the percentile bootstrap interval of the MSE (samples resampled within each cell) and
    the cells it is over."""

    mse: Optional[float]
    floor: Optional[float]
    lo: Optional[float] = None
    hi: Optional[float] = None
    cells: int = 0
    confidence: float = CONFIDENCE

    def to_dict(self) -> dict:
        return {"mse": self.mse, "floor": self.floor, "lo": self.lo, "hi": self.hi, "cells": self.cells}


@dataclass(frozen=True)
class EffectiveLength:
    """The effective context length of a row under one convention (see :func:`effective_length`).

    ``length``: the longest evaluated column of the passing run that starts at the first column (None: none passes);
    ``stop``: what ended that run -- ``"fail"`` (the next column scores below the threshold), ``"missing"`` (the next
    column has no finite score: the claim stops where the measurements do) or ``"end"`` (every column passed: the
    row holds past the longest length evaluated, RULER's ">128K"); ``later_passes``: columns past the stop that pass
    again (shown, never counted); ``straddles``: columns up to the stop whose interval contains the threshold (the
    pass/fail there is inside the noise); ``threshold``: the score a column must reach (None: undefined, e.g. the
    relative rule without a positive 1x score)."""

    length: Optional[str]
    stop: str  # "fail", "missing", "end" or "undefined" (no threshold)
    threshold: Optional[float]
    rule: str  # "relative" (NoLiMa's rule) or "absolute" (a fixed threshold: RULER's rule)
    stopped_at: Optional[str] = None  # the column that failed or was missing (None: "end", "undefined")
    later_passes: tuple = ()
    straddles: tuple = ()

    def text(self) -> str:
        """RULER's and NoLiMa's notation: ``T2048``; ``<T512`` (fails at the first length, T512); ``>T4096`` (holds
        at every length evaluated, the longest being T4096); ``T1024 (T2048 missing)``; ``-`` (undefined)."""
        if self.stop in ("undefined", "end") or self.length is None and self.stop == "fail":
            return {"undefined": "-", "end": f">{self.length}", "fail": f"<{self.stopped_at}"}[self.stop]
        if self.stop == "missing":
            return f"{self.length or '-'} ({self.stopped_at} missing)"
        return str(self.length)

    def to_dict(self) -> dict:
        return {"length": self.length, "text": self.text(), "stop": self.stop, "stopped_at": self.stopped_at,
                "threshold": self.threshold, "rule": self.rule, "later_passes": list(self.later_passes),
                "straddles": list(self.straddles)}


# ------------------------------------------------------------------------------------------------ the cell
def cell(values: Sequence[float] | Mapping[Hashable, float], *, resamples: int = RESAMPLES, seed: int = SEED,
         confidence: float = CONFIDENCE) -> Estimate:
    """A cell's mean, n, standard error and percentile bootstrap interval (Efron & Tibshirani 1993, Ch. 13).

    The resamples are exactly ``values[rng.integers(0, n, size=(resamples, n))].mean(axis=1)`` with
    ``rng = numpy.random.default_rng(seed)`` (values in the order given)."""
    return cell_of_prompts([values], resamples=resamples, seed=seed, confidence=confidence)


def cell_of_prompts(groups: Sequence[Sequence[float] | Mapping[Hashable, float]], *, resamples: int = RESAMPLES,
                    seed: int = SEED, confidence: float = CONFIDENCE) -> Estimate:
    """The extrapolation view's cell (``Report.extrapolation``): the mean over the prompts present of each
    prompt's mean over its samples, with n = the independent samples (distinct ids: 16 eval samples under two
    prompts are n = 16), the standard error and a bootstrap interval that resamples sample ids (a sample scored
    under both prompts moves as one). A group given as a plain sequence has ids of its own (it pairs with
    nothing)."""
    groups = [g for g in (_as_mapping(g, k) for k, g in enumerate(groups)) if g]
    if not groups:
        return Estimate(None, 0, confidence=confidence)
    tab = _Table(groups)
    w = np.full(len(groups), 1.0 / len(groups))
    mean = float(tab.means() @ w)
    n = len(tab.ids)
    if tab.n.min() < 2:
        return Estimate(mean, n, confidence=confidence)
    draws = tab.bootstrap(resamples, np.random.default_rng(seed)) @ w
    lo, hi = percentile_interval(draws, confidence)
    return Estimate(mean, n, math.sqrt(max(var_of_combination(groups, w), 0.0)), lo, hi, confidence)


def ie_minus_ib(ie: Mapping[Hashable, float], ib: Mapping[Hashable, float], *, resamples: int = RESAMPLES,
                seed: int = SEED, confidence: float = CONFIDENCE) -> Difference:
    """IE - IB of one cell (CNNSum Sec. 4.3 compares the two prompts per subset): mean(IE) - mean(IB) over each
    prompt's samples, n the independent samples (distinct ids), the standard error of that difference and its
    paired percentile bootstrap interval (ids resampled: a pair moves as one; ids under one prompt only are
    resampled within their prompt and listed)."""
    ie, ib = _canonical(ie), _canonical(ib)
    unpaired_ie = tuple(i for i in ie if i not in ib)
    unpaired_ib = tuple(i for i in ib if i not in ie)
    n_pairs = sum(1 for i in ie if i in ib)
    if not ie or not ib:
        return Difference(None, len({*ie, *ib}), confidence=confidence, n_pairs=0, unpaired_ie=unpaired_ie,
                          unpaired_ib=unpaired_ib)
    tab = _Table([ie, ib])
    w = np.array([1.0, -1.0])
    mean = float(tab.means() @ w)
    n = len(tab.ids)
    se = lo = hi = None
    if tab.n.min() >= 2:
        se = math.sqrt(max(var_of_combination([ie, ib], w), 0.0))
        lo, hi = percentile_interval(tab.bootstrap(resamples, np.random.default_rng(seed)) @ w, confidence)
    return Difference(mean, n, se, lo, hi, confidence, n_pairs=n_pairs, unpaired_ie=unpaired_ie,
                      unpaired_ib=unpaired_ib)


# ------------------------------------------------------------------------------------------------ MSE and its floor
def mse_noise_floor(cells: Mapping[str, tuple[Mapping[Hashable, float], Mapping[Hashable, float]]]) -> Optional[float]:
    """The MSE(P-IE vs P-IB) expected with no prompt effect: the mean over the cells of Var(IE - IB) (derived below).

    Derivation. A row's MSE is (1/C) sum_c D_c^2 over its C cells (CNNSum Table 2, ``mse_ie_ib``), with
    D_c = mean(IE_c) - mean(IB_c). For any random variable E[D^2] = (E D)^2 + Var(D); with no prompt effect the two
    prompts score a cell alike in expectation, E D_c = 0, so E[MSE] = (1/C) sum_c Var(D_c): the floor. Samples are
    independent across ids, so with n_IE and n_IB samples of which m ids pair,
        Var(D_c) = s_IE^2 / n_IE + s_IB^2 / n_IB - 2 m s_IE,IB / (n_IE n_IB)
    (:func:`var_of_combination`). Where every id pairs (n_IE = n_IB = m = n) this is exactly s_d^2 / n, the squared
    paired standard error of the per-id differences d = IE - IB; where none pairs it is se_IE^2 + se_IB^2. Each term is
    an unbiased estimate, so the floor is too. An MSE near its floor is what noise alone gives; None where the MSE is
    None (a cell with one prompt only) or a cell has fewer than 2 samples under a prompt."""
    if not cells:
        return None
    terms = []
    for ie, ib in cells.values():
        if len(ie) < 2 or len(ib) < 2:
            return None
        terms.append(var_of_combination([_canonical(ie), _canonical(ib)], np.array([1.0, -1.0])))
    return float(np.mean(terms))


def mse_with_floor(cells: Mapping[str, tuple[Mapping[Hashable, float], Mapping[Hashable, float]]], *,
                   resamples: int = RESAMPLES, seed: int = SEED, confidence: float = CONFIDENCE) -> MSE:
    """A row's MSE(P-IE vs P-IB) exactly as the report computes it (``mse_ie_ib`` of the cells' IE and IB
    means), its noise floor (:func:`mse_noise_floor`) and a percentile bootstrap interval of the MSE (ids resampled
    within each cell, cells independently, one generator in the cells' order).

    ``cells``: {column: (IE samples {id: score}, IB samples)}; a column with only one prompt makes the MSE None, as
    in the report. The interval describes the MSE's sampling spread; a squared statistic is biased upward by its own
    noise (E[D^2] = (E D)^2 + Var D), so read the MSE against its floor, not the interval against 0."""
    cells = {c: (_canonical(ie), _canonical(ib)) for c, (ie, ib) in cells.items()}
    ie_means = {c: _mean(ie) for c, (ie, _) in cells.items()}
    ib_means = {c: _mean(ib) for c, (_, ib) in cells.items()}
    mse = mse_ie_ib(ie_means, ib_means)
    if mse is None:
        return MSE(None, None, cells=0, confidence=confidence)
    floor = mse_noise_floor(cells)
    lo = hi = None
    if floor is not None:
        rng = np.random.default_rng(seed)
        w = np.array([1.0, -1.0])
        sq = [(_Table([ie, ib]).bootstrap(resamples, rng) @ w) ** 2 for ie, ib in cells.values()]
        lo, hi = percentile_interval(np.mean(sq, axis=0), confidence)
    return MSE(mse, floor, lo, hi, len(cells), confidence)


# ------------------------------------------------------------------------------------------------ effective length
def effective_length(cells: Mapping[str, Optional[float]], threshold: Optional[float], *, rule: str = "absolute",
                     columns: Optional[Sequence[str]] = None,
                     intervals: Optional[Mapping[str, tuple[Optional[float], Optional[float]]]] = None
                     ) -> EffectiveLength:
    """The longest evaluated length up to which a row keeps its score >= ``threshold`` (RULER, arXiv 2404.06654,
    github.com/NVIDIA/RULER README: a model handles a length when its score there exceeds a fixed threshold,
    Llama-2-7B's 85.6 at 4K, and its "Effective Length" is the longest such length; a score equal to the threshold
    counts, as RULER's table underlines Qwen3-32B's 85.6 at 128K).

    ``cells``: {column: score}; ``columns``: the evaluated lengths in order, the 1x column first (default: the
    keys of ``cells``; a column absent from ``cells`` is a missing cell). The walk starts at the first column and stops
    at the first column that fails (score < threshold) or has no finite score (absent, None, NaN: not measured, so no
    claim past it); the effective length is the last column before the stop. Neither paper's table has a row that
    fails and then passes again, and both define the length as the longest one the model *maintains*, so a pass
    after a failure is not counted: it is listed in ``later_passes``. ``intervals`` ({column: (lo, hi)}) marks the
    columns up to the stop whose interval contains the threshold (``straddles``)."""
    cols = list(cells if columns is None else columns)
    if not cols or threshold is None or not math.isfinite(threshold):
        return EffectiveLength(None, "undefined", None, rule)
    scores = [_finite(cells.get(c)) for c in cols]
    k = next((k for k, v in enumerate(scores) if v is None or v < threshold), len(cols))  # where the walk stops
    length = cols[k - 1] if k else None
    stop = "end" if k == len(cols) else ("missing" if scores[k] is None else "fail")
    later = tuple(c for c, v in zip(cols[k + 1:], scores[k + 1:]) if v is not None and v >= threshold)
    straddles = ()
    if intervals:
        straddles = tuple(c for c in cols[:k + 1] if (iv := intervals.get(c)) and None not in iv
                          and iv[0] <= threshold <= iv[1])
    return EffectiveLength(length, stop, float(threshold), rule, None if stop == "end" else cols[k], later,
                           straddles)


def effective_length_relative(cells: Mapping[str, Optional[float]], *, keep: float = NOLIMA_KEEP,
                              base: Optional[float] = None, columns: Optional[Sequence[str]] = None,
                              intervals: Optional[Mapping[str, tuple[Optional[float], Optional[float]]]] = None
                              ) -> EffectiveLength:
    """NoLiMa's effective length (arXiv 2502.05167; README: "the longest context where a model maintains at least
    85% of its base score"): :func:`effective_length` with the threshold ``keep`` x the base score: ``base`` when
    given, else the row's own score at its first column (1x). NoLiMa's base score is the model's score at short
    contexts (250-1K tokens), below its shortest column; here the first column is inside the original window.
    Undefined (``-``) when the base is missing, not finite or <= 0 (every score keeps 85 % of nothing)."""
    cols = list(cells if columns is None else columns)
    ref = _finite(base) if base is not None else (_finite(cells.get(cols[0])) if cols else None)
    threshold = keep * ref if ref is not None and ref > 0 else None
    return effective_length(cells, threshold, rule="relative", columns=cols, intervals=intervals)


def retention(row_1x: Optional[float], base_1x: Optional[float]) -> Optional[float]:
    """Short-context retention (LongRoPE2, arXiv 2502.20082, abstract: the extended model "retaining over 98.5% of
    short-context performance", its short-context score as a share of the original model's): the row's 1x score /
    the unscaled base model's 1x score; None when either is missing or not finite, or the base's is <= 0."""
    r, b = _finite(row_1x), _finite(base_1x)
    if r is None or b is None or b <= 0:
        return None
    return r / b


# ------------------------------------------------------------------------------------------------ the machinery
def percentile_interval(draws: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile bootstrap interval (Efron & Tibshirani 1993, Ch. 13): the (1-c)/2 and (1+c)/2 quantiles of
    the resampled statistic (numpy's linear interpolation between order statistics)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    lo, hi = np.quantile(np.asarray(draws, dtype=float), [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


def var_of_combination(groups: Sequence[Mapping[Hashable, float]], weights: Sequence[float]) -> float:
    """Var(sum_g w_g mean_g) estimated from the samples: sum_g w_g^2 s_g^2 / n_g + 2 sum_{g<h} w_g w_h m_gh s_gh /
    (n_g n_h), with s_g^2 the sample variance (ddof=1) of group g's n_g scores and s_gh the sample covariance (ddof=1)
    over the m_gh ids in both g and h (samples independent across ids: Cov(mean_g, mean_h) = m_gh sigma_gh /
    (n_g n_h)). Groups need >= 2 samples; a covariance needs >= 2 shared ids (else its term is 0)."""
    groups = [_as_mapping(g, k) for k, g in enumerate(groups)]
    w = np.asarray(weights, dtype=float)
    total = 0.0
    for g, grp in enumerate(groups):
        x = np.fromiter(grp.values(), float, len(grp))
        total += w[g] ** 2 * float(np.var(x, ddof=1)) / len(x)
        for h in range(g + 1, len(groups)):
            shared = [i for i in grp if i in groups[h]]
            if len(shared) >= 2:
                cov = float(np.cov([grp[i] for i in shared], [groups[h][i] for i in shared], ddof=1)[0, 1])
                total += 2 * w[g] * w[h] * len(shared) * cov / (len(grp) * len(groups[h]))
    return total


class _Table:
    """Groups of {id: score} as one id x group matrix, resampled by id within strata of ids present in the same
    groups (each group keeps its n in every resample)."""

    def __init__(self, groups: Sequence[Mapping[Hashable, float]]):
        # ids in a canonical order (:func:`_id_order`), not the order a run happened to write them: a cell's interval
        # depends on its samples only, not on the batch schedule that finished them
        self.ids = sorted(dict.fromkeys(i for g in groups for i in g), key=_id_order)
        row = {i: k for k, i in enumerate(self.ids)}
        self.values = np.zeros((len(self.ids), len(groups)))
        self.present = np.zeros((len(self.ids), len(groups)), dtype=bool)
        for j, g in enumerate(groups):
            for i, v in g.items():
                x = _finite(v)
                if x is None:
                    raise ValueError(f"sample {i!r}: score {v!r} is not a finite number")
                self.values[row[i], j], self.present[row[i], j] = x, True
        self.n = self.present.sum(axis=0)
        patterns = {}
        for k in range(len(self.ids)):
            patterns.setdefault(self.present[k].tobytes(), []).append(k)
        self.strata = [np.array(rows) for rows in patterns.values()]

    def means(self) -> np.ndarray:
        return self.values.sum(axis=0) / self.n

    def bootstrap(self, resamples: int, rng: np.random.Generator) -> np.ndarray:
        """(resamples, groups): each group's mean in each resample."""
        if resamples < 1:
            raise ValueError(f"resamples must be >= 1, got {resamples}")
        sums = np.zeros((resamples, self.values.shape[1]))
        for rows in self.strata:
            idx = rng.integers(0, len(rows), size=(resamples, len(rows)))
            sums += self.values[rows][idx].sum(axis=1)
        return sums / self.n


def _id_order(i: Hashable) -> tuple:
    """A sort key for sample ids of mixed kinds: numbers by value, then strings, then tuples element-wise (a
    sequence's (group, position) ids keep the order given), then anything else by its repr."""
    if isinstance(i, (int, float, np.integer, np.floating)) and not isinstance(i, bool):
        return (0, float(i))
    if isinstance(i, str):
        return (1, i)
    if isinstance(i, tuple):
        return (2, tuple(_id_order(x) for x in i))
    return (3, repr(i))


def _as_mapping(values: Any, group: int) -> Mapping[Hashable, float]:
    """{id: score}: a mapping in canonical id order (:func:`_canonical`); a sequence's scores keyed (group,
    position), ids no other group has."""
    return _canonical(values) if isinstance(values, Mapping) else {(group, i): v for i, v in enumerate(values)}


def _canonical(values: Mapping[Hashable, float]) -> dict:
    """The same {id: score} in canonical id order (:func:`_id_order`): every sum over it runs in the same order
    whatever order a run wrote its samples in, so a cell's numbers are bit-identical between such runs."""
    return dict(sorted(values.items(), key=lambda kv: _id_order(kv[0])))


def _mean(values: Mapping[Hashable, float]) -> Optional[float]:
    return sum(values.values()) / len(values) if values else None


def _finite(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None

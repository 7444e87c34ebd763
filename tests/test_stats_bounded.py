"""A bounded score's interval (ropescale.common.stats.means ``bounds=``): the t interval clipped to the score's range,
and Wilson's interval of the share where the units have no spread. References: scipy's t interval and Wilson's
score interval written out here (Wilson 1927), never the module's own output."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats as st

from ropescale.common.stats.means import (
    CLIPPED_RULE,
    NO_SPREAD_RULE,
    T_RULE,
    bounded,
    cell,
    cell_of_prompts,
    over_seeds,
    t_interval,
)

Z = float(st.norm.ppf(0.975))
P_GRID = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
DRAWS = 2000


def wilson_by_hand(x: float, n: int) -> tuple[float, float]:
    """Wilson (1927): (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), p = x / n."""
    p = x / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def scipy_t(values) -> tuple[float, float]:
    return tuple(float(v) for v in st.ttest_1samp(values, 0.0).confidence_interval(0.95))


# ------------------------------------------------------------------------------------------------ hand cases
def test_sixteen_zeros_read_wilson_not_zero_width():
    e = cell([0.0] * 16, bounds=(0, 100))
    lo, hi = wilson_by_hand(0, 16)
    assert e.rule == NO_SPREAD_RULE and e.mean == 0.0 and e.n == 16
    assert e.lo == 0.0 and math.isclose(e.hi, 100 * hi, rel_tol=1e-9) and round(e.hi, 1) == 19.4
    assert e.text() == "0.0 [0.0, 19.4]"
    full = cell([100.0] * 16, bounds=(0, 100))
    assert full.hi == 100.0 and math.isclose(full.lo, 100 - 19.36076805, rel_tol=1e-6)
    # without bounds nothing changes: the plain t interval of no width
    plain = cell([0.0] * 16)
    assert (plain.lo, plain.hi, plain.rule) == (0.0, 0.0, T_RULE)


def test_interval_below_zero_is_clipped_to_zero():
    x = [0.0] * 15 + [35.0]  # mean 2.2, scipy's t interval [-2.5, 6.8]
    ref_lo, ref_hi = scipy_t(x)
    assert ref_lo < 0
    e = cell(x, bounds=(0, 100))
    assert round(e.mean, 1) == 2.2 and e.lo == 0.0 and math.isclose(e.hi, ref_hi, rel_tol=1e-6)
    assert e.rule == CLIPPED_RULE
    top = cell([100.0] * 15 + [65.0], bounds=(0, 100))
    assert top.hi == 100.0 and math.isclose(top.lo, scipy_t([100.0] * 15 + [65.0])[0], rel_tol=1e-6)
    inside = cell([40.0, 50.0, 55.0, 60.0], bounds=(0, 100))
    assert inside.rule == T_RULE and np.allclose((inside.lo, inside.hi), scipy_t([40.0, 50.0, 55.0, 60.0]))


def test_no_spread_inside_the_range_reads_the_share_as_a_proportion():
    e = cell([25.0, 25.0], bounds=(0, 100))  # x = 0.5 of n = 2
    lo, hi = wilson_by_hand(0.5, 2)
    assert e.rule == NO_SPREAD_RULE and np.allclose((e.lo, e.hi), (100 * lo, 100 * hi))
    acc = t_interval([1.0, 1.0, 1.0], unit="seed", bounds=(0, 1))  # an accuracy in 0..1
    assert acc.hi == 1.0 and math.isclose(acc.lo, wilson_by_hand(3, 3)[0]) and acc.spread == (1.0, 1.0)
    shifted = t_interval([-1.0, -1.0, -1.0, -1.0], bounds=(-1, 1))  # a range not starting at 0
    assert shifted.lo == -1.0 and math.isclose(shifted.hi, -1 + 2 * wilson_by_hand(0, 4)[1])


def test_cells_of_prompts_and_over_seeds_take_the_range():
    ids = {str(i): 0.0 for i in range(16)}
    e = cell_of_prompts([ids, dict(ids)], bounds=(0, 100))  # two prompts, 16 samples: n = 16
    assert e.n == 16 and e.rule == NO_SPREAD_RULE and math.isclose(e.hi, 100 * wilson_by_hand(0, 16)[1])
    zero = {s: [{str(i): 0.0 for i in range(4)}] for s in range(3)}
    pooled = over_seeds(zero, bounds=(0, 100))  # the seed is the unit: 0 of 3
    assert pooled.rule == NO_SPREAD_RULE and pooled.seeds == 3
    assert pooled.lo == 0.0 and math.isclose(pooled.hi, 100 * wilson_by_hand(0, 3)[1])
    seeds = {0: [{"a": 0.0, "b": 0.0}], 1: [{"a": 0.0, "b": 10.0}], 2: [{"a": 2.0, "b": 0.0}]}
    pooled = over_seeds(seeds, bounds=(0, 100))
    ref_lo, ref_hi = scipy_t([0.0, 5.0, 1.0])
    assert pooled.rule == CLIPPED_RULE and pooled.lo == 0.0 and math.isclose(pooled.hi, ref_hi, rel_tol=1e-6)
    assert over_seeds(seeds).lo == pytest.approx(ref_lo)  # the default: unchanged


def test_a_score_outside_its_range_or_a_bad_range_is_an_error():
    with pytest.raises(ValueError, match="outside its range"):
        cell([0.5, 101.0], bounds=(0, 100))
    with pytest.raises(ValueError, match="lo < hi"):
        cell([0.5, 1.0], bounds=(1, 0))
    with pytest.raises(ValueError, match="lo < hi"):
        t_interval([0.5, 1.0], bounds=(0, math.nan))
    with pytest.raises(ValueError, match="outside its range"):
        cell([-0.5, 1.0], bounds=(0, math.inf))


def test_a_one_sided_range_clips_only():
    x = [0.1, 0.2, 5.0]  # a loss (nats a token): >= 0, no upper end
    ref_lo, ref_hi = scipy_t(x)
    e = cell(x, bounds=(0, math.inf))
    assert ref_lo < 0 and e.lo == 0.0 and math.isclose(e.hi, ref_hi, rel_tol=1e-9) and e.rule == CLIPPED_RULE
    same = cell([2.3, 2.3], bounds=(0, math.inf))  # no spread, no share to read: the t interval stays
    assert (same.lo, same.hi, same.rule) == (2.3, 2.3, T_RULE)
    top = t_interval([-0.1, -0.2, -5.0], bounds=(-math.inf, 0))
    assert top.hi == 0.0 and math.isclose(top.lo, scipy_t([-0.1, -0.2, -5.0])[0], rel_tol=1e-9)


# ------------------------------------------------------------------------------------------------ coverage
def shares(kind: str, k: float, p: float, n: int, rng) -> np.ndarray:
    """DRAWS x n shares in 0..100: binomial counts of k references / k, or Beta(p c, (1-p) c) with c = k."""
    if kind == "binomial":
        return 100 * rng.binomial(int(k), p, size=(DRAWS, n)) / k
    return 100 * rng.beta(p * k, (1 - p) * k, size=(DRAWS, n))


def coverage(x: np.ndarray, p: float) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(plain t coverage, bounded coverage, bounded lo, bounded hi) of DRAWS rows: scipy's t interval, the module's
    rule (:func:`bounded`) applied to it."""
    n = x.shape[1]
    mean, se = x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(n)
    t_lo, t_hi = st.t.interval(0.95, n - 1, loc=mean, scale=np.where(se > 0, se, 1.0))
    t_lo, t_hi = np.where(se > 0, t_lo, mean), np.where(se > 0, t_hi, mean)  # no spread: no width
    out = np.array([bounded(m, n, s, lo, hi, (0, 100))[:2] for m, s, lo, hi in zip(mean, se, t_lo, t_hi)])
    truth = 100 * p
    return (float(np.mean((t_lo <= truth) & (truth <= t_hi))), float(np.mean((out[:, 0] <= truth)
            & (truth <= out[:, 1]))), out[:, 0], out[:, 1])


@pytest.mark.parametrize("n", [3, 9, 16])
@pytest.mark.parametrize("kind,k", [("binomial", 1), ("binomial", 4), ("binomial", 10), ("beta", 3), ("beta", 9)])
def test_bounded_rule_covers_at_least_as_often_as_the_t_interval(kind, k, n):
    rng = np.random.default_rng(1000 * n + int(k) + (7 if kind == "beta" else 0))
    t_cov, b_cov = [], []
    for p in P_GRID:
        x = shares(kind, k, p, n, rng)
        tc, bc, lo, hi = coverage(x, p)
        t_cov.append(tc)
        b_cov.append(bc)
        assert np.all((lo >= 0) & (hi <= 100) & (lo <= hi))
        # the module's own cells on some of the same draws: the same interval as scipy's, bounded
        for row, a, b in list(zip(x, lo, hi))[:15]:
            e = t_interval(row.tolist(), bounds=(0, 100))
            assert math.isclose(e.lo, a, abs_tol=1e-7) and math.isclose(e.hi, b, abs_tol=1e-7)
    t_mean, b_mean = float(np.mean(t_cov)), float(np.mean(b_cov))
    print(f"{kind} k={k} n={n}: t {100 * t_mean:.1f} %, bounded {100 * b_mean:.1f} % (averaged over p "
          f"{P_GRID[0]}-{P_GRID[-1]}; by p: {', '.join(f'{100 * c:.1f}' for c in b_cov)})")
    assert all(b >= t for b, t in zip(b_cov, t_cov))
    if kind == "binomial":
        # counts of references read (RULER's several-reference shares, k = 1 a hit): 93-99 % at 9 and 16; at 3 the
        # t quantile (4.30) over-covers whatever has spread (measured 98-99.7 %), not the whole range
        assert 0.93 <= b_mean <= (0.99 if n >= 9 else 0.999)
    else:
        # continuous skewed shares never lack spread: clipping alone, the t interval's coverage (it under-covers
        # at small p: measured 84-94 % averaged over p, 63 % at p = 0.05, n = 3), unchanged by the range
        assert b_mean == t_mean


# ------------------------------------------------------------------------------------------------ the callers
def test_ruler_cells_and_averages_read_their_range():
    from ropescale.probes.ruler.tables import averages, interval

    mean, lo, hi, rule = interval([25.0, 25.0])  # two samples with 1 of 4 references each: no spread
    w = wilson_by_hand(0.5, 2)
    assert rule == NO_SPREAD_RULE and np.allclose((mean, lo, hi), (25.0, 100 * w[0], 100 * w[1]))
    x = [0.0, 0.0, 0.0, 25.0]
    mean, lo, hi, rule = interval(x)
    assert rule == CLIPPED_RULE and lo == 0.0 and math.isclose(hi, scipy_t(x)[1], rel_tol=1e-9)

    def recs(tasks):
        return [{"task": t, "way": "gen", "col": 512, "value": v / 100} for t, vals in tasks.items() for v in vals]

    # every task's samples agree, not all 0/100: no spread, the pooled share 1.5 of 4 by Wilson (was no interval)
    mean, lo, hi, _ = averages(recs({"a": [25, 25], "b": [50, 50]}))["gen"][512]
    w = wilson_by_hand(4 * 0.375, 4)
    assert mean == pytest.approx(37.5) and np.allclose((lo, hi), (100 * w[0], 100 * w[1]))
    # all zeros with unequal n a task (not the pooled-proportion branch): 0 of 5, never [0, 0]
    mean, lo, hi, _ = averages(recs({"a": [0, 0, 0], "b": [0, 0]}))["gen"][512]
    assert (mean, lo) == (0.0, 0.0) and math.isclose(hi, 100 * wilson_by_hand(0, 5)[1])
    # a mean of task means below 0 by the t rule: clipped at 0 (scipy: the t interval of a mean of two task means)
    a, b = [0.0, 0.0, 10.0], [0.0, 0.0, 0.0, 0.0]
    mean, lo, hi, _ = averages(recs({"a": a, "b": b}))["gen"][512]
    se = math.sqrt(st.tvar(a) / 3) / 2
    assert lo == 0.0 and hi == pytest.approx(mean + st.t.ppf(0.975, 2) * se)


def test_probe_report_cells_of_a_share_read_their_range():
    from ropescale.evaluation.report.probes import with_intervals

    recs = [{"id": str(i), "group": "", "col": 512, "value": v} for i, v in enumerate([0.25, 0.25])]
    recs += [{"id": str(i), "group": "", "col": 1024, "value": v} for i, v in enumerate([0.0, 0.0, 0.25])]
    recs += [{"id": str(i), "group": "", "col": 2048, "value": v} for i, v in enumerate([1.5, 1.5])]
    summary = {"cell_kind": "share", "cells": [{"col": 512, "value": 0.25}, {"col": 1024, "value": 0.25 / 3}]}
    a, b = with_intervals(summary, recs)["cells"]
    w = wilson_by_hand(0.5, 2)
    assert a["interval"] == NO_SPREAD_RULE and np.allclose((a["lo"], a["hi"]), w)
    assert b["interval"] == CLIPPED_RULE and b["lo"] == 0.0 and math.isclose(b["hi"], scipy_t([0, 0, 0.25])[1])
    loss = with_intervals({"cell_kind": "mean", "cells": [{"col": 2048, "value": 1.5}]}, recs)["cells"][0]
    assert (loss["lo"], loss["hi"], loss["interval"]) == (1.5, 1.5, T_RULE)  # a loss has no range: unchanged

"""The statistics floor's interval rules simulated: each rule the pages use covers the truth 93-97 % of the time for a
95 % interval at the n the pages use (3, 9, 16 units; 4,000 draws, vectorised numpy), normal data for means (a cell,
two prompts' cell, a paired difference, a partly paired difference, few windows, seeds), binomial data for
proportions (p drawn from 0.05 to 0.5: Wilson in the band; Clopper-Pearson above it, printed). Printed, not held in
the band: the t interval's under-coverage on skewed data (exponential, lognormal; the pages name the cells that rest
on few skewed units), and the intervals the floor does not use for a mean (the percentile bootstrap, Hesterberg's
expanded percentile, the two-level bootstrap over 3 seeds). The vectorised rules are checked against the floor's own
functions draw by draw; the references: scipy.stats (the t quantile, binomtest's Wilson and exact intervals,
false_discovery_control's BH)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from ropescale.common.stats import means as M
from ropescale.common.stats import multiplicity as Q
from ropescale.common.stats import proportions as P
from ropescale.common.stats import tests as T

DRAWS = 4000  # a coverage's Monte Carlo sd at 95 %: 0.34 %
BAND = (0.93, 0.97)
NS = (3, 9, 16)
CHECKED = 25  # draws per rule and n recomputed through the floor's own function


def t_bounds(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's mean -+ t_{0.975, n-1} sd / sqrt n (Student 1908; scipy's t quantile)."""
    n = x.shape[1]
    half = scipy.stats.t.ppf(0.975, n - 1) * x.std(axis=1, ddof=1) / np.sqrt(n)
    return x.mean(axis=1) - half, x.mean(axis=1) + half


def covered(lo: np.ndarray, hi: np.ndarray, truth: float) -> float:
    return float(np.mean((lo <= truth) & (truth <= hi)))


def same(est, lo: np.ndarray, hi: np.ndarray, k: int) -> bool:
    return est.lo == pytest.approx(float(lo[k]), abs=1e-9) and est.hi == pytest.approx(float(hi[k]), abs=1e-9)


def paired(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(draws, n) IE and IB scores of the same samples: a sample effect (sd 15) both share, each prompt's noise
    (sd 8), IE 4 points above IB in expectation (means 44 and 40)."""
    base = rng.normal(40.0, 15.0, (DRAWS, n))
    return base + 4.0 + rng.normal(0, 8.0, (DRAWS, n)), base + rng.normal(0, 8.0, (DRAWS, n))


# ------------------------------------------------------------------------------------------------ means
@pytest.mark.parametrize("n", NS)
def test_a_cell_of_samples_covers(n):
    """``means.cell`` (the t interval at every n) and ``means.t_interval`` (few windows or seeds, the same rule)."""
    x = np.random.default_rng(n).normal(10.0, 3.0, (DRAWS, n))
    lo, hi = t_bounds(x)
    for k in range(CHECKED):
        assert same(M.cell(list(x[k])), lo, hi, k) and same(M.t_interval(list(x[k])), lo, hi, k)
    cov = covered(lo, hi, 10.0)
    print(f"a cell (t), normal data, n = {n}: {100 * cov:.1f} %")
    assert BAND[0] <= cov <= BAND[1]


@pytest.mark.parametrize("n", NS)
def test_a_cell_of_two_prompts_and_their_paired_difference_cover(n):
    """``means.cell_of_prompts`` of IE and IB on the same samples (the truth: 42, the mean of the two prompts'
    means) and ``means.ie_minus_ib`` (the truth: +4), paired by id."""
    rng = np.random.default_rng(50 + n)
    ie, ib = paired(n, rng)
    lo_c, hi_c = t_bounds((ie + ib) / 2)
    lo_d, hi_d = t_bounds(ie - ib)
    for k in range(CHECKED):
        a, b = dict(enumerate(ie[k])), dict(enumerate(ib[k]))
        assert same(M.cell_of_prompts([a, b]), lo_c, hi_c, k) and same(M.ie_minus_ib(a, b), lo_d, hi_d, k)
    cov_c, cov_d = covered(lo_c, hi_c, 42.0), covered(lo_d, hi_d, 4.0)
    print(f"two prompts' cell, n = {n}: {100 * cov_c:.1f} %; IE - IB paired: {100 * cov_d:.1f} %")
    assert BAND[0] <= cov_c <= BAND[1] and BAND[0] <= cov_d <= BAND[1]


@pytest.mark.parametrize("n", NS)
def test_a_partly_paired_difference_covers(n):
    """IE - IB where 2 samples have IE only (a run that lost their IB answers): se^2 = s_IE^2 / n_IE + s_IB^2 / n_IB
    - 2 m s_IE,IB / (n_IE n_IB) over the m = n shared ids, df = n - 1 (``means.ie_minus_ib``)."""
    rng = np.random.default_rng(80 + n)
    ie, ib = paired(n, rng)
    extra = rng.normal(40.0, 15.0, (DRAWS, 2)) + 4.0 + rng.normal(0, 8.0, (DRAWS, 2))
    ie_all = np.concatenate([ie, extra], axis=1)
    m, n_ie = n, n + 2
    cov_xy = ((ie - ie.mean(1, keepdims=True)) * (ib - ib.mean(1, keepdims=True))).sum(1) / (n - 1)
    var = ie_all.var(axis=1, ddof=1) / n_ie + ib.var(axis=1, ddof=1) / n - 2 * m * cov_xy / (n_ie * n)
    diff = ie_all.mean(axis=1) - ib.mean(axis=1)
    half = scipy.stats.t.ppf(0.975, n - 1) * np.sqrt(np.maximum(var, 0.0))  # the floor clips a negative estimate
    lo, hi = diff - half, diff + half
    for k in range(CHECKED):
        est = M.ie_minus_ib(dict(enumerate(ie_all[k])), dict(enumerate(ib[k])))
        assert est.unpaired_ie == (n, n + 1) and same(est, lo, hi, k)
    cov = covered(lo, hi, 4.0)
    print(f"IE - IB with 2 IE-only samples, n = {n} pairs: {100 * cov:.1f} %")
    assert BAND[0] <= cov <= BAND[1]


@pytest.mark.parametrize("n", NS)
def test_over_seeds_t_rule_covers(n):
    """Seeds with a seed effect (sd 8: a fine-tune's seed moves its cell more than its samples' noise) and 8 samples
    each (sd 10): ``means.over_seeds``, the t interval over the seeds' cells."""
    rng = np.random.default_rng(100 + n)
    samples = 50.0 + rng.normal(0, 8.0, (DRAWS, n, 1)) + rng.normal(0, 10.0, (DRAWS, n, 8))
    lo, hi = t_bounds(samples.mean(axis=2))
    for k in range(CHECKED):
        est = M.over_seeds({s: [dict(enumerate(samples[k, s]))] for s in range(n)}, resamples=50, seed=k)
        assert est.unit == "seed" and same(est, lo, hi, k)
    cov = covered(lo, hi, 50.0)
    print(f"t over seeds, S = {n}: {100 * cov:.1f} %")
    assert BAND[0] <= cov <= BAND[1]


def test_t_rule_under_covers_skewed_data():
    """On few skewed units the t interval under-covers (about 88 % at n = 3 on exponential data, 84-86 % on
    lognormal at 3, 9 and 16): printed, and held below the band at n = 3 so that the pages' caveat stays true."""
    rng = np.random.default_rng(7)
    for name, draw, truth in (("exponential", lambda s: rng.exponential(1.0, s), 1.0),
                              ("lognormal", lambda s: rng.lognormal(0.0, 1.0, s), float(np.exp(0.5)))):
        covs = {n: covered(*t_bounds(draw((DRAWS, n))), truth) for n in NS}
        print(f"t interval, {name} data: " + ", ".join(f"n = {n}: {100 * c:.1f} %" for n, c in covs.items()))
        assert covs[3] < BAND[0]


def test_the_bootstraps_the_floor_does_not_use_for_a_mean_are_printed():
    """Why the t rule (``means``' docstring), on normal data: the percentile bootstrap covers about 75 / 90 / 92 % at
    n = 3 / 9 / 16, Hesterberg's expanded percentile (2015: tail level Phi(-sqrt(n/(n-1)) t_{n-1, 0.975})) about
    75 / 94 / 94 % (a resampled mean cannot leave the 3 samples' range); the two-level bootstrap over 3 seeds x 8
    samples (``means.two_level_bootstrap``, a secondary figure) below the band."""
    rng = np.random.default_rng(11)
    draws, resamples = 2000, 600
    for n in NS:
        x = rng.normal(0.0, 1.0, (draws, n))
        idx = rng.integers(0, n, size=(draws, resamples, n))
        means = np.take_along_axis(np.broadcast_to(x[:, None, :], idx.shape), idx, axis=2).mean(axis=2)
        tail = float(scipy.stats.norm.cdf(-np.sqrt(n / (n - 1)) * scipy.stats.t.ppf(0.975, n - 1)))
        pct = covered(*np.quantile(means, [0.025, 0.975], axis=1), 0.0)
        expanded = covered(*np.quantile(means, [tail, 1 - tail], axis=1), 0.0)
        print(f"n = {n}: percentile bootstrap {100 * pct:.1f} %, expanded percentile {100 * expanded:.1f} %")
        assert pct < BAND[0] and (expanded < BAND[0] if n == 3 else expanded <= BAND[1])
    hits = 0
    for k in range(300):
        samples = 50.0 + rng.normal(0, 8.0, (3, 1)) + rng.normal(0, 10.0, (3, 8))
        e = M.two_level_bootstrap({s: [dict(enumerate(samples[s]))] for s in range(3)}, resamples=400, seed=k)
        hits += e.lo <= 50.0 <= e.hi
    print(f"two-level bootstrap, S = 3 seeds x 8 samples: {100 * hits / 300:.1f} % (300 draws)")
    assert hits / 300 < BAND[0]


# ------------------------------------------------------------------------------------------------ proportions
@pytest.mark.parametrize("n", NS)
def test_proportions_cover_binomial_data(n):
    """k ~ Binomial(n, p), p ~ U(0.05, 0.5), 20,000 draws: Wilson (the floor's rule for a proportion) in the band;
    Clopper-Pearson above it (conservative: about 99.5 / 98.4 / 97.8 % at n = 3 / 9 / 16, printed), so not the
    rule."""
    rng = np.random.default_rng(200 + n)
    p = rng.uniform(0.05, 0.5, 20_000)
    k = rng.binomial(n, p)
    covs = {}
    for rule in (P.wilson, P.clopper_pearson):
        table = np.array([[rule(j, n).lo, rule(j, n).hi] for j in range(n + 1)])
        covs[rule] = float(np.mean((table[k, 0] <= p) & (p <= table[k, 1])))
        print(f"{rule(0, n).rule}, n = {n}: {100 * covs[rule]:.1f} %; 0 of {n}: [0, {100 * rule(0, n).hi:.1f}] %")
        assert rule(0, n).hi > 0  # never [0, 0]
    assert BAND[0] <= covs[P.wilson] <= BAND[1] and covs[P.clopper_pearson] > BAND[1]


@pytest.mark.parametrize("n", (1, 3, 9, 16, 50))
def test_proportions_match_scipy(n):
    for k in range(n + 1):
        ci = scipy.stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
        w = P.wilson(k, n)
        assert (w.lo, w.hi) == (pytest.approx(ci.low, abs=1e-9), pytest.approx(ci.high, abs=1e-9))
        ci = scipy.stats.binomtest(k, n).proportion_ci(0.95, method="exact")
        c = P.clopper_pearson(k, n)
        assert (c.lo, c.hi) == (pytest.approx(ci.low, abs=1e-9), pytest.approx(ci.high, abs=1e-9))
    # the bounds at 0 of n and n of n are 0 and 1 exactly (a page prints 0 [0, 30], never a 5.6e-17 lower bound)
    assert P.wilson(0, n).lo == 0.0 and P.wilson(n, n).hi == 1.0
    assert P.clopper_pearson(0, n).lo == 0.0 and P.clopper_pearson(n, n).hi == 1.0


# ------------------------------------------------------------------------------------------------ families
@pytest.mark.parametrize("m", (1, 2, 7, 60))
def test_bh_q_matches_scipy(m):
    rng = np.random.default_rng(m)
    for _ in range(20):
        p = np.concatenate([rng.uniform(0, 1, m - m // 3), rng.uniform(0, 0.01, m // 3)])
        p[rng.integers(0, m)] = p[0]  # a tie
        rng.shuffle(p)
        want = scipy.stats.false_discovery_control(p, method="bh")
        assert Q.bh_q(list(p)) == pytest.approx(list(want), abs=1e-12)
    assert Q.bh_q([0.01, None, 0.04]) == [pytest.approx(0.02), None, pytest.approx(0.04)]


def test_family_reads_resolved_only_at_q():
    """A family of 5 tests: the family reads by q, a lone test by its p."""
    tests = {k: T.Significance("t", 0.0, p, 3) for k, p in enumerate([0.001, 0.02, 0.04, 0.3, 0.9])}
    fam = Q.family(tests)
    want = scipy.stats.false_discovery_control([0.001, 0.02, 0.04, 0.3, 0.9])
    assert [fam[k].q for k in range(5)] == pytest.approx(list(want)) and fam[0].family == 5
    assert [fam[k].resolved for k in range(5)] == [True, False, False, False, False]  # p = 0.02: q = 0.05
    assert tests[1].resolved  # alone (q = p) the same test reads resolved
    assert "q = 0.05" in fam[1].reading()

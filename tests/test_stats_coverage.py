"""The statistics floor's interval rules simulated (issue 49): each rule's 95 % interval covers the truth 93-97 % of
the time at the n the pages use (3, 9, 16 units; >= 2,000 draws, vectorised numpy), normal data for means, binomial
data for proportions (p drawn from 0.05 to 0.5). Printed, not asserted in the band: the t interval's under-coverage
on skewed data (exponential, lognormal; the pages name the cells that rest on few skewed units), the percentile
bootstrap's at n = 9 and 16 and the two-level bootstrap's over 3 seeds. The references: scipy.stats (the t
quantile, binomtest's Wilson and exact intervals, false_discovery_control's BH)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from ropescale.common.stats import distributions as D
from ropescale.common.stats import means as M
from ropescale.common.stats import multiplicity as Q
from ropescale.common.stats import proportions as P
from ropescale.common.stats import tests as T

DRAWS = 4000  # a coverage's Monte Carlo sd at 95 %: 0.34 %
BAND = (0.93, 0.97)
NS = (3, 9, 16)


def t_coverage(x: np.ndarray, truth: float) -> float:
    """Coverage of the floor's t rule (mean +- t_{n-1} sd / sqrt n, t from ``distributions.t_quantile``) over the
    rows of ``x``."""
    n = x.shape[1]
    half = D.t_quantile(0.975, n - 1) * x.std(axis=1, ddof=1) / np.sqrt(n)
    return float(np.mean(np.abs(x.mean(axis=1) - truth) <= half))


def bootstrap_coverage(x: np.ndarray, truth: float, rng, resamples: int = 1000) -> float:
    """Coverage of the percentile bootstrap as ``means.cell`` computes it (numpy's linear quantiles of the resampled
    means) over the rows of ``x``."""
    d, n = x.shape
    idx = rng.integers(0, n, size=(d, resamples, n))
    means = np.take_along_axis(np.broadcast_to(x[:, None, :], idx.shape), idx, axis=2).mean(axis=2)
    lo, hi = np.quantile(means, [0.025, 0.975], axis=1)
    return float(np.mean((lo <= truth) & (truth <= hi)))


def test_the_vectorised_rules_are_the_floors():
    """The simulations below compute the floor's own rules: a few draws through the floor's functions agree."""
    rng = np.random.default_rng(1)
    for n in NS:
        x = rng.normal(3.0, 2.0, n)
        est = M.t_interval(list(x))
        half = D.t_quantile(0.975, n - 1) * x.std(ddof=1) / np.sqrt(n)
        assert (est.lo, est.hi) == (pytest.approx(x.mean() - half), pytest.approx(x.mean() + half))
        if n < M.BOOTSTRAP_MIN_N:
            assert M.cell(list(x)).rule == "t" and M.cell(list(x)).lo == pytest.approx(est.lo)
    x = rng.normal(0.0, 1.0, 9)
    draws = x[np.random.default_rng(0).integers(0, 9, size=(M.RESAMPLES, 9))].mean(axis=1)
    assert M.cell(list(x)).lo == pytest.approx(float(np.quantile(draws, 0.025)))


@pytest.mark.parametrize("n", NS)
def test_t_rule_covers_normal_means(n):
    x = np.random.default_rng(n).normal(10.0, 3.0, (DRAWS, n))
    cov = t_coverage(x, 10.0)
    print(f"t interval, normal data, n = {n}: {100 * cov:.1f} %")
    assert BAND[0] <= cov <= BAND[1]


def test_t_rule_under_covers_skewed_data():
    """On few skewed units the t interval under-covers (the issue measured 88 % at n = 3 exponential, 84 % for
    lognormal): printed, and held below the band so that the pages' caveat stays true."""
    rng = np.random.default_rng(7)
    for name, draw, truth in (("exponential", lambda s: rng.exponential(1.0, s), 1.0),
                              ("lognormal", lambda s: rng.lognormal(0.0, 1.0, s), float(np.exp(0.5)))):
        covs = {n: t_coverage(draw((DRAWS, n)), truth) for n in NS}
        print(f"t interval, {name} data: " + ", ".join(f"n = {n}: {100 * c:.1f} %" for n, c in covs.items()))
        assert covs[3] < BAND[0]


def test_percentile_bootstrap_coverage_is_printed():
    """The percentile bootstrap the per-sample cells keep from n = 8 on: at n = 3 (where the floor no longer uses
    it) it covers about 75 %; at 9 and 16 it covers about 90 and 92 % on normal data (measured: the interval is
    sd-with-ddof-0 narrow), below the band: printed and bounded, a finding the report carries."""
    rng = np.random.default_rng(11)
    covs = {n: bootstrap_coverage(rng.normal(0.0, 1.0, (2000, n)), 0.0, rng) for n in NS}
    print("percentile bootstrap, normal data: " + ", ".join(f"n = {n}: {100 * c:.1f} %" for n, c in covs.items()))
    assert covs[3] < 0.85 and 0.86 <= covs[9] <= 0.94 and 0.88 <= covs[16] <= 0.95


@pytest.mark.parametrize("n", NS)
def test_over_seeds_t_rule_covers_and_the_two_level_bootstrap_is_printed(n):
    """Seeds with a seed effect (sd 8: a fine-tune's seed moves its cell more than its samples' noise) and 8 samples
    each (sd 10): the t over the seeds' cells covers; the two-level bootstrap (a secondary figure) is printed (the
    issue: 78-90 % over 3 seeds) and held below the band."""
    rng = np.random.default_rng(100 + n)
    cells = 50.0 + rng.normal(0, 8.0, (DRAWS, n)) + rng.normal(0, 10.0, (DRAWS, n, 8)).mean(axis=2)
    cov = t_coverage(cells, 50.0)
    print(f"t over seeds, S = {n}: {100 * cov:.1f} %")
    assert BAND[0] <= cov <= BAND[1]
    if n == 3:
        hits = 0
        for k in range(400):
            samples = 50.0 + rng.normal(0, 8.0, (3, 1)) + rng.normal(0, 10.0, (3, 8))
            seeds = {s: [dict(enumerate(samples[s]))] for s in range(3)}
            e = M.over_seeds(seeds, resamples=500, seed=k)
            hits += e.boot_lo <= 50.0 <= e.boot_hi
        print(f"two-level bootstrap, S = 3 seeds x 8 samples: {100 * hits / 400:.1f} % (400 draws)")
        assert hits / 400 < BAND[0]


@pytest.mark.parametrize("n", NS)
def test_proportions_cover_binomial_data(n):
    """k ~ Binomial(n, p), p ~ U(0.05, 0.5): Wilson in the band; Clopper-Pearson at least nominal (conservative,
    printed)."""
    rng = np.random.default_rng(200 + n)
    p = rng.uniform(0.05, 0.5, 20_000)
    k = rng.binomial(n, p)
    for rule, lower in ((P.wilson, BAND[0]), (P.clopper_pearson, 0.95)):
        table = np.array([[rule(j, n).lo, rule(j, n).hi] for j in range(n + 1)])
        cov = float(np.mean((table[k, 0] <= p) & (p <= table[k, 1])))
        print(f"{rule(0, n).rule}, n = {n}: {100 * cov:.1f} %; 0 of {n}: [0, {100 * rule(0, n).hi:.1f}] %")
        assert cov >= lower and (rule is P.clopper_pearson or cov <= BAND[1])
        assert rule(0, n).hi > 0  # never [0, 0]


@pytest.mark.parametrize("n", (1, 3, 9, 16, 50))
def test_proportions_match_scipy(n):
    for k in range(n + 1):
        ci = scipy.stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
        w = P.wilson(k, n)
        assert (w.lo, w.hi) == (pytest.approx(ci.low, abs=1e-9), pytest.approx(ci.high, abs=1e-9))
        ci = scipy.stats.binomtest(k, n).proportion_ci(0.95, method="exact")
        c = P.clopper_pearson(k, n)
        assert (c.lo, c.hi) == (pytest.approx(ci.low, abs=1e-9), pytest.approx(ci.high, abs=1e-9))


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
    """60 t tests over 3 seeds of which 17 have p < 0.05 (docs/positions.md's shape): the family reads by q."""
    tests = {k: T.Significance("t", 0.0, p, 3) for k, p in enumerate([0.001, 0.02, 0.04, 0.3, 0.9])}
    fam = Q.family(tests)
    want = scipy.stats.false_discovery_control([0.001, 0.02, 0.04, 0.3, 0.9])
    assert [fam[k].q for k in range(5)] == pytest.approx(list(want)) and fam[0].family == 5
    assert [fam[k].resolved for k in range(5)] == [True, False, False, False, False]  # p = 0.02: q = 0.05
    assert tests[1].resolved  # alone (q = p) the same test reads resolved
    assert "q = 0.05" in fam[1].reading()

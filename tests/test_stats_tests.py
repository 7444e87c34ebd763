"""ropescale.common.stats.tests, distributions and the two-level bootstrap: the sign-flip permutation test
(hand-enumerated cases and scipy.stats.permutation_test), the MSE(P-IE vs P-IB) permutation test (hand-enumerated
nulls), the t interval over seeds (the closed form at df = 2 and scipy.stats.ttest_1samp), the block-aware t over
windows of buckets (a hand-worked case at df = 2, its size under no effect with autocorrelated buckets beside the
block sign flip's), the binomial tail (scipy.stats.binomtest), each test's unit and smallest p (the sign flips'
floors by enumerating every sign vector, zero differences among them), and the two-level bootstrap (the generator
replayed by hand, its variance against the hand-derived formula)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from ropescale.common.stats import distributions as D
from ropescale.common.stats import means as M
from ropescale.common.stats import tests as T


# ------------------------------------------------------------------------------------------------ sign flip
def test_sign_flip_by_hand():
    # d = 1, 2, 3: the 8 sign vectors give sums 6, 4, 2, 0, 0, -2, -4, -6; |sum| >= 6 in 2 of 8
    t = T.sign_flip([1.0, 2.0, 3.0])
    assert t.exact and t.n == 3 and t.statistic == pytest.approx(2.0) and t.p == pytest.approx(2 / 8)
    # d = 1, -1, 2: sums 2 (obs), 4, 0, -2, 2, -4, 0, -2 over the 8 vectors: |sum| >= 2 in 6 of 8
    assert T.sign_flip([1.0, -1.0, 2.0]).p == pytest.approx(6 / 8)
    assert T.sign_flip([0.0, 0.0]).p == 1.0  # no difference at all
    assert T.sign_flip([]).p is None


@pytest.mark.parametrize("n,shift", [(5, 0.0), (12, 0.6), (16, 0.9), (16, 0.0)])
def test_sign_flip_matches_scipy_exact(n, shift):
    x = np.random.default_rng(n).normal(shift, 1.0, n)
    ref = scipy.stats.permutation_test((x,), np.mean, permutation_type="samples", n_resamples=np.inf,
                                       alternative="two-sided").pvalue
    t = T.sign_flip(list(x))
    assert t.exact and t.p == pytest.approx(ref, abs=1e-12)


def test_sign_flip_monte_carlo_past_the_exact_size():
    x = np.random.default_rng(3).normal(0.45, 1.0, 17)
    ref = scipy.stats.permutation_test((x,), np.mean, permutation_type="samples", n_resamples=np.inf).pvalue
    t = T.sign_flip(list(x))
    assert not t.exact and t.draws == T.PERMUTATIONS
    assert abs(t.p - ref) < 4 * math.sqrt(ref * (1 - ref) / t.draws)  # the Monte Carlo error of p
    assert T.sign_flip(list(x)) == t  # deterministic
    # Phipson & Smyth: a Monte Carlo p is never 0
    assert T.sign_flip([5.0] * 30).p == pytest.approx(1 / (T.PERMUTATIONS + 1))


def test_paired_sign_flip_pairs_by_id_and_reads():
    a = {"s1": 10.0, "s2": 12.0, "s3": 15.0, "x": 1.0}
    b = {"s3": 12.0, "s1": 9.0, "s2": 10.0, "y": 4.0}
    t = T.paired_sign_flip(a, b)  # differences 1, 2, 3 whatever the order written
    assert t.n == 3 and t.p == pytest.approx(0.25) and t.extra["unpaired"] == 2
    assert t.unit == "sample" and t.min_p == 0.25  # 2 / 2^3: n = 3 units cannot give less
    assert t.reading() == (f"not resolved (interval [{t.lo:+.1f}, {t.hi:+.1f}], excludes effects below {t.lo:+.1f} "
                           f"and above {t.hi:+.1f}; p = 0.25)")
    strong = T.sign_flip([3.0, 2.5, 4.0, 3.5, 2.0, 5.0, 3.0, 4.5])  # all 8 positive: p = 2 / 256
    assert strong.p == pytest.approx(2 / 256) and strong.reading() == "resolved (p = 0.0078)"


def test_p_text():
    assert [T.p_text(p) for p in (1.0, 0.31, 0.049, 0.0078, 0.00042, None)] == ["1", "0.31", "0.049", "0.0078",
                                                                                 "0.00042", "-"]


# ------------------------------------------------------------------------------------------------ MSE
def test_mse_sign_flip_by_hand():
    # cell a: d = 1, 3 (mean 2); cell b: d = 2. MSE = (4 + 4) / 2 = 4. Null: a's mean in {2, 1, -1, -2}, b's in
    # {2, -2}: MSE* = (a^2 + 4) / 2 in {4, 2.5, 2.5, 4}, each twice: P(MSE* >= 4) = 1/2; E MSE* = 3.25
    t = T.mse_sign_flip({"a": ({0: 1.0, 1: 3.0}, {0: 0.0, 1: 0.0}), "b": ({0: 7.0}, {0: 5.0})})
    assert t.exact and t.statistic == pytest.approx(4.0) and t.p == pytest.approx(0.5)
    assert t.extra["null_mean"] == pytest.approx(3.25) and t.extra["p_red"] == 0.0  # never >= 5
    # raise b to d = 4: MSE = (4 + 16) / 2 = 10, MSE* = (a^2 + 16) / 2 in {10, 8.5}: >= 5 always, >= 10 half
    t = T.mse_sign_flip({"a": ({0: 1.0, 1: 3.0}, {0: 0.0, 1: 0.0}), "b": ({0: 4.0}, {0: 0.0})})
    assert t.p == pytest.approx(0.5) and t.extra["p_red"] == 1.0


def test_mse_sign_flip_of_one_cell_is_the_two_sided_mean_test():
    x = np.random.default_rng(5).normal(1.0, 3.0, 14)
    ie = {i: 50.0 + v for i, v in enumerate(x)}
    ib = {i: 50.0 for i in range(14)}
    t = T.mse_sign_flip({"T512": (ie, ib)})
    ref = scipy.stats.permutation_test((x,), np.mean, permutation_type="samples", n_resamples=np.inf).pvalue
    assert t.p == pytest.approx(ref, abs=1e-12)


def test_mse_sign_flip_monte_carlo_and_unpaired():
    rng = np.random.default_rng(0)
    cells = {f"T{k}": ({i: float(v) for i, v in enumerate(rng.normal(0, 5, 16))}, {i: 0.0 for i in range(16)})
             for k in range(4)}
    t = T.mse_sign_flip(cells)
    assert not t.exact and t.n == 16 and t.extra["cells"] == 4
    # the null's mean, by hand: sum over cells of sum_i d_i^2 / n^2, over 4 cells
    want = np.mean([sum(v ** 2 for v in ie.values()) / 256 for ie, _ in cells.values()])
    assert t.extra["null_mean"] == pytest.approx(want, rel=0.03)
    assert T.mse_sign_flip({"a": ({0: 1.0, 1: 2.0}, {0: 1.0})}).p is None  # a sample under one prompt only


def test_mse_red_mark_under_no_effect_at_n16():
    """A row whose samples differ between prompts by noise only (sd 10) crosses MSE >= 5 often at n = 16: the
    null's P(MSE* >= 5) matches a direct simulation of unrelated noise."""
    rng = np.random.default_rng(11)
    d = rng.normal(0, 10, (4, 16))
    cells = {k: ({i: float(v) for i, v in enumerate(d[k])}, {i: 0.0 for i in range(16)}) for k in range(4)}
    t = T.mse_sign_flip(cells)
    sims = rng.choice([-1.0, 1.0], size=(20000, 4, 16)) * d
    direct = float(np.mean((sims.mean(axis=2) ** 2).mean(axis=1) >= 5))
    assert t.extra["p_red"] == pytest.approx(direct, abs=0.02)


# ------------------------------------------------------------------------------------------------ t over seeds
def test_t_over_seeds_closed_form_at_df2():
    """df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2)), t_{.975} = 4.302653 (tables)."""
    x = [-0.032, -0.010, -0.035]
    t = T.t_over_seeds(x)
    mean = sum(x) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / 2)
    tt = abs(mean) / (sd / math.sqrt(3))
    assert t.df == 2 and t.statistic == pytest.approx(mean)
    assert t.p == pytest.approx(2 * (0.5 - tt / (2 * math.sqrt(2 + tt * tt))), rel=1e-9)
    assert (t.lo, t.hi) == (pytest.approx(mean - 4.302653 * sd / math.sqrt(3), abs=1e-6),
                            pytest.approx(mean + 4.302653 * sd / math.sqrt(3), abs=1e-6))
    assert not t.resolved and t.reading(3).startswith(f"not resolved (interval [{t.lo:+.3f}, {t.hi:+.3f}], ")
    assert t.unit == "seed" and t.min_p == 0.0 and t.extra["range"] == [-0.035, -0.010]


@pytest.mark.parametrize("x", [[1.2, 0.3, 2.5, 1.9, 0.7], [5.0, -1.0], [0.1, -0.2, 0.05, 0.3, -0.1, 0.2, 0.4],
                               [40.0, 43.0, 39.0]])
def test_t_over_seeds_matches_scipy(x):
    ref = scipy.stats.ttest_1samp(x, 0.0)
    ci = ref.confidence_interval(0.95)
    t = T.t_over_seeds(x)
    assert t.p == pytest.approx(ref.pvalue, rel=1e-9) and t.df == ref.df
    assert (t.lo, t.hi) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))


def test_t_distribution_against_scipy():
    for df in (1, 2, 3, 4, 9, 30):
        for v in (0.0, 0.4, 1.7, 3.1, 12.0):
            assert D.t_sf(v, df) == pytest.approx(scipy.stats.t.sf(v, df), rel=1e-9, abs=1e-15)
        for q in (0.6, 0.975, 0.995):
            assert D.t_quantile(q, df) == pytest.approx(scipy.stats.t.ppf(q, df), rel=1e-9)
    assert D.t_quantile(0.975, 1) == pytest.approx(12.706205, abs=1e-6)  # the table's 12.706
    assert T.t_over_seeds([3.0]).p is None


# ------------------------------------------------------------------------------------------------ buckets in windows
def test_t_over_windows_by_hand():
    """Windows' bucket differences (1, 2, 3), (2, 2, 2), (0, 1, 2, 1): means 2, 2, 1; their mean 5/3, sd = sqrt(1/3),
    se = 1/3, t = 5; at df = 2, P(T > t) = 1/2 - t / (2 sqrt(t^2 + 2)), so p = 1 - 5 / sqrt(27), and
    t_{0.975, 2} = 0.95 sqrt(2 / (4 x 0.975 x 0.025)) (the df = 2 quantile in closed form)."""
    t = T.t_over_windows([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0], [0.0, 1.0, 2.0, 1.0]])
    half = 0.95 * math.sqrt(2 / (4 * 0.975 * 0.025)) / 3
    assert t.unit == "window" and t.n == 3 and t.df == 2 and t.min_p == 0.0
    assert t.statistic == pytest.approx(5 / 3) and t.p == pytest.approx(1 - 5 / math.sqrt(27))
    assert (t.lo, t.hi) == (pytest.approx(5 / 3 - half), pytest.approx(5 / 3 + half))
    assert t.extra["buckets"] == 10 and t.extra["per_window"] == [2.0, 2.0, 1.0] and t.extra["same_sign"] == 9
    assert "buckets within window" in t.name
    one = T.t_over_windows([[1.0, 2.0], []])  # an empty window is no unit: one window, no test
    assert one.p is None and one.n == 1


def ar1_buckets(rng, rho: float, draws: int, windows: int = 3, buckets: int = 7) -> np.ndarray:
    """(draws, windows, buckets) AR(1) differences with lag-1 correlation ``rho`` and unit variance, no effect."""
    e = rng.normal(0.0, 1.0, (draws, windows, buckets))
    x = np.empty_like(e)
    x[..., 0] = e[..., 0]
    for k in range(1, buckets):
        x[..., k] = rho * x[..., k - 1] + math.sqrt(1 - rho * rho) * e[..., k]
    return x


def block_sign_flip_p(x: np.ndarray, block: int) -> np.ndarray:
    """The exact two-sided sign flip of whole blocks of ``block`` adjacent buckets within each window (the last block
    of a window shorter), vectorised over draws: p = P(|sum_b s_b S_b| >= |sum_b S_b|) over all 2^B sign vectors."""
    d, w, k = x.shape
    sums = np.stack([x[..., j:j + block].sum(axis=2) for j in range(0, k, block)], axis=2).reshape(d, -1)
    b = sums.shape[1]
    sv = 1.0 - 2.0 * ((np.arange(2 ** b)[:, None] >> np.arange(b)) & 1)
    return np.mean(np.abs(sums @ sv.T) >= np.abs(sums.sum(axis=1))[:, None] - 1e-9, axis=1)


@pytest.mark.parametrize("rho", [0.0, 0.6, 0.9])
def test_t_over_windows_holds_its_size_with_autocorrelated_buckets(rho):
    """No effect, 3 windows x 7 AR(1) buckets, 2,000 draws (a rate's Monte Carlo sd at 5 %: 0.49 %): the floor's
    test rejects at p < 0.05 in 3.5-6.5 % of draws at every correlation; the same data with the bucket as the unit
    (scipy's t over the 21 buckets) or with blocks of 3 adjacent buckets sign-flipped reject far more often once the
    buckets correlate (why the window is the block). The price, printed: with a shift of 1.5 bucket sd it finds the
    effect in about 89 / 54 / 39 % of draws at rho 0 / 0.6 / 0.9 (3 windows: df = 2)."""
    rng = np.random.default_rng(int(rho * 10) + 3)
    x = ar1_buckets(rng, rho, 2000)
    size = float(np.mean([T.t_over_windows(w).p < 0.05 for w in x.tolist()]))
    naive = float(np.mean(scipy.stats.ttest_1samp(x.reshape(2000, -1), 0.0, axis=1).pvalue < 0.05))
    blocks = float(np.mean(block_sign_flip_p(x, 3) < 0.05))
    print(f"rho {rho}: t over windows {100 * size:.1f} %, t over buckets {100 * naive:.1f} %, "
          f"blocks of 3 sign-flipped {100 * blocks:.1f} %")
    assert 0.035 <= size <= 0.065
    if rho >= 0.6:
        assert naive > 0.15 and blocks > 0.08
    power = float(np.mean([T.t_over_windows(w).p < 0.05 for w in (x[:400] + 1.5).tolist()]))
    print(f"rho {rho}: power at a shift of 1.5 sd {100 * power:.1f} % (400 draws)")
    assert power > 0.3


# ------------------------------------------------------------------------------------------------ binomial tail
def test_binomial_sf_against_scipy():
    for k, n, p in ((11, 24, 0.25), (4, 72, 0.25), (3, 10, 0.5), (0, 10, 0.125), (5, 25, 0.05), (2, 4, 0.25)):
        assert D.binomial_sf(k, n, p) == pytest.approx(scipy.stats.binomtest(k, n, p, alternative="greater").pvalue,
                                                       rel=1e-9)


# ------------------------------------------------------------------------------------------------ two-level bootstrap
def test_two_level_bootstrap_replays_the_generator_by_hand():
    seeds = {0: [{i: float(v) for i, v in enumerate([10, 20, 30, 40])}],
             1: [{i: float(v) for i, v in enumerate([50, 55, 70])}],
             2: [{i: float(v) for i, v in enumerate([0, 5, 6, 9, 12])}]}
    b, seed = 41, 3
    est = M.two_level_bootstrap(seeds, resamples=b, seed=seed)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, 3, size=(b, 3))
    vals = [np.array(list(g[0].values())) for g in seeds.values()]
    draws = np.empty((b, 3))
    for k, v in enumerate(vals):
        mask = pick == k
        m = int(mask.sum())
        draws[mask] = v[rng.integers(0, len(v), size=(m, len(v)))].mean(axis=1)
    stat = np.sort(draws.mean(axis=1))
    assert (est.lo, est.hi) == (pytest.approx(stat[1]), pytest.approx(stat[39]))
    assert est.mean == pytest.approx((25 + 175 / 3 + 6.4) / 3) and est.seeds == 3 and est.n == 12


def test_two_level_bootstrap_variance_is_between_plus_within_over_seeds():
    """Var of the two-level statistic = (1/S) [ (1/S) sum_s (m_s - m)^2 + (1/S) sum_s v_s / n_s ], v_s the plug-in
    (ddof 0) variance of seed s's samples: the law of total variance over (seed drawn, samples drawn)."""
    rng = np.random.default_rng(2)
    raw = [rng.normal(mu, 4.0, 16) for mu in (40.0, 43.0, 37.0)]
    est = M.two_level_bootstrap({k: [dict(enumerate(v))] for k, v in enumerate(raw)}, resamples=40000)
    m = np.array([v.mean() for v in raw])
    within = np.array([v.var() / len(v) for v in raw])
    want = ((m - m.mean()) ** 2).mean() / 3 + within.mean() / 3
    assert est.se ** 2 == pytest.approx(want, rel=0.03)
    one = M.cell(list(np.concatenate(raw)))  # samples alone: narrower, the seeds' spread left out
    assert (est.hi - est.lo) > 1.3 * (one.hi - one.lo)


def test_two_level_bootstrap_groups_and_weights():
    """Two prompts per seed (a sample's prompts move together) and a paired difference of two rows."""
    a_ie = {0: 80.0, 1: 90.0, 2: 70.0}
    a_ib = {0: 82.0, 1: 88.0, 2: 75.0}
    b_ie = {0: 60.0, 1: 65.0, 2: 50.0}
    b_ib = {0: 58.0, 1: 70.0, 2: 55.0}
    seeds = {0: [a_ie, a_ib, b_ie, b_ib], 1: [{k: v + 3 for k, v in g.items()} for g in (a_ie, a_ib, b_ie, b_ib)]}
    est = M.two_level_bootstrap(seeds, weights=[0.5, 0.5, -0.5, -0.5])
    assert est.mean == pytest.approx((80 + 82 + 90 + 88 + 70 + 75) / 6 - (60 + 58 + 65 + 70 + 50 + 55) / 6)
    assert est.lo > 0  # every sample of A is above its B partner: every resample is
    cell = M.two_level_bootstrap({0: [a_ie, a_ib]})
    assert cell.lo is None and cell.mean == pytest.approx(M.cell_of_prompts([a_ie, a_ib]).mean)
    with pytest.raises(ValueError):
        M.two_level_bootstrap({0: [a_ie], 1: [a_ie, a_ib]})


def test_betainc_symmetry_and_values():
    for a, b, x in itertools.product((0.5, 1.0, 2.5), (0.5, 3.0), (0.05, 0.5, 0.93)):
        assert D.betainc(a, b, x) == pytest.approx(scipy.special.betainc(a, b, x), rel=1e-10)
        assert D.betainc(a, b, x) == pytest.approx(1 - D.betainc(b, a, 1 - x), rel=1e-10)
    assert D.betainc(1.0, 1.0, 0.3) == pytest.approx(0.3)  # the uniform's CDF


def test_each_test_names_its_unit_and_smallest_p():
    # a sign-flip over n units cannot go below 2 / 2^n (the observed signs and their mirror); Monte Carlo: 1/(B+1)
    assert T.sign_flip([1.0, 2.0, 3.0], unit="window").min_p == 0.25
    assert T.sign_flip([1.0, 2.0, 3.0], unit="window").unit == "window"
    assert T.sign_flip([5.0] * 30).min_p == pytest.approx(1 / (T.PERMUTATIONS + 1))
    # the MSE null over 2 cells of 2 and 1 samples: 8 sign vectors, a cell's mirror keeps its square: 2^2 / 2^3
    t = T.mse_sign_flip({"a": ({0: 1.0, 1: 3.0}, {0: 0.0, 1: 0.0}), "b": ({0: 7.0}, {0: 5.0})})
    assert t.min_p == 0.5 and t.p >= t.min_p
    assert T.t_over_seeds([1.0, 2.0, 4.0]).unit == "seed" and T.t_over_seeds([1.0, 2.0, 4.0]).min_p == 0.0


def test_a_reading_resolves_at_q_and_states_what_no_effect_excludes():
    t = T.Significance("t", -5.0, 0.071, 3, lo=-10.9, hi=1.0)
    assert not t.resolved
    assert t.reading() == ("not resolved (interval [-10.9, +1.0], excludes effects below -10.9 and above +1.0; "
                           "p = 0.071)")
    lone = T.Significance("t", 2.0, 0.014, 3, lo=0.5, hi=3.5)
    assert lone.resolved and lone.reading() == "resolved (p = 0.014)"
    in_family = lone.with_q(0.092, 60)
    assert not in_family.resolved and in_family.family == 60 and "q = 0.092" in in_family.reading()


def test_over_seeds_is_the_t_interval_over_the_seeds_cells():
    rng = np.random.default_rng(4)
    seeds = {s: [dict(enumerate(rng.normal(50 + 5 * s, 10, 12))), dict(enumerate(rng.normal(48, 10, 12)))]
             for s in range(3)}
    cells = [np.mean([np.mean(list(g.values())) for g in groups]) for groups in seeds.values()]
    est = M.over_seeds(seeds)
    lo, hi = scipy.stats.t.interval(0.95, 2, loc=np.mean(cells), scale=scipy.stats.sem(cells))
    assert est.rule == "t" and est.unit == "seed" and est.seeds == 3 and est.n == 36  # samples of all seeds
    assert (est.lo, est.hi) == (pytest.approx(lo), pytest.approx(hi))
    assert est.spread == (pytest.approx(min(cells)), pytest.approx(max(cells)))
    boot = M.two_level_bootstrap(seeds)
    assert (est.boot_lo, est.boot_hi) == (boot.lo, boot.hi)  # the two-level interval beside it, secondary


def enumerated_sign_flip_p(d: list) -> float:
    """The two-sided sign-flip p written out: every one of the 2^n sign vectors, |mean(s d)| >= |mean(d)|."""
    obs = abs(sum(d)) / len(d)
    vecs = list(itertools.product((1.0, -1.0), repeat=len(d)))
    return sum(abs(sum(s * x for s, x in zip(v, d))) / len(d) >= obs - 1e-12 for v in vecs) / len(vecs)


def enumerated_mse_p(cells: list) -> float:
    """The MSE sign-flip p written out: every sign vector over all the cells' differences, P(MSE* >= MSE)."""
    sizes = [len(c) for c in cells]
    flat = [x for c in cells for x in c]

    def mse(v):
        out, k = 0.0, 0
        for m in sizes:
            out += (sum(s * x for s, x in zip(v[k:k + m], flat[k:k + m])) / m) ** 2
            k += m
        return out / len(sizes)

    obs = mse([1.0] * len(flat))
    vecs = list(itertools.product((1.0, -1.0), repeat=len(flat)))
    return sum(mse(v) >= obs - 1e-12 for v in vecs) / len(vecs)


@pytest.mark.parametrize("d", [[0.0] * 3 + [1.0, 2.0], [0.0, 1.5, 0.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0],
                               [1.0, 2.0, 3.0, 0.5]])
def test_sign_flip_floor_counts_the_nonzero_differences(d):
    """A zero difference has no sign to flip: the floor is 2 / 2^(nonzero), and data whose nonzero differences share
    one sign reach it (every sign vector enumerated)."""
    t = T.sign_flip(d)
    assert t.p == pytest.approx(enumerated_sign_flip_p(d)) and t.p == pytest.approx(t.min_p)
    assert t.min_p == pytest.approx(min(1.0, 2.0 / 2 ** sum(x != 0 for x in d)))
    mixed = [x * (-1) ** k for k, x in enumerate(d)]  # other data, same zeros: never below the floor
    assert T.sign_flip(mixed).p >= t.min_p - 1e-12


def test_sign_flip_floor_of_the_review_case():
    """14 zero differences and 1, 2: p = 0.5 (the two nonzero signs, and their mirror), so the floor is 0.5, not
    2 / 2^16; all zeros: 1; past the exact size, Monte Carlo's floor is still the exact floor where larger."""
    t = T.sign_flip([0.0] * 14 + [1.0, 2.0])
    assert t.exact and t.p == pytest.approx(0.5) and t.min_p == pytest.approx(0.5)
    assert T.sign_flip([0.0] * 5).min_p == 1.0
    mc = T.sign_flip([0.0] * 28 + [1.0, 2.0])
    assert not mc.exact and mc.min_p == pytest.approx(0.5) and mc.p >= 0.45


@pytest.mark.parametrize("cells", [[[1.0, 3.0], [2.0]], [[1.0, 0.0, 2.0], [0.0, 0.0], [3.0]],
                                   [[0.0, 2.0, 0.0], [1.0, 1.0, 0.0, 4.0]], [[0.0, 0.0, 0.0], [5.0, 0.0]]])
def test_mse_sign_flip_floor_counts_the_nonzero_differences(cells):
    """The MSE null, every sign vector enumerated: with one-sign differences in every cell the p is the floor
    2^C / 2^N over the N nonzero differences of the C cells that have one (a zero's flip changes nothing)."""
    row = {f"c{k}": ({i: float(x) for i, x in enumerate(c)}, {i: 0.0 for i in range(len(c))})
           for k, c in enumerate(cells)}
    t = T.mse_sign_flip(row)
    nz = [sum(x != 0 for x in c) for c in cells]
    assert t.exact and t.p == pytest.approx(enumerated_mse_p(cells))
    assert t.min_p == pytest.approx(2.0 ** (sum(k > 0 for k in nz) - sum(nz))) and t.p == pytest.approx(t.min_p)


def test_t_over_seeds_with_no_spread_is_no_test():
    """Two seeds with one nonzero difference: no spread measured, never p = 0 (scipy's ttest_1samp reads t = inf, p =
    0 there: two agreeing seeds are not a resolved effect); all zeros: no difference, p = 1; the family's q leaves
    the untested one out."""
    from ropescale.common.stats.multiplicity import family

    t = T.t_over_seeds([2.0, 2.0])
    assert t.p is None and t.lo is None and t.hi is None and t.statistic == 2.0 and t.df == 1
    assert not t.resolved and t.reading() == "no test (no spread measured)"
    zero = T.t_over_seeds([0.0, 0.0, 0.0])
    assert zero.p == 1.0 and not zero.resolved
    fam = family({"same": t, "other": T.t_over_seeds([1.0, 3.0])})
    assert fam["same"].q is None and fam["other"].family == 1
    assert fam["other"].q == pytest.approx(scipy.stats.ttest_1samp([1.0, 3.0], 0.0).pvalue)

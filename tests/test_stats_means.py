"""ropescale.common.stats (means, mse, lengths): a cell's t interval at every n and over few units, the paired IE - IB
interval (scipy's one-sample and paired t intervals), the MSE(P-IE vs P-IB) noise floor (against a simulated null)
and its bootstrap interval (the generator's draws replayed by hand), effective context length (RULER's and NoLiMa's
published tables, hand-made tables with gaps and missing cells) and short-context retention."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from ropescale.common.stats import lengths as L
from ropescale.common.stats import means as M
from ropescale.common.stats import mse as MS
from ropescale.common.stats import resampling as R


# ------------------------------------------------------------------------------------------------ a cell
@pytest.mark.parametrize("n", [2, 3, 4, 7, 8, 9, 16, 50])
def test_cell_is_the_t_interval_at_every_n(n):
    """One rule at every n (the percentile bootstrap covered 90 % at n = 9: tests/test_stats_coverage.py): scipy's
    one-sample t interval."""
    x = list(np.random.default_rng(n).uniform(0, 100, n))
    est = M.cell(x)
    ci = scipy.stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    assert est.rule == "t" and est.unit == "sample" and est.n == n
    assert (est.lo, est.hi) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))
    assert est.se == pytest.approx(scipy.stats.sem(x)) and est.mean == pytest.approx(float(np.mean(x)))


def test_cell_by_hand():
    """x = 40, 0, 10, 40, 40, 0, 10, 10: mean 18.75, squares about it 3 x 21.25^2 + 2 x 18.75^2 + 3 x 8.75^2 =
    2287.5, se = sqrt(2287.5 / 7 / 8); t_{0.975, 7} = 2.364624 (a t table)."""
    est = M.cell([40.0, 0.0, 10.0, 40.0, 40.0, 0.0, 10.0, 10.0])
    se = math.sqrt(2287.5 / 7 / 8)
    assert est.mean == 18.75 and est.se == pytest.approx(se)
    assert (est.lo, est.hi) == (pytest.approx(18.75 - 2.364624 * se, abs=1e-5),
                                pytest.approx(18.75 + 2.364624 * se, abs=1e-5))


def test_t_interval_of_few_units_shows_their_range():
    x = [12.0, 15.5, 9.0]
    est = M.t_interval(x, unit="window")
    lo, hi = scipy.stats.t.interval(0.95, 2, loc=np.mean(x), scale=scipy.stats.sem(x))
    assert (est.lo, est.hi) == (pytest.approx(lo), pytest.approx(hi)) and est.spread == (9.0, 15.5)
    assert est.unit == "window" and est.text() == f"12.2 [{lo:.1f}, {hi:.1f}] (9.0-15.5)"
    assert M.t_interval([4.0]).lo is None and M.t_interval([]).mean is None


def test_cell_draws_nothing():
    """The t rule resamples nothing: ``resamples`` and ``seed`` (kept for the callers) leave the cell unchanged."""
    x = [12.0, 40.5, 3.0, 77.0, 55.5, 20.0, 8.0, 61.0, 33.0, 90.0, 47.0, 15.5, 70.0, 26.0, 5.0, 58.0]
    assert M.cell(x, resamples=41, seed=7) == M.cell(x, resamples=2000, seed=0) == M.cell(x)


def test_cell_small_and_empty():
    assert M.cell([42.0]) == M.Estimate(42.0, 1)  # a scores-CSV cell: a mean, no interval
    assert M.cell([]).mean is None and M.cell([]).text() == "-"
    assert M.cell([42.0]).text() == "42.0"
    assert M.Estimate(45.0, 16, 3.0, 38.24, 51.96).text() == "45.0 [38.2, 52.0]"
    with pytest.raises(ValueError, match="not a finite number"):
        M.cell([1.0, float("nan")])


def test_cell_of_prompts_is_the_mean_of_prompt_means_and_pairs_by_id():
    ie = {"a": 10.0, "b": 20.0, "c": 60.0}
    ib = {"a": 20.0, "b": 40.0}
    est = M.cell_of_prompts([ie, ib], resamples=500)
    assert est.mean == pytest.approx((30.0 + 30.0) / 2) and est.n == 3  # ids a, b, c: n counts samples, not scores
    # var(mean_ie/2 + mean_ib/2) = (s_ie^2/3 + s_ib^2/2 + 2 * 2 * s_ie,ib / (3 * 2)) / 4, by hand:
    # s_ie^2 = (400 + 100 + 900) / 2 = 700; s_ib^2 = (100 + 100) / 1 = 200; s_ie,ib over a, b = (-5)(-10)*2 / 1 = 100
    assert est.se == pytest.approx(math.sqrt((700 / 3 + 200 / 2 + 4 * 100 / 6) / 4))
    assert est.lo <= est.mean <= est.hi
    # plain sequences do not pair by position: var = (s_ie^2 / 3 + s_ib^2 / 2) / 4
    seqs = M.cell_of_prompts([list(ie.values()), list(ib.values())], resamples=500)
    assert seqs.mean == est.mean and seqs.se == pytest.approx(math.sqrt((700 / 3 + 200 / 2) / 4))


# ------------------------------------------------------------------------------------------------ IE - IB
def test_paired_difference_is_the_t_interval_of_per_id_differences():
    rng = np.random.default_rng(3)
    base = rng.uniform(10, 90, 16)
    ids = [f"s{i}" for i in range(16)]
    ie = {i: float(v + rng.normal(4, 3)) for i, v in zip(ids, base)}
    ib = {i: float(v) for i, v in zip(ids, base)}
    d = [ie[i] - ib[i] for i in ids]
    diff = M.ie_minus_ib(ie, ib)
    ci = scipy.stats.ttest_rel([ie[i] for i in ids], [ib[i] for i in ids]).confidence_interval(0.95)
    assert diff.paired and diff.n_pairs == 16 and diff.n == 16 and diff.rule == "t"
    assert diff.mean == pytest.approx(float(np.mean(d)))
    assert (diff.lo, diff.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert diff.se == pytest.approx(float(np.std(d, ddof=1)) / 4)
    assert diff.excludes(0.0)  # a +4 shift with noise 3 at n = 16
    # the insertion order of either prompt does not matter (pairs are by id)
    assert M.ie_minus_ib(ie, dict(reversed(list(ib.items())))) == diff
    assert M.ie_minus_ib(dict(reversed(list(ie.items()))), ib) == diff
    shuffled = [dict(sorted(g.items(), key=lambda kv: kv[1])) for g in (ie, ib)]
    assert M.cell_of_prompts(shuffled) == M.cell_of_prompts([ie, ib])
    # the unpaired interval is far wider: the sample-to-sample spread cancels in pairs
    unpaired = M.ie_minus_ib(ie, {f"x{k}": v for k, v in ib.items()})
    assert not unpaired.paired and unpaired.n_pairs == 0
    assert unpaired.hi - unpaired.lo > 4 * (diff.hi - diff.lo)


def test_unpaired_difference_takes_the_smaller_groups_df():
    """No id in both: se^2 = s_a^2 / n_a + s_b^2 / n_b (Welch's se) with df = min(n_a, n_b) - 1, at most Welch's df
    (scipy's ttest_ind(equal_var=False)), so the interval is no narrower than Welch's."""
    a = {f"a{k}": v for k, v in enumerate([50.0, 41.0, 62.0, 55.0, 48.0, 70.0])}
    b = {f"b{k}": v for k, v in enumerate([30.0, 52.0, 38.0, 44.0])}
    diff = M.ie_minus_ib(a, b)
    se = math.sqrt(np.var(list(a.values()), ddof=1) / 6 + np.var(list(b.values()), ddof=1) / 4)
    half = scipy.stats.t.ppf(0.975, 3) * se
    assert diff.se == pytest.approx(se) and (diff.lo, diff.hi) == (pytest.approx(diff.mean - half),
                                                                   pytest.approx(diff.mean + half))
    welch = scipy.stats.ttest_ind(list(a.values()), list(b.values()), equal_var=False).confidence_interval(0.95)
    assert diff.lo <= welch.low and welch.high <= diff.hi


def test_cell_of_two_paired_prompts_is_the_t_interval_of_per_id_means():
    ie = {k: float(v) for k, v in enumerate([30.0, 45.0, 12.0, 60.0, 51.0, 22.0, 40.0, 35.0, 18.0])}
    ib = {k: float(v) for k, v in enumerate([28.0, 50.0, 20.0, 55.0, 40.0, 30.0, 38.0, 41.0, 10.0])}
    est = M.cell_of_prompts([ie, ib])
    ci = scipy.stats.ttest_1samp([(ie[k] + ib[k]) / 2 for k in ie], 0.0).confidence_interval(0.95)
    assert est.n == 9 and (est.lo, est.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))


def test_unpaired_ids_are_reported_not_dropped():
    ie = {"a": 50.0, "b": 40.0, "c": 30.0, "x": 90.0}
    ib = {"a": 45.0, "b": 42.0, "c": 20.0, "y": 0.0}
    diff = M.ie_minus_ib(ie, ib, resamples=500)
    assert diff.unpaired_ie == ("x",) and diff.unpaired_ib == ("y",) and diff.n_pairs == 3 and not diff.paired
    assert diff.mean == pytest.approx(210 / 4 - 107 / 4)  # each prompt's mean over all its samples
    assert diff.to_dict()["unpaired_ie"] == ["x"]
    one_side = M.ie_minus_ib(ie, {})
    assert one_side.mean is None and one_side.unpaired_ie == ("a", "b", "c", "x")


def test_variance_of_a_difference_by_hand():
    ie = {"a": 10.0, "b": 20.0, "c": 60.0}
    ib = {"a": 20.0, "b": 40.0, "c": 30.0}
    # every id pairs: s_d^2 / n with d = -10, -20, 30 (mean 0): (100 + 400 + 900) / 2 / 3
    assert R.var_of_combination([ie, ib], [1, -1]) == pytest.approx(1400 / 2 / 3)
    # none pairs: se_ie^2 + se_ib^2; deviations from the means (30 and 30): -20, -10, 30 and -10, 10, 0
    ib2 = {k + "'": v for k, v in ib.items()}
    assert R.var_of_combination([ie, ib2], [1, -1]) == pytest.approx(1400 / 2 / 3 + 200 / 2 / 3)


# ------------------------------------------------------------------------------------------------ MSE and floor
def test_mse_and_floor_by_hand():
    cells = {"T512": ({1: 10.0, 2: 20.0, 3: 30.0}, {1: 8.0, 2: 14.0, 3: 29.0}),  # d = 2, 6, 1
             "T1024": ({1: 50.0, 2: 40.0}, {1: 45.0, 2: 41.0})}  # d = 5, -1
    m = MS.mse_with_floor(cells, resamples=1000)
    assert m.mse == pytest.approx((3 ** 2 + 2 ** 2) / 2)  # mean d per cell: 3 and 2
    assert m.mse == pytest.approx(MS.mse_ie_ib({"T512": 20.0, "T1024": 45.0}, {"T512": 17.0, "T1024": 43.0}))
    # floor = mean of s_d^2 / n: (7 / 3 + 18 / 2) / 2
    assert m.floor == pytest.approx((7 / 3 + 9) / 2) == MS.mse_noise_floor(cells)
    assert m.cells == 2 and m.lo <= m.hi
    assert MS.mse_with_floor(cells, resamples=1000) == m


def test_mse_interval_replays_the_generator_by_hand():
    cells = {"T512": ({1: 10.0, 2: 20.0, 3: 30.0}, {1: 8.0, 2: 14.0, 3: 29.0}),  # d = 2, 6, 1
             "T1024": ({1: 50.0, 2: 40.0}, {1: 45.0, 2: 41.0})}  # d = 5, -1
    rng = np.random.default_rng(9)  # one generator, the cells in order; a pair (an id) is resampled as one
    d1 = np.array([2.0, 6.0, 1.0])[rng.integers(0, 3, size=(41, 3))].mean(axis=1)
    d2 = np.array([5.0, -1.0])[rng.integers(0, 2, size=(41, 2))].mean(axis=1)
    mse = np.sort((d1 ** 2 + d2 ** 2) / 2)
    m = MS.mse_with_floor(cells, resamples=41, seed=9)
    assert (m.lo, m.hi) == (pytest.approx(mse[1]), pytest.approx(mse[39]))


def test_mse_interval_exact_enumeration():
    ie = {1: 10.0, 2: 30.0, 3: 45.0, 4: 100.0}
    ib = {1: 10.0, 2: 20.0, 3: 5.0, 4: 0.0}  # d = 0, 10, 40, 100: MSE* = (mean d*)^2, a monotone map of mean d* >= 0
    m = MS.mse_with_floor({"T512": (ie, ib)}, resamples=40_000)
    assert (m.lo, m.hi) == (pytest.approx(5.0 ** 2), pytest.approx(77.5 ** 2))


def test_mse_missing_prompt_and_single_samples():
    assert MS.mse_with_floor({"T512": ({1: 1.0, 2: 2.0}, {})}) == MS.MSE(None, None)
    one = MS.mse_with_floor({"L": ({"m": 20.0}, {"m": 16.0})})  # a scores-CSV row: the MSE, no floor, no interval
    assert one.mse == pytest.approx(16.0) and one.floor is None and one.lo is None


@pytest.mark.parametrize("pairs, only_ie, only_ib", [(16, 0, 0), (12, 4, 4), (0, 16, 16)])
def test_floor_is_the_mean_mse_under_a_simulated_null(pairs, only_ie, only_ib):
    """No prompt effect: per cell, IE and IB scores of a sample are correlated (rho 0.7) with the same mean. The
    mean MSE over many seeded draws equals the true floor, and so does the mean estimated floor (unbiased)."""
    rng = np.random.default_rng(11)
    sds = [(20.0, 25.0), (15.0, 15.0), (30.0, 22.0), (10.0, 18.0)]  # (sd IE, sd IB) per cell
    rho, draws = 0.7, 4000
    n_ie, n_ib = pairs + only_ie, pairs + only_ib
    true_var = [a * a / n_ie + b * b / n_ib - 2 * pairs * rho * a * b / (n_ie * n_ib) for a, b in sds]
    floor = float(np.mean(true_var))
    mse = np.zeros(draws)
    est_floor = []
    for c, (a, b) in enumerate(sds):
        mu = 40.0 + 5 * c
        z = rng.normal(size=(draws, pairs + only_ie + only_ib, 2))
        ie = mu + a * z[:, : n_ie, 0]
        ib_pairs = mu + b * (rho * z[:, :pairs, 0] + math.sqrt(1 - rho * rho) * z[:, :pairs, 1])
        ib = np.concatenate([ib_pairs, mu + b * z[:, n_ie:, 1]], axis=1)
        mse += (ie.mean(axis=1) - ib.mean(axis=1)) ** 2 / len(sds)
    # the MSE's expectation under the null is the floor: 4000 draws of a mean of 4 scaled chi^2_1 -> ~1.2 % s.e.
    assert mse.mean() == pytest.approx(floor, rel=0.06)
    # the estimated floor, from the samples of each draw (300 draws), is unbiased for it
    ids_ie = list(range(n_ie))
    ids_ib = list(range(pairs)) + [f"b{k}" for k in range(only_ib)]
    for r in range(300):
        cells = {}
        for c, (a, b) in enumerate(sds):
            rng_c = np.random.default_rng(1000 * r + c)
            z = rng_c.normal(size=(n_ie + only_ib, 2))
            ie = 40 + a * z[:n_ie, 0]
            ib = np.concatenate([40 + b * (rho * z[:pairs, 0] + math.sqrt(1 - rho * rho) * z[:pairs, 1]),
                                 40 + b * z[n_ie:, 1]])
            cells[f"c{c}"] = (dict(zip(ids_ie, ie)), dict(zip(ids_ib, ib)))
        est_floor.append(MS.mse_noise_floor(cells))
    assert float(np.mean(est_floor)) == pytest.approx(floor, rel=0.06)


# ------------------------------------------------------------------------------------------------ effective length
RULER_COLS = ["4K", "8K", "16K", "32K", "64K", "128K"]
RULER_THRESHOLD = 85.6  # Llama-2-7B at 4K


@pytest.mark.parametrize("scores, published", [
    ([96.7, 96.6, 96.4, 96.0, 95.4, 95.1], ">128K"),  # Jamba-1.5-large
    ([96.5, 95.8, 95.4, 94.8, 88.4, 66.6], "64K"),  # Llama3.1 (70B)
    ([93.6, 91.2, 87.2, 75.4, 49.0, 13.8], "16K"),  # Mistral (7B)
    ([87.8, 83.4, 78.6, 69.9, 56.0, 42.0], "4K"),  # GLM3 (6B)
    ([82.3, 78.4, 73.7, 69.1, 68.1, 65.0], "<4K"),  # LWM (7B)
    ([98.4, 96.0, 96.2, 94.4, 91.8, 85.6], ">128K"),  # Qwen3-32B: 85.6 at 128K equals the threshold and counts
])
def test_effective_length_reproduces_ruler_table(scores, published):
    """github.com/NVIDIA/RULER README, main results: the 'Effective Length' column from the per-length scores."""
    eff = L.effective_length(dict(zip(RULER_COLS, scores)), RULER_THRESHOLD)
    assert eff.text() == published and eff.rule == "absolute"


NOLIMA_COLS = ["1K", "2K", "4K", "8K", "16K", "32K"]


@pytest.mark.parametrize("base, scores, published", [
    (99.3, [98.1, 98.0, 95.7, 89.2, 81.6, 69.7], "8K"),  # GPT-4o
    (97.3, [94.2, 87.4, 81.5, 72.1, 59.5, 42.7], "2K"),  # Llama 3.3 70B
    (89.4, [87.7, 87.5, 77.9, 64.7, 48.2, 41.0], "4K"),  # Gemini Flash 2.0
    (87.4, [74.7, 61.8, 39.9, 27.4, 16.8, 7.3], "1K"),  # Gemma 3 12B
    (92.4, [76.3, 74.1, 70.8, 62.2, 52.7, 43.6], "<1K"),  # Jamba 1.5 Mini
])
def test_effective_length_reproduces_nolima_table(base, scores, published):
    """github.com/adobe-research/NoLiMa README, results: 'Effective Length' = the longest context keeping >= 85 %
    of the base score (measured at 250-1K tokens, given here)."""
    eff = L.effective_length_relative(dict(zip(NOLIMA_COLS, scores)), base=base)
    assert eff.text() == published and eff.threshold == pytest.approx(0.85 * base)


COLS = ["T512", "T1024", "T2048", "T4096"]


def test_relative_effective_length_uses_the_rows_own_1x():
    row = {"T512": 40.0, "T1024": 34.0, "T2048": 30.0, "T4096": 10.0}  # threshold 0.85 * 40 = 34: T1024 holds
    eff = L.effective_length_relative(row)
    assert (eff.length, eff.stop, eff.stopped_at, eff.threshold) == ("T1024", "fail", "T2048", pytest.approx(34.0))
    assert L.effective_length(row, 25.0).text() == "T2048"
    assert L.effective_length(row, 5.0).text() == ">T4096"
    assert L.effective_length(row, 50.0).text() == "<T512"


def test_effective_length_gap_is_not_counted_but_listed():
    row = {"T512": 40.0, "T1024": 20.0, "T2048": 38.0, "T4096": 5.0}  # below at 2x, above again at 4x
    eff = L.effective_length_relative(row)
    assert eff.text() == "T512" and eff.later_passes == ("T2048",)
    assert eff.to_dict()["later_passes"] == ["T2048"]


@pytest.mark.parametrize("missing", [None, float("nan"), "absent"])
def test_effective_length_stops_at_a_missing_cell(missing):
    row = {"T512": 40.0, "T1024": 39.0, "T2048": missing, "T4096": 38.0}
    if missing == "absent":
        del row["T2048"]
    eff = L.effective_length_relative(row, columns=COLS)
    assert (eff.length, eff.stop, eff.stopped_at) == ("T1024", "missing", "T2048")
    assert eff.text() == "T1024 (T2048 missing)" and eff.later_passes == ("T4096",)


def test_effective_length_undefined_without_a_reference():
    for first in (None, float("nan"), 0.0):
        eff = L.effective_length_relative({"T512": first, "T1024": 30.0})
        assert eff.threshold is None and eff.text() == "-" and eff.length is None
    assert L.effective_length({}, 50.0).text() == "-"
    assert L.effective_length({"T512": 60.0}, None).stop == "undefined"
    missing_first = L.effective_length({"T512": None, "T1024": 60.0}, 50.0)
    assert missing_first.text() == "- (T512 missing)" and missing_first.later_passes == ("T1024",)


def test_effective_length_marks_decisions_inside_the_noise():
    row = {"T512": 40.0, "T1024": 35.0, "T2048": 20.0, "T4096": 36.0}
    ivs = {"T512": (30.0, 50.0), "T1024": (28.0, 42.0), "T2048": (12.0, 28.0), "T4096": (30.0, 41.0)}
    eff = L.effective_length_relative(row, intervals=ivs)  # threshold 34
    assert eff.text() == "T1024" and eff.straddles == ("T512", "T1024")  # T4096 is past the stop


def test_retention():
    assert L.retention(45.0, 50.0) == pytest.approx(0.9)
    assert L.retention(None, 50.0) is None and L.retention(45.0, None) is None
    assert L.retention(45.0, 0.0) is None and L.retention(float("nan"), 50.0) is None

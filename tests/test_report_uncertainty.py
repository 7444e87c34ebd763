"""The uncertainty through the report stack (issue 31): run directories -> make_report -> JSON / markdown. The
intervals are checked against scipy's t intervals of the per-id values (not through ``ropescale.common.stats``; the
floor's rule at every n), the effective context length and retention against hand-made tables."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.stats
from test_report import HALF, REF, make_run

from ropescale.common.io import InputError
from ropescale.evaluation.report.cli import make_report

RESAMPLES = 400  # passed through; the t rule draws nothing
# ROUGE-L (x100) of each prediction against REF (hand-derived in test_report): REF 100, "alpha beta" HALF, "" 0
SCORE = {REF: 100.0, "alpha beta": HALF, "": 0.0}


def _run(root, name, preds, **kw):
    return make_run(root, name, samples=[(p, REF, 100) for p in preds], **kw)


def _t_interval(values):
    """scipy's one-sample t interval of the per-id values (the floor's rule for a mean at every n)."""
    ci = scipy.stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    return [ci.low, ci.high]


def test_cell_and_ie_minus_ib_intervals_are_the_paired_t_intervals(tmp_path):
    data = tmp_path / "set.jsonl"
    data.write_text("{}\n", encoding="utf-8")  # only its path matters: the pairing key of both prompts' runs
    ie = [REF, "alpha beta", "", REF, REF, "", "alpha beta", REF]
    ib = [REF, "", "", "alpha beta", REF, "alpha beta", REF, ""]
    _run(tmp_path / "runs", "ie", ie, prompt="ie", subset="T512", data=data)
    _run(tmp_path / "runs", "ib", ib, prompt="ib", subset="T512", data=data)
    x, y = [SCORE[p] for p in ie], [SCORE[p] for p in ib]
    ex = json.loads(make_report([tmp_path / "runs"], fmt="json", view="extrapolation", resamples=RESAMPLES,
                                save_scores=False))
    row = ex["rows"][0]
    assert row["cells"]["T512"] == pytest.approx(round((np.mean(x) + np.mean(y)) / 2, 4))
    assert row["n"] == {"T512": 8}  # 8 eval samples, each under both prompts
    assert row["ci"]["T512"] == pytest.approx(_t_interval((np.array(x) + np.array(y)) / 2), abs=1e-4)
    t2 = json.loads(make_report([tmp_path / "runs"], fmt="json", view="table2", resamples=RESAMPLES,
                                save_scores=False))
    d = next(iter(t2.values()))["ie_minus_ib"]["T512"]
    assert d["mean"] == pytest.approx(round(np.mean(x) - np.mean(y), 4)) and d["n_pairs"] == 8
    assert d["ci"] == pytest.approx(_t_interval(np.array(x) - np.array(y)), abs=1e-4)
    assert d["unpaired_ie"] == [] and d["unpaired_ib"] == []
    # the noise floor of one cell: the squared paired standard error of the per-id differences, s_d^2 / n
    diffs = np.array(x) - np.array(y)
    assert next(iter(t2.values()))["mse_floor"] == pytest.approx(round(np.var(diffs, ddof=1) / len(diffs), 4))


def test_a_cell_below_eight_samples_has_the_t_interval(tmp_path):
    import scipy.stats

    data = tmp_path / "set.jsonl"
    data.write_text("{}\n", encoding="utf-8")
    ie, ib = [REF, "alpha beta", "", REF], [REF, "", "alpha beta", "alpha beta"]
    _run(tmp_path / "runs", "ie", ie, prompt="ie", subset="T512", data=data)
    _run(tmp_path / "runs", "ib", ib, prompt="ib", subset="T512", data=data)
    per_id = [(SCORE[a] + SCORE[b]) / 2 for a, b in zip(ie, ib)]  # paired: the t interval of the per-id means
    lo, hi = scipy.stats.t.interval(0.95, 3, loc=np.mean(per_id), scale=scipy.stats.sem(per_id))
    ex = json.loads(make_report([tmp_path / "runs"], fmt="json", view="extrapolation", save_scores=False))
    assert ex["rows"][0]["ci"]["T512"] == pytest.approx([lo, hi], abs=1e-4)


def _rows(js):
    return {r["rope_label"]: r for r in js["rows"]}


def test_effective_length_and_retention_on_hand_made_tables(tmp_path):
    root = tmp_path / "runs"
    ntk = {"method": "ntk", "scale": 8.0, "orig_ctx": 512}
    table = {  # rope: {column: predictions} -> base 100 / 94.4 / 50; ntk 66.7 / 33.3 / 83.3
        None: {"T512": [REF, REF], "T1024": [REF] * 5 + ["alpha beta"], "T2048": [REF, ""]},
        "ntk": {"T512": ["alpha beta"] * 2, "T1024": ["alpha beta", ""], "T2048": [REF, "alpha beta"]},
    }
    for rope, cols in table.items():
        for col, preds in cols.items():
            _run(root, f"{rope}-{col}", preds, rope=ntk if rope else None, subset=col)
    js = json.loads(make_report([root], fmt="json", view="extrapolation", effective_threshold=95,
                                resamples=50, save_scores=False))
    base, scaled = _rows(js)["none"], _rows(js)["ntk x8"]
    # base: 85 % of 100 = 85; T1024 (94.4) keeps it, T2048 (50) does not; >= 95 holds at T512 only
    assert base["effective_length"]["relative"]["length"] == "T1024"
    assert base["effective_length"]["relative"]["stopped_at"] == "T2048"
    assert base["effective_length"]["absolute"]["length"] == "T512"
    assert base["retention"] == pytest.approx(1.0)
    # ntk: below 95 at its 1x (66.7): no 85 % length there, RULER's fails at the first column
    assert scaled["effective_length"]["relative"]["text"] == "-"
    assert scaled["effective_length"]["absolute"]["text"] == "<T512"
    assert scaled["retention"] == pytest.approx(round(HALF / 100, 4))
    # without a threshold: NoLiMa's 85 % of 66.7 = 56.7 holds at T512, fails at T1024 (33.3); T2048's 83.3 is a later
    # pass, listed and not counted
    js = json.loads(make_report([root], fmt="json", view="extrapolation", resamples=50, save_scores=False))
    rel = _rows(js)["ntk x8"]["effective_length"]["relative"]
    assert (rel["length"], rel["stopped_at"], rel["later_passes"]) == ("T512", "T1024", ["T2048"])
    assert _rows(js)["ntk x8"]["effective_length"]["absolute"] is None
    md = make_report([root], fmt="markdown", view="extrapolation", effective_threshold=95, resamples=50,
                     save_scores=False)
    assert "effective length (85% of 1x)" in md and "effective length (>= 95)" in md and "| 66.7% |" in md


def test_one_eval_set_pooled_twice_is_an_input_error_naming_both_runs(tmp_path):
    a = _run(tmp_path / "runs", "a", [REF, ""], prompt="ie")
    _run(tmp_path / "runs", "b", ["", REF], prompt="ie")
    with pytest.raises(InputError, match=f"also in {a}"):
        make_report([tmp_path / "runs"], fmt="json", view="extrapolation", save_scores=False)

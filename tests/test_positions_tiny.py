"""scripts/positions_tiny.py's controls and tests: the unique-marks copy of a packed set (brackets replaced pair by
pair, nothing else), and a comparison of two policies over seeds (the seeds' differences and their t test, by
hand)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import positions_tiny  # noqa: E402


def test_unique_marks_replaces_brackets_pair_by_pair(tmp_path):
    """On the tiny default's tokenizer (the one the control runs with: every bracket is one token)."""
    from transformers import AutoTokenizer

    from data_concat.packed import load_packed, write_packed

    tiny_tokenizer = AutoTokenizer.from_pretrained(str(ROOT / "assets" / "tiny"))

    def enc(text):
        return tiny_tokenizer(text, add_special_tokens=False)["input_ids"]

    pairs = ["甲【1】乙【2】", "丙【1】丁", "【3】戊"]
    ids, starts = [], []
    for p in pairs:
        starts.append(len(ids))
        ids += enc(p)
    labels = [-100] * len(ids)
    labels[-3:] = ids[-3:]  # the last pair's "【3】" is its answer: labelled
    src = tmp_path / "src"
    write_packed(src, {"input_ids": ids, "labels": labels, "pair_starts": [starts], "pair_ids": [["a", "b", "c"]],
                       "length": [len(ids)]}, {"format": "ropescale-packed"}, {"samples": 1})
    counts = positions_tiny.unique_marks(src, tmp_path / "dst", tiny_tokenizer)
    row = load_packed(tmp_path / "dst")[0]
    want = enc("甲【1】乙【2】") + enc("丙[1]丁") + enc("<3>戊")
    assert len(want) == len(ids) and row["input_ids"] == want
    assert row["labels"][:-3] == labels[:-3] and row["labels"][-3:] == want[-3:]  # the answer's marks too
    assert row["pair_starts"] == starts and row["length"] == len(ids)
    assert counts == {"samples": 1, "pairs": 3, "brackets_replaced": 4, "samples_with_repeats": 0}
    meta = json.loads((tmp_path / "dst" / "meta.json").read_text())
    assert meta["marks"] == "each pair of a sample in its own brackets"
    # rebuilt only when missing: the counts come back from its stats
    assert positions_tiny.unique_marks(src, tmp_path / "dst", tiny_tokenizer) == counts


def test_compare_over_seeds_by_hand():
    from ropescale.common.stats.tests import t_over_seeds

    def groups(vals):  # two prompts, samples 0..2, (rouge_l, recall)
        return [{i: (v + k, 0.0) for i, v in enumerate(vals)} for k in (0.0, 2.0)]

    a = {(512, "s0"): groups([50, 60, 70]), (512, "s1"): groups([40, 50, 60]), (512, "s2"): groups([55, 65, 75])}
    b = {(512, "s0"): groups([40, 50, 60]), (512, "s1"): groups([38, 48, 58]), (512, "s2"): groups([50, 60, 70])}
    c = positions_tiny.compare(a, b)[512]["rouge_l"]
    assert c["seeds"] == {"s0": pytest.approx(10.0), "s1": pytest.approx(2.0), "s2": pytest.approx(5.0)}
    t = t_over_seeds([10.0, 2.0, 5.0])
    assert c["mean"] == pytest.approx(t.statistic) and c["p"] == pytest.approx(t.p) and c["df"] == 2
    # every sample of a sits above its partner in b by the seed's constant: every two-level resample is > 0
    assert 2.0 <= c["two_level_ci"][0] <= c["two_level_ci"][1] <= 10.0
    scores = positions_tiny.score_cells(a)[512]
    assert scores["rouge_l"]["mean"] == pytest.approx((61 + 51 + 66) / 3, abs=0.006) and scores["rouge_l"]["seeds"] == 3
    # a cell pooled over seeds: the t interval over the seeds' cells (the seed is the unit), their range beside it
    import scipy.stats

    lo, hi = scipy.stats.t.interval(0.95, 2, loc=(61 + 51 + 66) / 3, scale=scipy.stats.sem([61, 51, 66]))
    assert (scores["rouge_l"]["lo"], scores["rouge_l"]["hi"]) == (pytest.approx(lo, abs=0.006),
                                                                  pytest.approx(hi, abs=0.006))
    assert scores["rouge_l"]["range"] == [51.0, 66.0]
    # the differences' table: BH q over the table's tests (one family), as scipy's
    comps = {("a", "b"): positions_tiny.compare(a, b), ("b", "a"): positions_tiny.compare(b, a),
             ("a", "a2"): positions_tiny.compare(a, {k: groups([50, 62, 69]) for k in a})}
    text = positions_tiny.compare_table(comps)
    ps = [comps[k][512]["rouge_l"]["p"] for k in comps]
    q = scipy.stats.false_discovery_control(ps)
    assert [comps[k][512]["rouge_l"]["q"] for k in comps] == pytest.approx(list(q))
    assert "q (Benjamini-Hochberg over the table's 3 tests)" in text

"""data_concat sample: the CNNSum Sec 3.2 sliding-window sampler, rules i-iii and balancing, hand-derived."""
from __future__ import annotations

import json

import pytest

from data_concat.chapters import MERGE_SEP, Chapter
from data_concat.cli import main as cli_main
from data_concat.sampler import balance, sample, sliding_windows
from ropescale import CHAPTERS_JSONL, QWEN2_TOKENIZER, subsets

K = 1024


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Token-count cache in a temp dir, not the repo's .cache."""
    import ropescale

    monkeypatch.setattr(ropescale, "CACHE_DIR", tmp_path_factory.getbasetemp() / "cache")


# ---------------------------------------------------------------- rules i-iii on hand-built books
def test_rules_hand_built_book():
    # R = [10, 14]. Walking the rules by hand (window = [c_j..c_k], length = sum):
    #  c0..c2 = 4+5+3 = 12 in R                         -> ii: gather (0,2), w = [c3]
    #  c3 = 8 < 10                                      -> i: expand
    #  c3,c4 = 28 > 14 -> iii: drop c3 -> 20 > 14, drop c4 -> empty < 10 -> i: expand
    #  c5,c6 = 6+6 = 12                                 -> ii: gather (5,6)
    #  c7,c8 = 2+13 = 15 > 14 -> iii: drop c7 -> 13     -> ii: gather (8,8)
    #  c9,c10 = 1+9 = 10                                -> ii: gather (9,10) (the book's last chapter)
    assert sliding_windows([4, 5, 3, 8, 20, 6, 6, 2, 13, 1, 9], 10, 14) == [(0, 2), (5, 6), (8, 8), (9, 10)]


def test_rule_iii_shrinks_to_a_multi_chapter_window():
    # R = [10, 14]: 3+4+2+9 = 18 > 14 -> drop c0 (15) -> drop c1 (11) in R -> gather [c2, c3]
    assert sliding_windows([3, 4, 2, 9], 10, 14) == [(2, 3)]
    # shrinking into rule i keeps expanding from the shortened window: 9+9 = 18 -> drop c0 -> 9 < 10,
    # then 9+3 = 12 -> gather [c1, c2]
    assert sliding_windows([9, 9, 3], 10, 14) == [(1, 2)]


def test_rules_edges():
    assert sliding_windows([3, 4], 10, 14) == []  # never reaches R: nothing gathered
    assert sliding_windows([10, 14, 15, 9], 10, 14) == [(0, 0), (1, 1)]  # both bounds inclusive; 15 dropped,
    # then 9 alone < 10 at the end of the book: discarded
    assert sliding_windows([], 10, 14) == []


def test_paper_presets():
    # Sec 3.2: L = 16K [-4K], XL = 32K [-6K], 2XL = 64K [-10K], 3XL = 128K [-16K], upper bound T + 2K.
    assert subsets.get("L").range == (12 * K, 18 * K)
    assert subsets.get("XL").range == (26 * K, 34 * K)
    assert subsets.get("2XL").range == (54 * K, 66 * K)
    assert subsets.get("3XL").range == (112 * K, 130 * K)


# ---------------------------------------------------------------- balancing
def test_balance_prefers_books_with_fewer_samples_and_lengths_near_target():
    cands = {
        "A": [(0, 0, 90), (1, 1, 100), (2, 2, 120), (3, 3, 101), (4, 4, 70)],
        "B": [(0, 0, 80)],
        "C": [(0, 1, 130), (2, 2, 99)],
    }
    got = balance(cands, 100, max_samples=4)
    # round 1: fewest drawn (all 0), ties by fewer candidates: B, then C, then A; round 2: C (2 candidates) < A
    assert got == [("B", (0, 0, 80)), ("C", (2, 2, 99)), ("A", (1, 1, 100)), ("C", (0, 1, 130))]
    assert [c for b, c in balance(cands, 100, per_book=2) if b == "A"] == [(1, 1, 100), (3, 3, 101)]


# ---------------------------------------------------------------- real chapters, real tokenizer
@pytest.fixture(scope="module")
def few_chapters(chapters):
    out = []
    for book in ("hongloumeng", "xiyou_ji"):
        rows = [c for c in chapters if c["book"] == book][:6]
        out += [Chapter(r["book"], int(r["chapter"]), r["title"], r["text"], "") for r in rows]
    return out


def test_sample_real_chapters_scaled_target(few_chapters, qwen2_tokenizer):
    sub = subsets.scaled(12 * K, "L")  # [9K, 13.5K]: windows of two chapters of these books
    lo, hi = sub.range
    recs, rep = sample(few_chapters, qwen2_tokenizer, sub)
    lens = {(c.book, c.chapter): len(qwen2_tokenizer(c.text, add_special_tokens=False)["input_ids"])
            for c in few_chapters}
    assert recs and rep["samples"] == len(recs)
    for book in ("hongloumeng", "xiyou_ji"):
        nums = [c.chapter for c in few_chapters if c.book == book]
        want = sliding_windows([lens[(book, n)] for n in nums], lo, hi)  # rules on the independently counted lengths
        got = [r for r in recs if r["book"] == book]
        assert [(nums.index(r["chapters"][0]), nums.index(r["chapters"][-1])) for r in got] == want
    by_key = {(c.book, c.chapter): c for c in few_chapters}
    for r in recs:
        chs = [by_key[(r["book"], n)] for n in r["chapters"]]
        assert r["context"] == "\n".join(c.text for c in chs)
        assert r["summary"] == MERGE_SEP.join(c.title for c in chs)
        n = len(qwen2_tokenizer(r["context"], add_special_tokens=False)["input_ids"])
        assert r["tokens"] == n and lo <= n <= hi
        assert set(r) == {"id", "context", "summary", "book", "chapters", "tokens"}
    assert len({r["id"] for r in recs}) == len(recs)


def test_sample_paragraph_units_and_limits(few_chapters, qwen2_tokenizer):
    sub = subsets.scaled(1024, "L")  # [768, 1088]: far below a chapter, so slide over paragraphs
    assert sample(few_chapters, qwen2_tokenizer, sub)[0] == []  # no whole chapter fits
    recs, rep = sample(few_chapters, qwen2_tokenizer, sub, unit="paragraph", max_samples=5, per_book=3)
    lo, hi = sub.range
    assert len(recs) == 5 and sorted(rep["per_book"].values()) == [2, 3]
    texts = {(c.book, c.chapter): c.text for c in few_chapters}
    for r in recs:
        n = len(qwen2_tokenizer(r["context"], add_special_tokens=False)["input_ids"])
        assert r["tokens"] == n and lo <= n <= hi
        whole = "\n".join(texts[(r["book"], c)] for c in r["chapters"])
        assert r["context"] in whole  # consecutive paragraphs of the chapters named


def test_cli_sample_and_bad_input(tmp_path, capsys):
    bad = tmp_path / "ch.jsonl"
    good = json.dumps({"book": "b", "chapter": 1, "title": "甲 乙", "text": "话说。"}, ensure_ascii=False)
    bad.write_text(good + "\n" + json.dumps({"book": "b", "chapter": 2, "title": "", "text": "x"}) + "\n",
                   encoding="utf-8")
    rc = cli_main(["sample", "--chapters", str(bad), "--tokenizer", str(QWEN2_TOKENIZER), "--target", "512",
                   "--out", str(tmp_path / "o.jsonl")])
    assert rc == 2 and "ch.jsonl:2: empty or non-string 'title'" in capsys.readouterr().err
    rc = cli_main(["sample", "--chapters", str(bad), "--tokenizer", str(QWEN2_TOKENIZER), "--target", "512",
                   "--on-bad", "skip", "--out", str(tmp_path / "o.jsonl"), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and rep["skipped_bad_lines"] == 1 and rep["samples"] == 0
    assert (tmp_path / "o.jsonl").read_text() == ""
    assert CHAPTERS_JSONL.is_file()


def test_paragraph_counts_partition_and_cache(few_chapters, qwen2_tokenizer, tmp_path_factory):
    from data_concat.chapters import paragraph_token_counts

    texts = [c.text for c in few_chapters[:3]]
    first = paragraph_token_counts(qwen2_tokenizer, texts)
    cached = list((tmp_path_factory.getbasetemp() / "cache" / "data_concat").glob("paracounts-*.json"))
    assert len(cached) == 1
    assert paragraph_token_counts(qwen2_tokenizer, texts) == first == paragraph_token_counts(
        qwen2_tokenizer, texts, cache=False)
    for t, ns in zip(texts, first):
        assert len(ns) == len(t.split("\n"))
        assert sum(ns) == len(qwen2_tokenizer(t, add_special_tokens=False)["input_ids"])

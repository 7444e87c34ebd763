"""data_concat sample: the CNNSum Sec 3.2 sliding-window sampler, rules i-iii and balancing, hand-derived."""
from __future__ import annotations

import json

import pytest

from data_concat.cli import main as cli_main
from data_concat.cuts import MERGE_SEP
from data_concat.sampler import balance, sample, sliding_windows
from ropescale.common import subsets
from ropescale.common.chapters import Chapter
from ropescale.common.paths import CHAPTERS_JSONL, QWEN2_TOKENIZER

K = 1024


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Token-count cache in a temp dir, not the repo's .cache."""
    from ropescale.common import paths

    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path_factory.getbasetemp() / "cache")


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
        assert set(r) == {"id", "context", "summary", "book", "chapters", "tokens", "subset"}
        assert r["subset"] == "T12288"  # the scaled subset's name, as eval_summ generate --subset takes it
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
    rc = cli_main(["sample", "--chapters", str(bad), "--tokenizer", str(QWEN2_TOKENIZER), "--subset-tokens", "512",
                   "--out", str(tmp_path / "o.jsonl")])
    assert rc == 2 and "ch.jsonl:2: empty or non-string 'title'" in capsys.readouterr().err
    # no window fits: an empty eval set is refused in one line naming the chapters, and nothing is written
    rc = cli_main(["sample", "--chapters", str(bad), "--tokenizer", str(QWEN2_TOKENIZER), "--subset-tokens", "512",
                   "--on-bad", "skip", "--out", str(tmp_path / "o.jsonl"), "--json"])
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == "" and cap.err.startswith(f"error: {bad}: no window of chapters fits the range")
    assert "--unit paragraph" in cap.err and not (tmp_path / "o.jsonl").exists()
    assert CHAPTERS_JSONL.is_file()


def test_paragraph_counts_partition_and_cache(few_chapters, qwen2_tokenizer, tmp_path_factory):
    from data_concat.cuts import paragraph_token_counts

    texts = [c.text for c in few_chapters[:3]]
    first = paragraph_token_counts(qwen2_tokenizer, texts)
    cached = list((tmp_path_factory.getbasetemp() / "cache" / "data_concat").glob("paracounts-*.json"))
    assert len(cached) == 1
    assert paragraph_token_counts(qwen2_tokenizer, texts) == first == paragraph_token_counts(
        qwen2_tokenizer, texts, cache=False)
    for t, ns in zip(texts, first):
        assert len(ns) == len(t.split("\n"))
        assert sum(ns) == len(qwen2_tokenizer(t, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------- issue 15: stats, the subset field, bad input
def test_q1_lies_between_min_and_max():
    """Q1 by linear interpolation (type 7): with two samples it was below the minimum (statistics' 'exclusive')."""
    from data_concat.sampler import length_stats

    st = length_stats([100, 200])
    assert st == {"min": 100, "q1": 125.0, "mean": 150.0, "max": 200}
    assert length_stats([7])["q1"] == 7
    assert length_stats([1, 2, 3, 4, 5])["q1"] == 2.0  # numpy.percentile(.., 25) == 2.0
    assert length_stats([10, 10, 40])["q1"] == 10.0
    for lens in ([3, 9], [5, 6, 100], [1, 1000, 1001, 1002]):
        st = length_stats(lens)
        assert st["min"] <= st["q1"] <= st["max"]


def _chapters_file(path, n_books=2, n_ch=6, reps=18):  # ~1,900 tiny-tokenizer tokens a chapter
    rows = [{"book": f"book{b}", "chapter": c, "title": f"第{c}回标题{b}",
             "text": "\n".join(f"第{b}部第{c}回第{p}段。话说天下大势，分久必合，合久必分。" * 3 for p in range(reps))}
            for b in range(n_books) for c in range(1, n_ch + 1)]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_every_record_names_its_subset(tmp_path, capsys, tiny_tokenizer_dir):
    ch = _chapters_file(tmp_path / "ch.jsonl")
    out = tmp_path / "t.jsonl"
    assert cli_main(["sample", "--chapters", str(ch), "--tokenizer", str(tiny_tokenizer_dir), "--subset-tokens", "2048",
                     "--out", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    recs = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert recs and rep["samples"] == len(recs) and rep["subset"] == "T2048"
    assert {r["subset"] for r in recs} == {"T2048"}
    assert subsets.scaled(2048).name == "T2048"  # the name eval_summ resolves --subset T2048 with


@pytest.mark.parametrize("name,want", [("L", "L"), ("xl", "XL"), ("XXL", "2XL"), ("3XL", "3XL")])
def test_preset_subsets_name_the_records(few_chapters, qwen2_tokenizer, name, want, monkeypatch):
    """With --subset the records carry the canonical preset name (no window needs to fit: checked on _record)."""
    from data_concat import sampler

    sub = subsets.get(name)
    assert sub.name == want
    units = sampler.units_of(few_chapters[:2], qwen2_tokenizer, "chapter")
    assert sampler._record(sub.name, "hongloumeng", units, 1, "chapter")["subset"] == want
    if want == "L":
        recs, _ = sample(few_chapters, qwen2_tokenizer, sub)
        assert recs and {r["subset"] for r in recs} == {"L"}


def test_sample_bad_input_one_line_exit_2(tmp_path, capsys, tiny_tokenizer_dir):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    base = ["sample", "--tokenizer", str(tiny_tokenizer_dir), "--subset-tokens", "512"]
    out = tmp_path / "o.jsonl"

    def run(*extra):
        rc = cli_main(base + list(extra))
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        return err

    # an empty chapters file: an error, no (empty) output written
    assert f"{empty}: no chapters (empty file)" in run("--chapters", str(empty), "--out", str(out))
    assert not out.exists()
    # every line bad and skipped: no chapters either
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"book": "b"}\n{not json\n', encoding="utf-8")
    assert "no chapters (2 bad line(s) skipped)" in run("--chapters", str(bad), "--on-bad", "skip", "--out", str(out))
    # a directory given as the input file
    assert f"{tmp_path}: is a directory" in run("--chapters", str(tmp_path), "--out", str(out))
    # an existing directory given as the output file
    ch = _chapters_file(tmp_path / "ch.jsonl", n_books=1, n_ch=2, reps=2)
    d = tmp_path / "outdir"
    d.mkdir()
    assert f"{d}: output is an existing directory" in run("--chapters", str(ch), "--out", str(d))
    assert list(d.iterdir()) == []
    assert not out.exists()

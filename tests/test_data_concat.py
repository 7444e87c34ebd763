"""data_concat pack / pairs on the shared novels with the real Qwen2 tokenizer (CNNSum Sec 5 fine-tuning data)."""
from __future__ import annotations

import json
import os
import random
import stat
from pathlib import Path

import pytest

from data_concat import load_meta, load_packed, pack, plan_packing, resolve_range, stats_of
from data_concat.cli import main as cli_main
from data_concat.cuts import MERGE_SEP
from data_concat.pairs import build_pairs
from ropescale.common import prompts
from ropescale.common.chapters import Chapter
from ropescale.common.io import InputError
from ropescale.common.paths import QWEN2_TOKENIZER

K = 1024


# ---------------------------------------------------------------- fixtures (tokenize a few chapters once)
@pytest.fixture(scope="module")
def chapter_objs():
    """The first 14 chapters of 红楼梦 and 12 of 三国演义 (a few hundred K tokens)."""
    from ropescale.common.chapters import by_book, read_chapters

    books = by_book(read_chapters())
    return books["hongloumeng"][:14] + books["sanguo_yanyi"][:12]


@pytest.fixture(scope="module")
def real_pairs(chapter_objs, qwen2_tokenizer):
    """2K-4K token pairs (the paper's fine-tuning pair size) from 26 real chapters."""
    pairs, rep = build_pairs(chapter_objs, qwen2_tokenizer, 2 * K, 4 * K)
    return pairs, rep


@pytest.fixture(scope="module")
def pairs_file(real_pairs, tmp_path_factory):
    p = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in real_pairs[0]), encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def packed16k(pairs_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "p16k"
    stats = pack(pairs_file, QWEN2_TOKENIZER, out, sample_length="16k", prompt="mix", seed=3)
    return out, stats


def _pairs_by_id(path):
    return {json.loads(x)["id"]: json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines()}


# ---------------------------------------------------------------- pairs from the novels
def test_pairs_sizes_and_summaries(real_pairs, chapter_objs, qwen2_tokenizer):
    pairs, rep = real_pairs
    titles = {(c.book, c.chapter): c.title for c in chapter_objs}
    texts = {(c.book, c.chapter): c.text for c in chapter_objs}
    assert len(pairs) == len(chapter_objs) == rep["pairs"]  # every chapter here is >= 2K Qwen2 tokens
    for p in pairs:
        n = len(qwen2_tokenizer(p["context"], add_special_tokens=False)["input_ids"])
        assert n == p["tokens"] and 2 * K <= n <= 4 * K
        (ch,) = p["chapters"]
        assert p["summary"] == titles[(p["book"], ch)]
        full = texts[(p["book"], ch)]
        assert full.startswith(p["context"])
        if p["cut"] == "paragraph":  # cut exactly at a paragraph end
            assert len(p["context"]) < len(full) and full[len(p["context"])] == "\n"
        elif p["cut"] == "none":
            assert p["context"] == full
    assert rep["whole"] + rep["cut_paragraph"] + rep["cut_sentence"] == len(pairs)
    assert rep["cut_paragraph"] > 0 and rep["tokens_left_out"] > 0


def test_pairs_merge_short_chapters_and_split_all(qwen2_tokenizer):
    # Three tiny hand-made chapters of one book: each is far below the minimum, so they merge.
    text = "\n".join(["天下大势，分久必合，合久必分。"] * 6)
    chs = [Chapter("b", i, f"标题{i}上 标题{i}下", text, "") for i in (1, 2, 3)]
    n1 = len(qwen2_tokenizer(chs[0].text, add_special_tokens=False)["input_ids"])
    pairs, rep = build_pairs(chs, qwen2_tokenizer, 2 * n1 + 1, 10 * n1)
    assert len(pairs) == 1 and rep["merged_windows"] == 1
    assert pairs[0]["chapters"] == [1, 2, 3]
    assert pairs[0]["summary"] == MERGE_SEP.join(c.title for c in chs)
    assert pairs[0]["context"] == "\n".join(c.text for c in chs)
    # split all: pieces of one long chapter, consecutive and within range, remainder counted
    long = [Chapter("b", 1, "甲 乙", "\n".join(f"第{i}段。话说天下大势，分久必合，合久必分。" for i in range(60)), "")]
    pieces, rep = build_pairs(long, qwen2_tokenizer, 100, 160, split="all")
    assert len(pieces) >= 4 and rep["cut_paragraph"] == len(pieces)
    joined = "\n".join(p["context"] for p in pieces)
    assert long[0].text.startswith(joined)
    for p in pieces:
        assert 100 <= len(qwen2_tokenizer(p["context"], add_special_tokens=False)["input_ids"]) <= 160
        assert p["summary"] == "甲 乙"
    assert len({p["id"] for p in pieces}) == len(pieces)


def test_pairs_short_book_tail_is_counted(qwen2_tokenizer):
    chs = [Chapter("b", 1, "甲 乙", "短。", "")]
    pairs, rep = build_pairs(chs, qwen2_tokenizer, 50, 100)
    assert pairs == [] and rep["dropped_short"] == 1 and rep["dropped_short_chapters"] == ["b:1"]


# ---------------------------------------------------------------- packing: hand-derived plans
def test_plan_equal_pairs_hand_derived():
    # 10 pairs of 3 tokens into [10, 12]: a sample closes at 4 pairs (12); 2 pairs remain and no sample has room.
    plan = plan_packing([3] * 10, 10, 12, seed=0)
    assert [len(s) for s in plan.samples] == [4, 4] and len(plan.leftover) == 2 and plan.too_long == []


def test_plan_pool_and_too_long_hand_derived():
    # 7,7,7,7,13 into [10,14]: two 7+7 samples and 13 alone, whatever the order; 20 > 14 can never fit.
    for seed in range(20):
        plan = plan_packing([7, 7, 7, 7, 13, 20], 10, 14, seed)
        sums = sorted(sum([7, 7, 7, 7, 13, 20][i] for i in s) for s in plan.samples)
        assert sums == [13, 14, 14] and plan.leftover == [] and plan.too_long == [5]


def test_plan_leftover_placed_into_room():
    # [10, 20]: 6,6 -> 12 closes; 6,6 -> 12 closes; the last 6 fits the room of a finished sample (12 + 6 <= 20).
    plan = plan_packing([6] * 5, 10, 20, seed=1)
    assert sorted(len(s) for s in plan.samples) == [2, 3] and plan.leftover == []


def test_plan_lengths_centre_on_the_paper_averages():
    # Sec 5: 2K-4K pairs concatenated into 14K-18K / 30K-34K "with average lengths of about 16k and 32k".
    rng = random.Random(0)
    lengths = [rng.randint(2 * K, 4 * K) for _ in range(3000)]
    for (lo, hi), mid in (((14 * K, 18 * K), 16 * K), ((30 * K, 34 * K), 32 * K)):
        plan = plan_packing(lengths, lo, hi, seed=1)
        sums = [sum(lengths[i] for i in s) for s in plan.samples]
        assert all(lo <= t <= hi for t in sums)
        assert abs(sum(sums) / len(sums) - mid) < 0.02 * mid
        assert min(sums) < lo + K and max(sums) > hi - K  # spread over the whole range
        members = sorted(i for s in plan.samples for i in s)
        assert sorted(members + plan.leftover) == list(range(len(lengths)))  # each pair once, none lost
        assert len(plan.leftover) <= 2


def test_resolve_range_presets():
    assert resolve_range("16k") == ("16k", 14336, 18432)  # 14K-18K, K = 1024 (Sec 5)
    assert resolve_range("32k") == ("32k", 30720, 34816)
    assert resolve_range(None, 1024, 4096) == ("custom", 1024, 4096)
    with pytest.raises(InputError):
        resolve_range(None, 10, None)
    with pytest.raises(InputError):
        resolve_range(None, 50, 10)


# ---------------------------------------------------------------- packing the real pairs into 16k
def test_pack16k_lengths_and_labels(packed16k, pairs_file, qwen2_tokenizer):
    out, stats = packed16k
    rows = load_packed(out)
    meta = load_meta(out)
    src = _pairs_by_id(pairs_file)
    eos = qwen2_tokenizer.eos_token_id
    assert meta["min"] == 14 * K and meta["max"] == 18 * K and meta["eos_token_id"] == eos
    assert rows and stats["samples"] == len(rows)
    seen = []
    kinds = set()
    for r in rows:
        n = r["length"]
        assert 14 * K <= n <= 18 * K
        assert len(r["input_ids"]) == len(r["labels"]) == n
        bounds = r["pair_starts"] + [n]
        assert bounds[0] == 0 and len(r["pair_ids"]) == len(r["pair_starts"])
        for k, pid in enumerate(r["pair_ids"]):
            seg_ids = r["input_ids"][bounds[k]:bounds[k + 1]]
            seg_lab = r["labels"][bounds[k]:bounds[k + 1]]
            sup = [i for i, lab in enumerate(seg_lab) if lab != -100]
            # labels: one contiguous block at the end of the pair, equal to the input ids there
            assert sup == list(range(sup[0], len(seg_lab)))
            assert [seg_lab[i] for i in sup] == seg_ids[sup[0]:]
            assert seg_ids[-1] == eos
            assert qwen2_tokenizer.decode(seg_ids[sup[0]:-1]) == src[pid]["summary"]
            prompt_text = qwen2_tokenizer.decode(seg_ids[:sup[0]])
            kind = "ft-ib" if prompt_text == prompts.render(src[pid]["context"], "ft-ib") else "ft-ie"
            assert prompt_text == prompts.render(src[pid]["context"], kind)
            kinds.add(kind)
            seen.append(pid)
    assert len(seen) == len(set(seen))  # no pair used twice
    assert kinds == {"ft-ib", "ft-ie"}  # --prompt mix
    assert set(seen) | set(stats["leftover_ids"]) == set(src) and not set(seen) & set(stats["leftover_ids"])
    assert stats["pairs_used"] == len(seen) and stats["dropped"] == 0
    assert stats["real_share"] == 1.0
    sup_total = sum(sum(1 for x in r["labels"] if x != -100) for r in rows)
    assert stats["supervised_tokens"] == sup_total
    assert sum(b["count"] for b in stats["length"]["histogram"]) == len(rows)


def test_packed_schema(packed16k):
    import pyarrow as pa
    import pyarrow.parquet as pq

    out, _ = packed16k
    schema = pq.read_schema(out / "train.parquet")
    want = {"input_ids": pa.list_(pa.int32()), "labels": pa.list_(pa.int32()), "pair_starts": pa.list_(pa.int32()),
            "pair_ids": pa.list_(pa.string()), "length": pa.int32()}
    assert {f.name: f.type for f in schema} == want
    meta = load_meta(out)
    for k in ("tokenizer", "target", "min", "max", "prompt", "seed", "counts"):
        assert k in meta
    assert meta["target"] == "16k" and meta["prompt"] == "mix" and meta["seed"] == 3
    assert json.loads((out / "stats.json").read_text(encoding="utf-8"))["samples"] == meta["counts"]["samples"]


def test_pack_reproducible_by_seed(packed16k, pairs_file, tmp_path):
    out, _ = packed16k
    again = tmp_path / "again"
    pack(pairs_file, QWEN2_TOKENIZER, again, sample_length="16k", prompt="mix", seed=3)
    assert load_packed(again) == load_packed(out)
    other = tmp_path / "other"
    pack(pairs_file, QWEN2_TOKENIZER, other, sample_length="16k", prompt="mix", seed=4)
    assert [r["pair_ids"] for r in load_packed(other)] != [r["pair_ids"] for r in load_packed(out)]


def test_stats_command_matches(packed16k, capsys):
    out, stats = packed16k
    again = stats_of(out)
    for k in ("samples", "tokens", "length", "pairs_per_sample", "supervised_tokens", "leftover", "pairs_used"):
        assert again[k] == stats[k]
    assert cli_main(["stats", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["samples"] == stats["samples"]


# ---------------------------------------------------------------- robustness
def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bad_input_errors_name_file_line(tmp_path, tiny_tokenizer_dir):
    good = json.dumps({"context": "天下大势，分久必合。", "summary": "分合"}, ensure_ascii=False)
    bad_json = _write(tmp_path / "a.jsonl", [good, good, "{not json"])
    with pytest.raises(InputError, match=r"a\.jsonl:3: malformed JSON"):
        pack(bad_json, tiny_tokenizer_dir, tmp_path / "o1", min_tokens=5, max_tokens=200)
    empty = _write(tmp_path / "b.jsonl", [good, json.dumps({"context": "x", "summary": "  "})])
    with pytest.raises(InputError, match=r"b\.jsonl:2: empty or non-string 'summary'"):
        pack(empty, tiny_tokenizer_dir, tmp_path / "o2", min_tokens=5, max_tokens=200)
    long = _write(tmp_path / "c.jsonl", [good, json.dumps({"context": "天下大势" * 400, "summary": "s"},
                                                          ensure_ascii=False)])
    with pytest.raises(InputError, match=r"c\.jsonl:2: pair .* longer than the maximum sample length 200"):
        pack(long, tiny_tokenizer_dir, tmp_path / "o3", min_tokens=5, max_tokens=200)
    assert not any(p.name.startswith(".o") for p in tmp_path.iterdir())  # no half-written output
    assert not (tmp_path / "o3").exists()
    # the CLI: exit 2, one line naming the file and line
    assert cli_main(["pack", "--pairs", str(long), "--tokenizer", str(tiny_tokenizer_dir), "--min", "5",
                     "--max", "200", "--out", str(tmp_path / "o4")]) == 2


def test_bad_input_skip_is_counted(tmp_path, tiny_tokenizer_dir):
    good = [json.dumps({"id": f"g{i}", "context": "天下大势，分久必合，合久必分。" * (i + 1), "summary": "分合"},
                       ensure_ascii=False) for i in range(6)]
    lines = good[:2] + ["{not json", json.dumps({"context": "", "summary": "s"}),
                        json.dumps({"id": "long", "context": "天下大势" * 400, "summary": "s"}, ensure_ascii=False),
                        json.dumps({"id": "g0", "context": "重复", "summary": "s"}, ensure_ascii=False)] + good[2:]
    f = _write(tmp_path / "p.jsonl", lines)
    stats = pack(f, tiny_tokenizer_dir, tmp_path / "o", min_tokens=20, max_tokens=200, on_bad="skip", seed=1)
    assert stats["dropped_by_reason"] == {"malformed": 1, "empty": 1, "too_long": 1, "duplicate_id": 1}
    wheres = sorted(d["where"].rsplit(":", 1)[1] for d in stats["dropped_records"])
    assert wheres == ["3", "4", "5", "6"]
    used = [p for r in load_packed(tmp_path / "o") for p in r["pair_ids"]]
    assert sorted(used + stats["leftover_ids"]) == sorted(f"g{i}" for i in range(6))


def test_output_replaced_atomically(tmp_path, tiny_tokenizer_dir):
    f = _write(tmp_path / "p.jsonl", [json.dumps({"id": f"g{i}", "context": "话说天下大势。" * 5, "summary": "天下"},
                                                 ensure_ascii=False) for i in range(8)])
    out = tmp_path / "out"
    pack(f, tiny_tokenizer_dir, out, min_tokens=30, max_tokens=120, seed=0, prompt="ft-ie")
    first = load_packed(out)
    pack(f, tiny_tokenizer_dir, out, min_tokens=30, max_tokens=120, seed=5, prompt="ft-ie")
    assert load_packed(out) != first or len(first) <= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "p.jsonl"]
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "stats.json", "train.parquet"]
    assert load_meta(out)["prompt"] == "ft-ie" and load_meta(out)["seed"] == 5


def test_cli_pack_prints_summary(tmp_path, tiny_tokenizer_dir, capsys):
    rng = random.Random(0)
    f = _write(tmp_path / "p.jsonl", [json.dumps({"context": "话说天下大势。" * rng.randint(3, 9), "summary": "天下"},
                                                 ensure_ascii=False) for _ in range(30)])
    rc = cli_main(["pack", "--pairs", str(f), "--tokenizer", str(tiny_tokenizer_dir), "--min", "100", "--max",
                   "300", "--prompt", "mix", "--seed", "2", "--out", str(tmp_path / "o")])
    text = capsys.readouterr().out
    assert rc == 0
    for key in ("samples:", "pairs per sample", "supervised tokens", "leftover:", "dropped:"):
        assert key in text


def test_cli_pairs_end_to_end(chapters, tmp_path, capsys):
    rows = [c for c in chapters if c["book"] == "hongloumeng"][:3]
    f = tmp_path / "ch.jsonl"
    lines = [json.dumps({k: r[k] for k in ("book", "chapter", "title", "text")}, ensure_ascii=False) for r in rows]
    f.write_text("\n".join(lines[:2] + ['{"book": "x", "chapter": 1, "title": "t"}'] + lines[2:]) + "\n",
                 encoding="utf-8")
    args = ["pairs", "--chapters", str(f), "--tokenizer", str(QWEN2_TOKENIZER), "--min-tokens", "2048",
            "--max-tokens", "4096", "--out", str(tmp_path / "p.jsonl")]
    assert cli_main(args) == 2
    assert "ch.jsonl:3: missing field(s) 'text'" in capsys.readouterr().err
    assert not (tmp_path / "p.jsonl").exists()
    assert cli_main(args + ["--on-bad", "skip", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    got = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rep["skipped_bad_lines"] == 1 and rep["pairs"] == len(got) == 3
    assert [g["summary"] for g in got] == [r["title"] for r in rows]
    assert cli_main(args + ["--books", "nosuchbook"]) == 2


def test_books_filter_and_unknown_book(tmp_path):
    """--books (pairs and sample) goes through ropescale.common.chapters.read_chapters: order kept, unknown names
    named."""
    from ropescale.common.chapters import read_chapters

    p = tmp_path / "ch.jsonl"
    rows = [{"book": b, "chapter": i, "title": f"{b}{i}", "text": "正文。"} for b in ("a", "b", "c") for i in (1, 2)]
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert [(c.book, c.chapter) for c in read_chapters(p, books=" c, a ")] == [("a", 1), ("a", 2), ("c", 1), ("c", 2)]
    assert [c.book for c in read_chapters(p, books=["b"])] == ["b", "b"]
    with pytest.raises(InputError, match=r"ch\.jsonl: no chapters of book\(s\) x, z"):
        read_chapters(p, books="a,z,x")


# ---------------------------------------------------------------- issue 15
@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def _small_pairs(path, n=12):
    rng = random.Random(0)
    return _write(path, [json.dumps({"id": f"g{i}", "context": "话说天下大势。" * rng.randint(3, 9), "summary": "天下"},
                                    ensure_ascii=False) for i in range(n)])


def _cli_error(capsys, argv) -> str:
    rc = cli_main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, (rc, err)
    return err


def test_outputs_get_normal_file_modes(tmp_path, tiny_tokenizer_dir, chapters, umask022, capsys):
    """pairs JSONL 0644 (it was tempfile's 0600), packed dir 0755 with 0644 files, under umask 022."""
    rows = [c for c in chapters if c["book"] == "hongloumeng"][:2]
    ch = _write(tmp_path / "ch.jsonl", [json.dumps({k: r[k] for k in ("book", "chapter", "title", "text")},
                                                   ensure_ascii=False) for r in rows])
    assert cli_main(["pairs", "--chapters", str(ch), "--tokenizer", str(tiny_tokenizer_dir), "--min-tokens", "100",
                     "--max-tokens", "100000", "--out", str(tmp_path / "pairs.jsonl")]) == 0
    assert _mode(tmp_path / "pairs.jsonl") == 0o644
    out = tmp_path / "packed"
    pack(_small_pairs(tmp_path / "p.jsonl"), tiny_tokenizer_dir, out, min_tokens=100, max_tokens=300)
    assert _mode(out) == 0o755
    assert {p.name: _mode(p) for p in out.iterdir()} == {"train.parquet": 0o644, "meta.json": 0o644,
                                                          "stats.json": 0o644}


def test_empty_inputs_are_errors(tmp_path, tiny_tokenizer_dir, capsys):
    """An empty chapters / pairs file: one line, exit 2, no (empty) output (was: exit 0 and an empty output)."""
    empty = _write(tmp_path / "empty.jsonl", [""])
    tok = ["--tokenizer", str(tiny_tokenizer_dir)]
    err = _cli_error(capsys, ["pairs", "--chapters", str(empty), *tok, "--min-tokens", "10", "--max-tokens", "20",
                              "--out", str(tmp_path / "pairs.jsonl")])
    assert f"{empty}: no chapters (empty file)" in err
    err = _cli_error(capsys, ["pack", "--pairs", str(empty), *tok, "--min", "10", "--max", "20",
                              "--out", str(tmp_path / "packed")])
    assert f"{empty}: no pairs (empty file)" in err
    bad = _write(tmp_path / "bad.jsonl", ["{not json", json.dumps({"context": "", "summary": "s"})])
    err = _cli_error(capsys, ["pack", "--pairs", str(bad), *tok, "--min", "10", "--max", "20", "--on-bad", "skip",
                              "--out", str(tmp_path / "packed")])
    assert f"{bad}: no pairs (2 bad line(s) skipped)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "empty.jsonl"]


def test_directory_and_file_mixups_are_one_line(tmp_path, tiny_tokenizer_dir, capsys):
    d = tmp_path / "d"
    d.mkdir()
    pairs = _small_pairs(tmp_path / "p.jsonl")
    tok = ["--tokenizer", str(tiny_tokenizer_dir)]
    # a directory as an input file
    err = _cli_error(capsys, ["pack", "--pairs", str(d), *tok, "--min", "10", "--max", "20", "--out",
                              str(tmp_path / "o")])
    assert f"{d}: is a directory, expected a file" in err
    err = _cli_error(capsys, ["pairs", "--chapters", str(d), *tok, "--min-tokens", "10", "--max-tokens", "20",
                              "--out", str(tmp_path / "o.jsonl")])
    assert f"{d}: is a directory, expected a file" in err
    # an existing directory as the pairs output (was a traceback), a file as pack's output directory
    ch = _write(tmp_path / "ch.jsonl", [json.dumps({"book": "b", "chapter": 1, "title": "t", "text": "话说。" * 50},
                                                   ensure_ascii=False)])
    err = _cli_error(capsys, ["pairs", "--chapters", str(ch), *tok, "--min-tokens", "10", "--max-tokens", "2000",
                              "--out", str(d)])
    assert f"{d}: output is an existing directory" in err
    err = _cli_error(capsys, ["pack", "--pairs", str(pairs), *tok, "--min", "100", "--max", "300", "--out",
                              str(pairs)])
    assert f"{pairs}: output exists and is not a directory" in err
    # a file where the tokenizer directory should be; a non-positive --max-pairs
    err = _cli_error(capsys, ["pack", "--pairs", str(pairs), "--tokenizer", str(pairs), "--min", "100", "--max",
                              "300", "--out", str(tmp_path / "o")])
    assert "is a file, expected a tokenizer directory" in err
    err = _cli_error(capsys, ["pairs", "--chapters", str(ch), *tok, "--min-tokens", "10", "--max-tokens", "2000",
                              "--max-pairs", "0", "--out", str(tmp_path / "o.jsonl")])
    assert "--max-pairs must be positive" in err
    assert list(d.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["ch.jsonl", "d", "p.jsonl"]


def test_pack_prompt_names_match_eval(tmp_path, tiny_tokenizer_dir, capsys):
    """--prompt ft-ie | ft-ib | mix (eval_summ's names for the F.2 prompts); ie / ib are deprecated aliases with a
    note; the default is mix; meta.json and stats.json record the canonical name."""
    from data_concat.cli import build_parser
    from data_concat.pack import canonical_prompt
    from ropescale.common.settings import from_args

    pairs = _small_pairs(tmp_path / "p.jsonl")
    assert from_args(build_parser().parse_args(["pack", "--pairs", "x", "--out", "y"])).prompt == "mix"
    assert canonical_prompt("ft-ie") == "ft-ie" and canonical_prompt("IB") == "ft-ib"
    with pytest.raises(InputError, match="choose from ft-ie, ft-ib, mix"):
        canonical_prompt("ft-xx")

    def run(*extra):
        out = tmp_path / f"o{len(list(tmp_path.iterdir()))}"
        rc = cli_main(["pack", "--pairs", str(pairs), "--tokenizer", str(tiny_tokenizer_dir), "--min", "100",
                       "--max", "300", "--json", "--out", str(out), *extra])
        cap = capsys.readouterr()
        assert rc == 0, cap.err
        return out, json.loads(cap.out), cap.err

    out, stats, err = run()
    meta = load_meta(out)
    assert meta["prompt"] == stats["prompt"] == "mix" and "deprecated" not in err
    assert set(meta["prompt_types"]) == {"ft-ie", "ft-ib"} and stats_of(out)["prompt"] == "mix"
    for canon, alias in (("ft-ie", "ie"), ("ft-ib", "ib")):
        out1, stats1, err1 = run("--prompt", canon)
        out2, stats2, err2 = run("--prompt", alias)
        assert "deprecated" not in err1
        assert f"--prompt {alias} is deprecated, use {canon}" in err2 and len(err2.strip().splitlines()) == 1
        assert load_meta(out1)["prompt"] == load_meta(out2)["prompt"] == stats1["prompt"] == stats2["prompt"] == canon
        assert set(load_meta(out2)["prompt_types"]) == {canon}
        assert load_packed(out1) == load_packed(out2)
    # the rendered prompt is the F.2 one eval_summ renders for ft-ib
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    ctx = {r["id"]: r["context"] for r in map(json.loads, pairs.read_text(encoding="utf-8").splitlines())}
    row = load_packed(out2)[0]
    want = tok(prompts.render(ctx[row["pair_ids"][0]], "ft-ib"), add_special_tokens=False)["input_ids"]
    assert row["input_ids"][:len(want)] == want and set(row["labels"][:len(want)]) == {-100}


def test_packed_set_loads_with_hf_datasets(packed16k, tmp_path):
    """OUT loads with datasets.load_dataset (the directory, or its parquet file) and round-trips every row."""
    import datasets

    out, _ = packed16k
    rows = load_packed(out)
    cache = str(tmp_path / "hf_cache")
    ds = datasets.load_dataset(str(out), split="train", cache_dir=cache)
    assert ds.num_rows == len(rows) and set(ds.column_names) == {"input_ids", "labels", "pair_starts", "pair_ids",
                                                                 "length"}
    assert ds.to_list() == rows
    ds2 = datasets.load_dataset("parquet", data_files=str(out / "train.parquet"), split="train", cache_dir=cache)
    assert ds2.to_list() == rows
    torch_rows = ds.with_format("torch", columns=["input_ids", "labels"])
    first = torch_rows[0]
    assert first["input_ids"].tolist() == rows[0]["input_ids"] and first["labels"].tolist() == rows[0]["labels"]

"""data_concat recall: the demo's marked-sentence task (issue 14): every reference is derivable from its input,
the marks are spread over the whole input, eval windows never overlap, lengths respect the target."""
import json
import re

import pytest

from ropescale.common.io import InputError
from ropescale.common.recall import MARK, build, recall_samples, sources, split_part


@pytest.fixture(scope="module")
def heldout_sources(tiny_tokenizer):
    from ropescale.common.chapters import read_chapters

    return sources(split_part(read_chapters(), "heldout", 3), tiny_tokenizer)


def _lines(summary):
    out = []
    for k, line in enumerate(summary.split("\n"), 1):
        m = re.match(r"^【(\d+)】(.+)$", line)
        assert m, line
        assert int(m.group(1)) == k
        out.append(m.group(2))
    return out


def test_reference_is_copied_from_the_input_and_spread_over_it(heldout_sources, tiny_tokenizer):
    rows = recall_samples(heldout_sources, tiny_tokenizer, n=8, target=600, marks=4, seed=1)
    assert len(rows) == 8
    for r in rows:
        ctx = r["context"]
        sents = _lines(r["summary"])
        assert len(sents) == 4
        pos = []
        for k, s in enumerate(sents, 1):
            mk = MARK.format(k)
            assert ctx.count(mk) == 1
            i = ctx.index(mk)
            # the line is the text right after its mark (what a copying model extracts)
            assert ctx[i + len(mk):].startswith(s), (k, s)
            pos.append(i / len(ctx))
        assert pos == sorted(pos)
        # one mark in each quarter of the input (by characters, the stretches are cut by tokens)
        for k, p in enumerate(pos):
            assert k / 4 - 0.08 <= p <= (k + 1) / 4 + 0.08, pos
        assert r["tokens"] <= 600 and r["tokens"] >= 500
        assert r["tokens"] == len(tiny_tokenizer(ctx, add_special_tokens=False)["input_ids"])
        assert r["subset"] == "T600"


def test_eval_windows_do_not_overlap_and_are_deterministic(heldout_sources, tiny_tokenizer):
    a = recall_samples(heldout_sources, tiny_tokenizer, n=6, target=400, seed=0)
    b = recall_samples(heldout_sources, tiny_tokenizer, n=6, target=400, seed=0)
    assert a == b
    seen = {}
    for r in a:
        seen.setdefault(r["book"], []).append(r["context"])
    for ctxs in seen.values():
        for i in range(len(ctxs)):
            for j in range(i + 1, len(ctxs)):
                # no sentence of one window reappears in another
                assert ctxs[i][:30] not in ctxs[j] and ctxs[j][:30] not in ctxs[i]
    assert len({r["book"] for r in a}) > 1  # books take turns


def _windows(rows, src_by_book):
    """(book, first sentence index, last sentence index + 1) of each eval window, found in the book's text."""
    out = []
    for r in rows:
        src = src_by_book[r["book"]]
        text = "".join(src.sentences)
        plain = re.sub(r"【\d+】", "", r["context"])
        at = text.index(plain)
        acc, first, last = 0, None, None
        for i, s in enumerate(src.sentences):
            if first is None and acc + len(s) > at:
                first = i
            acc += len(s)
            if acc >= at + len(plain):
                last = i + 1
                break
        out.append((r["book"], first, last))
    return out


def test_the_seed_moves_the_eval_windows(heldout_sources, tiny_tokenizer):
    """Seeds 0 and 1 give other passages (not only other marked sentences); within a seed windows never overlap
    and fall one per stratum, so they still cover each book from start to end."""
    by_book = {s.book: s for s in heldout_sources}
    sets = {seed: recall_samples(heldout_sources, tiny_tokenizer, n=8, target=400, seed=seed) for seed in (0, 1)}
    w0, w1 = (_windows(sets[s], by_book) for s in (0, 1))
    assert len(set(w0) & set(w1)) <= 1, (w0, w1)  # other passages, not the same ones re-marked
    assert {r["context"] for r in sets[0]}.isdisjoint({r["context"] for r in sets[1]})
    for ws in (w0, w1):
        per_book: dict = {}
        for book, a, b in ws:
            per_book.setdefault(book, []).append((a, b))
        for book, spans in per_book.items():
            spans.sort()
            assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:])), spans  # no overlap
            total = sum(by_book[book].tokens)
            k = len(spans)
            # stratum j of the book's tokens holds window j's start
            for j, (a, _) in enumerate(spans):
                pos = sum(by_book[book].tokens[:a])
                assert j * total / k <= pos < (j + 1) * total / k, (book, j, pos, total)


def test_max_answer_keeps_every_reference_within_the_generation_budget(heldout_sources, tiny_tokenizer):
    def answer_tokens(rows):
        return [len(tiny_tokenizer(r["summary"], add_special_tokens=False)["input_ids"]) + 1 for r in rows]

    free = answer_tokens(recall_samples(heldout_sources, tiny_tokenizer, n=12, target=600, seed=0))
    cap = sorted(free)[len(free) // 2]  # half of the unconstrained answers are longer than this
    assert max(free) > cap
    rows = recall_samples(heldout_sources, tiny_tokenizer, n=12, target=600, seed=0, max_answer=cap)
    assert len(rows) == 12 and max(answer_tokens(rows)) <= cap
    with pytest.raises(InputError, match="too short"):
        recall_samples(heldout_sources, tiny_tokenizer, n=2, target=600, max_answer=10)


def test_training_pairs_have_lengths_in_range(heldout_sources, tiny_tokenizer):
    rows = recall_samples(heldout_sources, tiny_tokenizer, n=10, min_tokens=200, max_tokens=400, seed=3)
    assert all(100 <= r["tokens"] <= 400 for r in rows)
    assert "subset" not in rows[0]
    assert len({r["tokens"] for r in rows}) > 3


def test_build_gives_none_without_markable_sentences(tiny_tokenizer):
    import random

    from ropescale.common.recall import Source

    long_sentence = "这是一句" + "非常" * 16 + "长的句子而且没有结束。"
    src = Source("x", [long_sentence] * 20,
                 [40] * 20, [1] * 20)
    assert build(src, 0, 400, random.Random(0)) is None


def test_bad_requests_are_input_errors(heldout_sources, tiny_tokenizer):
    with pytest.raises(InputError, match="--n"):
        recall_samples(heldout_sources, tiny_tokenizer, n=0, target=400)
    with pytest.raises(InputError, match="too short"):
        recall_samples(heldout_sources, tiny_tokenizer, n=2, target=10)
    with pytest.raises(InputError, match="only"):
        recall_samples(heldout_sources, tiny_tokenizer, n=500, target=4000)


def test_cli(tmp_path, tiny_tokenizer_dir, capsys):
    from data_concat.cli import main

    out = tmp_path / "r.jsonl"
    rc = main(["recall", "--tokenizer", str(tiny_tokenizer_dir), "--eval-tokens", "300", "--n", "3", "--heldout", "2",
               "--out", str(out), "--json"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["samples"] == 3 and rep["max"] <= 300
    rows = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert {"id", "context", "summary", "book", "tokens", "subset"} <= set(rows[0])
    assert main(["recall", "--tokenizer", str(tiny_tokenizer_dir), "--n", "3", "--out", str(out)]) == 2


def test_pair_range_leaves_room_for_prompt_and_answer(tiny_tokenizer):
    from ropescale.common import prompts
    from ropescale.common.recall import exact_tokens, pair_range

    lo, hi = pair_range(tiny_tokenizer, 896, 1152)
    prompt = max(exact_tokens(tiny_tokenizer, prompts.render("", k)) for k in ("ft-ie", "ft-ib"))
    assert lo == 896 - prompt  # the context alone plus the prompt reaches the sample minimum
    assert 0 < hi - lo < 1152 - 896 - prompt  # and an answer of four long sentences still fits under the maximum
    with pytest.raises(InputError, match="cannot hold a recall pair"):
        pair_range(tiny_tokenizer, 100, 120)


def test_default_finetune_data_is_packed_recall_pairs(make_tiny_model, tiny_tokenizer, tmp_path):
    """finetune.py without --data on a small model: recall pairs from the training chapters, one per sample,
    packed with the F.2 prompts into 7/8-9/8 of twice the original context; the supervised tokens are the answer
    (the marked sentences of that sample's own input) and EOS."""
    from data_concat import load_packed
    from ropescale.training.data import build_default_data

    _, model_dir = make_tiny_model("qwen2", orig_ctx=512)
    packed = build_default_data(model_dir, 512, 4096, n_samples=6, cache_dir=tmp_path)
    rows = load_packed(packed)
    assert rows and all(896 <= r["length"] <= 1152 for r in rows)
    for r in rows:
        ids, labels = list(r["input_ids"]), list(r["labels"])
        answer = [t for t, lab in zip(ids, labels) if lab != -100]
        assert answer[-1] == tiny_tokenizer.eos_token_id
        first = next(i for i, lab in enumerate(labels) if lab != -100)
        assert labels[first:] == ids[first:]  # labels are the input ids (shifted in the model), the prompt masked
        text = tiny_tokenizer.decode(ids[:first])
        for s in _lines(tiny_tokenizer.decode(answer[:-1]).strip()):
            assert s in text
    again = build_default_data(model_dir, 512, 4096, n_samples=6, cache_dir=tmp_path)  # cached
    assert again == packed


def test_eval_set_total_length_holds_prompt_context_and_budget(tmp_path, tiny_tokenizer_dir, tiny_tokenizer, capsys):
    """Issue 31.1: an eval set of length L holds, for every prompt it is built for, the rendered prompt as `eval_summ
    generate` tokenizes it (its own Tokenize) + the generation budget <= L, and the windows are filled (not a few
    sentences)."""
    from data_concat.cli import main
    from ropescale.evaluation.generate import Tokenize

    L, budget = 512, 140
    for prompts in ("ft-ie,ft-ib", "ft-ie,ft-ib,ie,ib"):
        out = tmp_path / f"{prompts}.jsonl"
        assert main(["recall", "--tokenizer", str(tiny_tokenizer_dir), "--eval-tokens", str(L), "--max-answer-tokens",
                     str(budget), "--prompts", prompts, "--n", "6", "--heldout", "4", "--out", str(out),
                     "--json"]) == 0
        rep = json.loads(capsys.readouterr().out)
        rows = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
        totals = []
        for r in rows:
            per_prompt = [len(Tokenize(tiny_tokenizer, p, "release", False).ids(r["context"])) + budget
                          for p in prompts.split(",")]
            assert max(per_prompt) <= L, (prompts, r["id"], per_prompt)
            assert len(tiny_tokenizer(r["summary"], add_special_tokens=False)["input_ids"]) + 1 <= budget
            assert r["subset"] == f"T{L}"
            totals.append(max(per_prompt))
        assert rep["total_max"] == max(totals) and rep["budget"] == budget
        assert sum(totals) / len(totals) >= 0.85 * L  # windows filled to within a sentence or two of L
    assert main(["recall", "--tokenizer", str(tiny_tokenizer_dir), "--eval-tokens", "150", "--max-answer-tokens",
                 "120", "--n", "2", "--heldout", "3", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "context tokens beside the prompts" in capsys.readouterr().err
    assert main(["recall", "--tokenizer", str(tiny_tokenizer_dir), "--eval-tokens", "300", "--prompts", "ft-ie,xx",
                 "--n", "2", "--out", str(tmp_path / "y.jsonl")]) == 2

"""probes end to end through the CLI: a tiny Qwen2 model trained in the test to memorize a short book identifies
the true suffix at every chapter break (ChapterBreak construction) and after full stops (Sun et al. 2021 Sec 5);
the rope flags reach the model config and run.json."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ropescale.probes.cli import main


@pytest.fixture(scope="module")
def short_book(chapters, tmp_path_factory):
    """The first 9 chapters of 三国演义, each body cut to its first sentence, as a chapters JSONL."""
    rows = [dict(c) for c in chapters if c["book"] == "sanguo_yanyi"][:9]
    for r in rows:
        r.pop("_line", None)
        r["text"] = r["text"][:r["text"].index("。") + 1]  # the first sentence (15-37 characters here)
        assert len(r["text"]) <= 40
    p = tmp_path_factory.mktemp("book") / "book.jsonl"
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return p, rows


@pytest.fixture(scope="module")
def memorized(make_tiny_model, short_book, tiny_tokenizer, one_thread):
    """A tiny model trained until it reproduces the short book as printed (headings included)."""
    from ropescale.common.chapters import Chapter
    from ropescale.probes.data import render_chapter

    _, rows = short_book
    ids = []
    for r in rows:
        ids += tiny_tokenizer(render_chapter(Chapter(r["book"], r["chapter"], r["title"], r["text"])),
                              add_special_tokens=False)["input_ids"]
    model, d = make_tiny_model(orig_ctx=512, seed=0)
    torch.manual_seed(0)
    model.train()
    # random 64-token crops, so the text is memorized by content at any offset (not by absolute position);
    # the probes below feed at most 52 tokens, positions the model was trained on
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    full = torch.tensor(ids)
    for _ in range(200):
        starts = torch.randint(0, len(ids) - 64, (16,), generator=g)
        x = torch.stack([full[s:s + 64] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2, f"did not memorize (loss {loss.item():.3f})"
    model.eval()
    model.save_pretrained(d, safe_serialization=True)
    return d, len(ids)


def _items(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "items.jsonl").read_text().splitlines()]


def test_memorized_model_identifies_the_next_chapter(memorized, short_book, tmp_path, capsys, one_thread):
    model_dir, _ = memorized
    book, _ = short_book
    out = tmp_path / "sid"
    rc = main(["suffix-id", "--model", str(model_dir), "--data", str(book), "--out", str(out), "--n", "3",
               "--lengths", "28,52", "--suffix-len", "12", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    # a length counts every token read: 28 = a 16-token prefix + the 12-token candidate, 52 = 40 + 12
    assert [(c["col"], c["value"], c["n"]) for c in summary["cells"]] == [(28, 1.0, 3), (52, 1.0, 3)]
    recs = _items(out)
    assert {r["gold_chapter"] for r in recs} == {2, 3, 4}  # breaks before chapters 2..4 have 5 later chapters
    assert all(min(n) > r["gold_chapter"] for r in recs for n in [r["negative_chapters"]])
    assert all(r["gold_rank"] == 1 for r in recs)
    assert sorted({(r["col"], r["prefix_tokens"]) for r in recs}) == [(28, 16), (52, 40)]
    meta = json.loads((out / "run.json").read_text())
    assert meta["kind"] == "probe" and meta["info"]["probe"] == "suffix-id" and meta["info"]["lengths"] == [28, 52]
    assert meta["settings"]["heading"] == "index"


def test_memorized_model_identifies_the_suffix_after_a_full_stop(memorized, short_book, tmp_path, capsys,
                                                                 one_thread):
    model_dir, _ = memorized
    _, rows = short_book
    from ropescale.common.chapters import Chapter
    from ropescale.probes.data import render_chapter

    docs = tmp_path / "docs.jsonl"
    text = "".join(render_chapter(Chapter(r["book"], r["chapter"], r["title"], r["text"])) for r in rows)
    docs.write_text(json.dumps({"id": "book", "text": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    out = tmp_path / "sent"
    assert main(["suffix-id", "--variant", "sentence", "--model", str(model_dir), "--data", str(docs), "--out",
                 str(out), "--n", "3", "--lengths", "32", "--suffix-len", "8", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # each cell a proportion with its Wilson interval: all 3 items right, so [0.4385, 1] (scipy's binomtest
    # proportion_ci(method="wilson") for 3 of 3), never [1, 1]; a 24-token prefix + 8
    assert summary["cells"] == [{"group": "", "col": 32, "value": 1.0, "n": 3, "lo": pytest.approx(0.43850, abs=1e-5),
                                 "hi": 1.0, "interval": "Wilson"}]
    for r in _items(out):  # negatives overlap neither the prefix nor the gold suffix
        b = r["boundary"]
        assert all(s + 8 <= b - 24 or s >= b + 8 for s in r["negative_starts"])
    # the probe's own variant, recorded in run.json: what tells this run apart from a default (chapter) one
    assert json.loads((out / "run.json").read_text())["info"]["variant_label"] == "sentence"


def test_rope_flags_reach_the_model_and_run_json(make_tiny_model, short_book, tmp_path, capsys, one_thread):
    from transformers import AutoConfig

    from rope_scaling import RopeSpec, apply_rope

    book, _ = short_book
    _, d = make_tiny_model(orig_ctx=64, seed=1)
    out = tmp_path / "ppl_pi"
    assert main(["ppl", "--model", str(d), "--data", str(book), "--out", str(out), "--n", "2", "--lengths", "40,80",
                 "--target-len", "8", "--rope", "pi", "--scale", "2", "--json"]) == 0
    capsys.readouterr()
    meta = json.loads((out / "run.json").read_text())
    assert meta["rope"]["method"] == "pi" and meta["rope"]["scale"] == 2.0 and meta["context"] == 128
    assert meta["info"]["orig_ctx"] == 64
    # a model whose config already carries scaling: a second method needs --replace
    scaled = tmp_path / "scaled"
    shutil.copytree(d, scaled)
    cfg = AutoConfig.from_pretrained(str(scaled))
    apply_rope(cfg, RopeSpec("yarn", scale=4.0))
    cfg.save_pretrained(str(scaled))
    args = ["ppl", "--model", str(scaled), "--data", str(book), "--n", "1", "--lengths", "40", "--target-len", "8",
            "--rope", "pi", "--scale", "2"]
    assert main(args + ["--out", str(tmp_path / "x")]) == 2
    assert "--replace" in capsys.readouterr().err
    assert main(args + ["--out", str(tmp_path / "y"), "--replace"]) == 0
    assert json.loads((tmp_path / "y" / "run.json").read_text())["rope"]["method"] == "pi"
    # without flags the run records the scaling the config carries
    assert main(["ppl", "--model", str(scaled), "--data", str(book), "--n", "1", "--lengths", "40",
                 "--target-len", "8", "--out", str(tmp_path / "z")]) == 0
    meta = json.loads((tmp_path / "z" / "run.json").read_text())
    assert meta["rope"]["method"] == "yarn" and meta["rope"]["scale"] == 4.0 and meta["context"] == 256


def _direct_logprob(model, prefix: list[int], cont: list[int]) -> float:
    """sum_t log P(cont_t | prefix, cont_<t) from one plain forward pass (the scorer's independent reference)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prefix + cont])).logits[0].float()
    logp = torch.log_softmax(logits[len(prefix) - 1:-1], dim=-1)
    return float(logp.gather(-1, torch.tensor(cont).unsqueeze(-1)).sum())


def test_pmi_score_subtracts_each_candidates_likelihood_at_document_start(memorized, short_book, tmp_path, capsys,
                                                                          one_thread, tiny_tokenizer):
    """--score pmi: each recorded candidate score is log P(s|prefix) - log P(s|EOS), recomputed here by plain
    forward passes, and the item is right exactly when the gold's recomputed PMI is the highest; run.json and the
    report name the score. (The memorized model also knows each chapter's beginning from its heading alone, so PMI
    need not pick the gold here: only the arithmetic is checked.)"""
    from transformers import AutoModelForCausalLM

    from ropescale.probes.data import load_books
    from ropescale.probes.suffix_id import chapter_candidate, chapter_examples

    model_dir, _ = memorized
    book, _ = short_book
    out = tmp_path / "pmi"
    assert main(["suffix-id", "--model", str(model_dir), "--data", str(book), "--out", str(out), "--n", "3",
                 "--lengths", "52", "--suffix-len", "12", "--score", "pmi", "--json"]) == 0  # 40-token prefixes
    summary = json.loads(capsys.readouterr().out)
    assert "PMI" in summary["metric"]
    assert json.loads((out / "run.json").read_text())["settings"]["score"] == "pmi"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).float().eval()
    eos = tiny_tokenizer.eos_token_id
    books = load_books(str(book))
    exs = {f"{e['book']}:{e['chapters'][e['j']].chapter}": e
           for e in chapter_examples(books, tiny_tokenizer, n=3, max_len=40, seed=0)}
    recs = _items(out)
    assert len(recs) == 3
    for r in recs:
        ex = exs[r["id"].rsplit(":", 1)[0]]
        chs, j = ex["chapters"], ex["j"]
        cands = [chapter_candidate(chs[c], chs[j], "index", tiny_tokenizer, 12) for c in [j] + ex["negs"]]
        prefix = ex["prefix_ids"][-40:]
        ref_lp = [_direct_logprob(model, prefix, c) for c in cands]
        ref_prior = [_direct_logprob(model, [eos], c) for c in cands]
        ref = [a - b for a, b in zip(ref_lp, ref_prior)]
        assert r["logprobs"] == pytest.approx(ref_lp, abs=2e-3)
        assert r["prior_logprobs"] == pytest.approx(ref_prior, abs=2e-3)
        assert r["pmi"] == pytest.approx(ref, abs=4e-3)
        assert r["value"] == float(ref[0] > max(ref[1:]))
        assert r["gold_rank"] == 1 + sum(x > ref[0] for x in ref[1:])
    assert summary["cells"][0]["value"] == pytest.approx(sum(r["value"] for r in recs) / 3)
    # the report tells the pmi run apart from a logprob run of the same model
    logp = tmp_path / "logp"
    assert main(["suffix-id", "--model", str(model_dir), "--data", str(book), "--out", str(logp), "--n", "3",
                 "--lengths", "52", "--suffix-len", "12"]) == 0
    capsys.readouterr()
    assert main(["report", str(out), str(logp)]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("|")]
    assert any("| pmi |" in " ".join(r.split()) for r in rows)
    # another score into the same run directory is refused, not recorded over
    assert main(["suffix-id", "--model", str(model_dir), "--data", str(book), "--out", str(out), "--n", "3",
                 "--lengths", "52", "--suffix-len", "12"]) == 2
    assert "score" in capsys.readouterr().err

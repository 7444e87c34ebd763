"""The position-loss probe (ropescale/probes/position_loss.py): every bucket's loss against a loss computed by hand
from transformers' logits on a tiny model; a rope that follows the length read from a forward over each bucket's
prefix; the command line, a corpus directory, resume."""
from __future__ import annotations

import json

import pytest


def _docs(chapters, tmp_path, k=3):
    from ropescale.probes.data import load_docs

    f = tmp_path / "docs.jsonl"
    f.write_text("".join(json.dumps({"id": f"d{i}", "text": c["text"]}, ensure_ascii=False) + "\n"
                         for i, c in enumerate(chapters[:k])), encoding="utf-8")
    return f, load_docs(f)


TOKENS: dict = {}  # (tokenizer, document) -> its token ids


def _by_hand(model, tok, docs, rec, window, width, prefix_forward=False):
    """The mean of -log softmax(logits)[p - 1, id_p] over the bucket's positions p, from the model's own forward
    (over the whole window, or over the window up to the bucket's end)."""
    import torch

    key = (id(tok), rec["doc"])
    if key not in TOKENS:
        TOKENS[key] = tok(next(d for d in docs if d.id == rec["doc"]).text, add_special_tokens=False)["input_ids"]
    ids = TOKENS[key][rec["start"]:rec["start"] + window]
    first, end = max(1, rec["bucket"]), min(rec["bucket"] + width, window)
    x = torch.tensor([ids[:end] if prefix_forward else ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=x).logits[0].float(), -1)
    return -sum(float(lp[p - 1, ids[p]]) for p in range(first, end)) / (end - first)


def test_bucket_losses_against_transformers(make_tiny_model, chapters, tmp_path, one_thread):
    from ropescale.probes.common import load_model
    from ropescale.probes.position_loss import position_loss_probe

    _, d = make_tiny_model(orig_ctx=64)
    loaded = load_model(str(d))
    _, docs = _docs(chapters, tmp_path)
    out = tmp_path / "run"
    summary = position_loss_probe(loaded, docs, window=100, bucket=16, n=3, seed=5, out=str(out))
    items = [json.loads(x) for x in (out / "items.jsonl").read_text().splitlines()]
    assert len(items) == 3 * 7 and sorted({r["bucket"] for r in items}) == [0, 16, 32, 48, 64, 80, 96]
    assert {r["tokens"] for r in items if r["bucket"] == 0} == {15} and {r["tokens"] for r in items
                                                                      if r["bucket"] == 96} == {4}
    for r in items:
        assert r["loss"] == pytest.approx(_by_hand(loaded.model, loaded.tokenizer, docs, r, 100, 16), abs=1e-5)
    means = {c: sum(r["loss"] for r in items if r["bucket"] == c) / 3 for c in (0, 96)}
    cells = {c["col"]: c for c in summary["cells"]}
    assert all(cells[c]["value"] == pytest.approx(means[c]) and cells[c]["n"] == 3 for c in (0, 96))
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "complete" and run["info"]["probe"] == "position-loss"
    # resumed: nothing is added
    position_loss_probe(loaded, docs, window=100, bucket=16, n=3, seed=5, out=str(out))
    assert len((out / "items.jsonl").read_text().splitlines()) == 21


def test_a_rope_that_follows_the_length_reads_each_bucket_from_its_prefix(make_tiny_model, chapters, tmp_path,
                                                                           one_thread):
    from rope_scaling import RopeSpec
    from ropescale.probes.common import load_model
    from ropescale.probes.position_loss import position_loss_probe

    _, d = make_tiny_model(orig_ctx=32)
    spec = RopeSpec("dynamic_ntk", scale=4)
    loaded = load_model(str(d), spec)
    _, docs = _docs(chapters, tmp_path)
    out = tmp_path / "run"
    summary = position_loss_probe(loaded, docs, window=96, bucket=32, n=2, seed=1, out=str(out))
    assert summary["by_length"] is True
    items = [json.loads(x) for x in (out / "items.jsonl").read_text().splitlines()]
    assert len(items) == 6
    for r in items:  # each by hand on a freshly loaded model (transformers' dynamic rope keeps its longest length)
        fresh = load_model(str(d), spec)
        r["hand"] = _by_hand(fresh.model, fresh.tokenizer, docs, r, 96, 32, True)
        fresh = load_model(str(d), spec)
        r["whole"] = _by_hand(fresh.model, fresh.tokenizer, docs, r, 96, 32)
        assert r["loss"] == pytest.approx(r["hand"], abs=2e-6)
    # the window's own forward is another model at the buckets before its end (its base is the 96-token one)
    assert all(abs(r["loss"] - r["whole"]) > 4e-6 for r in items if r["bucket"] < 64)
    assert all(r["loss"] == pytest.approx(r["whole"], abs=2e-6) for r in items if r["bucket"] == 64)


def test_command_line_and_corpus_directory(make_tiny_model, chapters, tmp_path, capsys, one_thread):
    from ropescale.probes.cli import main

    _, d = make_tiny_model(orig_ctx=64)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, c in enumerate(chapters[:2]):
        (corpus / f"{i}.txt").write_text(c["text"], encoding="utf-8")
    out = tmp_path / "run"
    assert main(["position-loss", "--model", str(d), "--data", str(corpus), "--n", "2", "--out", str(out)]) == 0
    items = [json.loads(x) for x in (out / "items.jsonl").read_text().splitlines()]
    assert {r["bucket"] for r in items} == set(range(0, 6 * 64, 16))  # defaults: 6x the context, buckets of 16
    assert {r["doc"] for r in items} <= {"0", "1"}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["position-loss", "--model", str(d), "--data", str(empty), "--out", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {empty}: ") and "*.txt" in err[-1]
    assert main(["position-loss", "--model", str(d), "--heldout-of", str(d), "--out", str(tmp_path / "r3")]) == 2
    assert f"--heldout-of {d}: not a tiny build" in capsys.readouterr().err

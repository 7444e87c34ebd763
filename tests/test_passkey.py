"""The passkey probe: the papers' single-key window, the no-key control, the references, the reading by key distance,
the reading functions, the real-model windows (--novels), the loss by
bucket of the same forwards (--bucket, --in-window) and forwards shared by runs (--forwards)."""
from __future__ import annotations

import inspect
import json
import math

import pytest

from ropescale.probes import passkey as pk


def test_single_window_layout(qwen2_tokenizer):
    tok = qwen2_tokenizer
    hay = pk.noise_ids(tok, 2000)
    for L, depth in ((300, 0.0), (512, 0.5), (1024, 0.9)):
        w = pk.single_window(tok, hay, L, depth, "73215")
        assert len(w["ids"]) == L  # every token, the answer included
        assert tok.decode([w["ids"][p] for p in w["answer_pos"]]) == "73215"
        text = tok.decode(w["ids"])
        assert text.count("73215") == 3  # twice in the key sentence, once as the answer
        assert text.endswith("What is the pass key? The pass key is 73215")
        intro = len(pk.encode(tok, pk.INTRO))
        fill = w["answer_pos"][0] - len(pk.encode(tok, pk.SINGLE_QUESTION)) - intro - len(
            pk.encode(tok, pk.SINGLE_KEY.format(n="73215")))
        assert w["key_pos"] - intro == round(depth * fill)  # the key at its depth of the haystack
        c = pk.single_window(tok, hay, L, depth, "73215", with_key=False)  # the no-key control
        ctext = tok.decode(c["ids"])
        assert "pass key is 73215. Remember it" not in ctext and ctext.count("73215") == 1
        assert c["ids"][c["answer_pos"][0] - 12:] == w["ids"][w["answer_pos"][0] - 12:]  # same question + answer


def test_references():
    # the numbers for 3, 6 and 9 keys in context (4K, 8K, 16K of docs/real_model.md): 0.22, 0.36, 0.44
    assert [round(pk.copier_loss(k), 2) for k in (3, 6, 9)] == [0.22, 0.36, 0.44]
    assert pk.UNIFORM == pytest.approx(2.302585, abs=1e-6)
    assert pk.distance_bin(0) == "0-256" and pk.distance_bin(300) == "256-512" and pk.distance_bin(13900) == \
        "8192-16384"


def test_functions_real_model_imports_are_kept():
    for name, params in {"novel_windows": ["tokenizer", "texts", "n", "lengths", "depths", "seed"],
                         "forward_read": ["model", "ids", "chunk", "device"],
                         "key_results": ["window", "arg", "nll", "length"],
                         "bucket_losses": ["window", "nll", "upto", "bucket"]}.items():
        assert list(inspect.signature(getattr(pk, name)).parameters) == params
    assert pk.Window.__dataclass_fields__.keys() >= {"source", "start", "ids", "hay", "keys"}


@pytest.mark.parametrize("keys", ["single", "multi"])
def test_probe_run_and_control(make_tiny_model, tiny_tokenizer, tmp_path, keys, one_thread):
    import torch

    from ropescale.probes.common import load_model

    _, d = make_tiny_model(orig_ctx=64)
    loaded = load_model(str(d))
    out = tmp_path / keys
    summary = pk.passkey_probe(loaded, [], lengths=[512, 1024], depths=[0.2, 0.6], n=1, keys=keys, out=str(out))
    items = [json.loads(x) for x in (out / "items.jsonl").read_text().splitlines()]
    assert len(items) == 4 and all(len(r["digit_loss"]) == len(pk.digit_ids(tiny_tokenizer, r["number"]))
                                   for r in items)
    assert sum(b["n"] for b in summary["by_distance"]) == 4
    assert all(r["value"] in (0.0, 1.0) and "control_loss" in r for r in items)
    r = items[0]
    if keys == "single":  # the control's loss, recomputed from transformers' forward on the control window
        hay = pk.noise_ids(loaded.tokenizer, 2 * 1024 + 64)
        c = pk.single_window(loaded.tokenizer, hay[:r["col"]], r["col"], r["depth"], r["number"], with_key=False)
        with torch.no_grad():
            logits = loaded.model(torch.tensor([c["ids"]])).logits[0]
        lp = torch.log_softmax(logits.float(), -1)
        want = -sum(float(lp[p - 1, c["ids"][p]]) for p in c["answer_pos"]) / len(c["answer_pos"])
        assert r["control_loss"] == pytest.approx(want, abs=1e-4)
        assert r["keys_in_context"] == 1
    else:
        assert max(x["keys_in_context"] for x in items) == 4  # every key of the window precedes the last answers
        for x in items:  # the slot's nominal distance (a label: keys pushed by earlier insertions sit later)
            assert x["back"] == round(x["col"] * (1 - x["depth"]))
            assert x["copier"] == pytest.approx(math.log(x["keys_in_context"]) / 5)
        assert any(b["copier"] is not None and math.isfinite(b["copier"]) for b in summary["by_distance"])
        # --control-upto: the control only for the keys of the shorter length, each equal to the full run's
        part = tmp_path / "upto"
        pk.passkey_probe(loaded, [], lengths=[512, 1024], depths=[0.2, 0.6], n=1, keys=keys, control_upto=512,
                         out=str(part))
        cut = {x["id"]: x for x in map(json.loads, (part / "items.jsonl").read_text().splitlines())}
        assert cut.keys() == {x["id"] for x in items}
        for x in items:
            y = cut[x["id"]]
            assert y["answer_loss"] == pytest.approx(x["answer_loss"], abs=1e-6)
            if x["col"] <= 512:
                assert y["control_loss"] == pytest.approx(x["control_loss"], abs=1e-6)
            else:
                assert "control_loss" not in y


def test_cli_registers_passkey_and_ruler():
    from ropescale.probes.cli import build_parser

    p = build_parser()
    a = p.parse_args(["passkey", "--out", "x", "--keys", "multi"])
    assert a.keys == "multi"
    b = p.parse_args(["ruler", "--out", "x", "--tasks", "vt,cwe"])
    assert b.tasks == ["vt", "cwe"]


def _novels(tmp_path, chars: int = 6000):
    """Two short .txt novels (the first ``chars`` characters of two Austen novels) in a directory."""
    from ropescale.common.paths import DATA_DIR

    d = tmp_path / "novels"
    d.mkdir()
    for name in ("persuasion", "emma"):
        text = (DATA_DIR / "english" / "austen" / f"{name}.txt").read_text(encoding="utf-8")[:chars]
        (d / f"{name}.txt").write_text(text, encoding="utf-8")
    return d


def _nll(model, ids):
    """Per-position next-token loss from transformers' full logits (position 0: none), an independent reference."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none")
    return [float("nan")] + nll.tolist()


def _jsonl(p):
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def test_novel_windows_buckets_and_shared_forwards(make_tiny_model, tiny_tokenizer, tmp_path, one_thread):
    """--novels DIR: window i from novel i (sorted), the windows of ``novel_windows`` for the seed; --bucket: the
    loss a bucket over the novel's tokens from transformers' logits; a rope that follows the length reads its
    in-window buckets from the forward at --in-window (dynamic NTK there: plain RoPE, the unscaled model's forward);
    --forwards: a second run reads the first's forward where the frequencies match, with the same records."""
    from rope_scaling import RopeSpec
    from ropescale.probes.common import load_model

    _, d = make_tiny_model(orig_ctx=1024)
    novels = _novels(tmp_path)
    kw = dict(lengths=[1024, 2048, 4096], depths=[0.3, 0.7], n=2, keys="multi", haystack="novel", bucket=512,
              control=False, novels=[str(novels)], in_window=1024, seed=3)
    base = load_model(str(d))
    s0 = pk.passkey_probe(base, [], out=str(tmp_path / "none"), forwards=str(tmp_path / "fw"), **kw)
    texts = {n: (novels / f"{n}.txt").read_text(encoding="utf-8") for n in ("emma", "persuasion")}  # sorted
    want = pk.novel_windows(tiny_tokenizer, texts, 2, [1024, 2048, 4096], [0.3, 0.7], 3)
    assert [(w["source"], w["start"]) for w in s0["windows"].values()] == [(w.source, w.start) for w in want]
    items = _jsonl(tmp_path / "none" / "items.jsonl")
    assert {(r["window"], r["name"], r["number"]) for r in items} == {(i, k.name, k.number) for i, w in
                                                                      enumerate(want) for k in w.keys}
    for i, w in enumerate(want):
        nll = _nll(base.model, w.ids)
        for file, upto in (("buckets.jsonl", 4096), ("in_window.jsonl", 1024)):
            got = {r["bucket"]: r for r in _jsonl(tmp_path / "none" / file) if r["window"] == i}
            assert sorted(got) == list(range(0, upto, 512))
            for a in range(0, upto, 512):
                pos = [p for p in range(max(a, 1), min(a + 512, upto)) if w.hay[p]]
                assert got[a]["tokens"] == len(pos)
                assert got[a]["loss"] == pytest.approx(sum(nll[p] for p in pos) / len(pos), abs=1e-5), (file, a)
    dyn = load_model(str(d), RopeSpec("dynamic_ntk", 4.0, orig_ctx=1024))
    s1 = pk.passkey_probe(dyn, [], out=str(tmp_path / "dyn"), forwards=str(tmp_path / "fw"), **kw)
    assert all(w["forwards"] == {1024: "read", 2048: "ran", 4096: "ran"} for w in s1["windows"].values())
    alone = pk.passkey_probe(load_model(str(d), RopeSpec("dynamic_ntk", 4.0, orig_ctx=1024)), [],
                             out=str(tmp_path / "alone"), **kw)  # no shared forwards: every length run
    assert all(set(w["forwards"].values()) == {"ran"} for w in alone["windows"].values())
    for f in ("items.jsonl", "buckets.jsonl", "in_window.jsonl"):
        a, b = _jsonl(tmp_path / "dyn" / f), _jsonl(tmp_path / "alone" / f)
        assert [r["id"] for r in a] == [r["id"] for r in b]
        key = "answer_loss" if f == "items.jsonl" else "loss"
        # the same frequencies: the prefix of a longer forward or a forward of its own length (fp32 reductions over
        # other lengths: measured up to 2e-5 of the value on this random model)
        assert [r[key] for r in a] == pytest.approx([r[key] for r in b], rel=1e-4)
    inwin = {(r["window"], r["bucket"]): r["loss"] for r in _jsonl(tmp_path / "dyn" / "in_window.jsonl")}
    plain = {(r["window"], r["bucket"]): r["loss"] for r in _jsonl(tmp_path / "none" / "in_window.jsonl")}
    assert inwin == plain  # read from the unscaled run's forward
    again = pk.passkey_probe(dyn, [], out=str(tmp_path / "dyn"), forwards=str(tmp_path / "fw"), **kw)
    assert again["windows"] == {} and len(_jsonl(tmp_path / "dyn" / "buckets.jsonl")) == len(
        _jsonl(tmp_path / "alone" / "buckets.jsonl"))  # resumed: nothing run again, nothing appended


def test_bucket_needs_multi_keys_and_a_novel_must_exist(make_tiny_model, tmp_path):
    from ropescale.common.io import InputError
    from ropescale.probes.common import load_model

    _, d = make_tiny_model(orig_ctx=64)
    loaded = load_model(str(d))
    with pytest.raises(InputError, match="--bucket reads the forwards of --keys multi"):
        pk.passkey_probe(loaded, [], lengths=[128], depths=[0.5], n=1, bucket=32, out=str(tmp_path / "a"))
    with pytest.raises(InputError, match="no such file"):
        pk.passkey_probe(loaded, [], lengths=[128], depths=[0.5], n=1, keys="multi", haystack="novel",
                         novels=[str(tmp_path / "missing.txt")], out=str(tmp_path / "b"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()

"""The passkey probe (issue 50.4): the papers' single-key window, the no-key control, the references, the reading by
key distance, and the functions scripts/real_model.py imports kept as they were."""
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
        assert any(b["copier"] is not None and math.isfinite(b["copier"]) for b in summary["by_distance"])


def test_cli_registers_passkey_and_ruler():
    from ropescale.probes.cli import build_parser

    p = build_parser()
    a = p.parse_args(["passkey", "--out", "x", "--keys", "multi"])
    assert a.keys == "multi"
    b = p.parse_args(["ruler", "--out", "x", "--tasks", "vt,cwe"])
    assert b.tasks == ["vt", "cwe"]

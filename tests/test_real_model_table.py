"""scripts/real_model.py --quick: the real-model table's code path on SmolLM2-135M in seconds (2 windows of 512
tokens, every row at x2 of an original context of 256), against independent references: the unscaled row's loss by
bucket from plain transformers' full logits, a key's retrieval from greedy generation, and the rows whose frequencies
equal another's read from that row's forward (dynamic YaRN: plain RoPE within the window, YaRN x2 at 2x)."""
from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from ropescale.common.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import real_model as script


@pytest.fixture(scope="module")
def quick(smollm2, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real_model_quick")
    page = tmp / "real_model.md"
    assert script.main(["--quick", "--out", str(page), "--work", str(tmp), "--model", str(smollm2)]) == 0
    rows = [json.loads(ln) for ln in (tmp / "results.jsonl").read_text().splitlines()]
    return {"page": page, "work": tmp, "rows": rows, "text": page.read_text()}


def test_the_page_has_every_row_with_n_and_intervals(quick):
    text = quick["text"]
    assert "scripts/real_model.py --quick" in text and "load average" in text
    names = ["none", "yarn", "dynamic_yarn", "pi", "ntk", "dynamic_ntk", "llama3", "longrope (YaRN's factors)",
             "abf (base 1e+06)", "self_extend G=4 W=64", "dca C=192 L=32"]
    table_a = text.split("### A.")[1].split("### B.")[0]
    for n in names:
        line = next(ln for ln in table_a.splitlines() if ln.startswith(f"| {n} |"))
        # 2 passkey cells + the in-window cost (the unscaled row is the reference: 0 by construction)
        assert line.count("(n=4)") == 2 and line.count("[") >= (2 if n == "none" else 3), line
        assert "[0, 0]" not in line, line  # a proportion's interval is never [0, 0]
    assert len(quick["rows"]) == 2 * len(names)
    assert script.READING in text


def test_unscaled_loss_by_bucket_equals_plain_transformers(quick, smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    plan = script.QUICK
    w = script.windows(plan, AutoTokenizer.from_pretrained(str(smollm2)))[0]
    m = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = m(input_ids=torch.tensor([w.ids])).logits[0]
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(w.ids[1:]), reduction="none")
    row = next(r for r in quick["rows"] if r["row"] == "none" and r["window"] == 0)
    for b, got in enumerate(row["buckets"]):
        pos = [p for p in range(max(1, b * plan.bucket), (b + 1) * plan.bucket) if w.hay[p]]
        want = float(nll[[p - 1 for p in pos]].mean())
        assert got == pytest.approx(want, abs=1e-4), b
    # a key: retrieved exactly when greedy decoding after its question writes its number
    k = w.keys[0]
    out = m.generate(input_ids=torch.tensor([w.ids[:k.answer_pos[0]]]), do_sample=False, max_new_tokens=5,
                     min_new_tokens=5, pad_token_id=0)[0, k.answer_pos[0]:].tolist()
    got = next(x for x in row["keys"] if x["name"] == k.name)
    assert got["retrieved"] == (out == [w.ids[p] for p in k.answer_pos])


def test_equal_frequencies_reuse_a_forward_and_a_rerun_resumes(quick, smollm2):
    dyn = next(r for r in quick["rows"] if r["row"] == "dynamic_yarn" and r["window"] == 0)
    assert dyn["forwards"] == {"256": {"reused": "none"}, "512": {"reused": "yarn"}}
    yarn = next(r for r in quick["rows"] if r["row"] == "yarn" and r["window"] == 0)
    assert dyn["buckets"] == yarn["buckets"] and not math.isnan(dyn["inwin_buckets"][1])
    n = len(quick["rows"])
    assert script.main(["--quick", "--out", str(quick["page"]), "--work", str(quick["work"]),
                        "--model", str(smollm2)]) == 0
    assert len((quick["work"] / "results.jsonl").read_text().splitlines()) == n


def test_the_attention_rows_run_their_own_forward_and_equal_plain_attention_where_the_papers_say(quick):
    """Self-Extend (G, W) and DCA (C, L) keep the model's RoPE, so a cache keyed by the frequencies alone would hand
    them the unscaled row's forward: each runs its own. Where the papers' position rules change nothing -- DCA within
    its first chunk of s = C - L = 160 positions (Sec 3: intra-chunk positions are the true ones) -- the loss equals
    the unscaled row's (bucket 0: positions 1-127); past it, and for Self-Extend past W = 64, it does not. Settings:
    W = orig / 4, G the smallest power of two dividing W whose reach (orig - W) G + W covers 2x (LongLM's rule)."""
    assert list(script.attention_rows(script.QUICK)) == ["self_extend G=4 W=64", "dca C=192 L=32"]
    assert list(script.attention_rows(script.Plan())) == ["self_extend G=4 W=2048", "dca C=6144 L=1024"]
    assert (8192 - 2048) * 2 + 2048 < 16384 <= (8192 - 2048) * 4 + 2048  # G = 2 does not cover 16K, G = 4 does
    by = {(r["row"], r["window"]): r for r in quick["rows"]}
    for w in (0, 1):
        none, se, dca = by[("none", w)], by[("self_extend G=4 W=64", w)], by[("dca C=192 L=32", w)]
        assert all("seconds" in f for r in (se, dca) for f in r["forwards"].values())  # never "reused"
        assert dca["buckets"][0] == pytest.approx(none["buckets"][0], abs=1e-4)
        assert abs(dca["buckets"][3] - none["buckets"][3]) > 1e-3
        assert abs(se["buckets"][0] - none["buckets"][0]) > 1e-4 and abs(se["buckets"][3] - none["buckets"][3]) > 1e-3


def test_a_quick_run_never_writes_the_committed_page():
    """Issue 48 (1): --quick without --out / --work wrote docs/real_model.md and appended toy records to the committed
    docs/real_model/results.jsonl; its default is now under runs/ (ignored by git)."""
    page, work = script.outputs(True, None, None)
    docs = REPO_ROOT / "docs"
    assert not page.resolve().is_relative_to(docs) and not work.resolve().is_relative_to(docs)
    assert page.resolve().is_relative_to(REPO_ROOT / "runs")
    assert script.outputs(False, None, None) == (docs / "real_model.md", docs / "real_model")
    assert script.outputs(True, "x.md", "w") == (__import__("pathlib").Path("x.md"), __import__("pathlib").Path("w"))


def test_passkey_cells_are_wilson_intervals_and_the_copier_reference():
    from scipy.stats import binomtest

    for k in (0, 1, 9):
        ci = binomtest(k, 9).proportion_ci(0.95, method="wilson")
        assert script.pct([True] * k + [False] * (9 - k)) == (
            f"{100 * k / 9:.0f} [{100 * ci.low:.0f}, {100 * ci.high:.0f}] (n=9)")
    assert script.pct([False] * 9) == "0 [0, 30] (n=9)"  # never [0, 0]
    assert script.copier_loss(3) == pytest.approx(math.log(3) / 5)
    assert script.t_cell([1.0, 2.0, 3.0], spread=False) == "2.00 [-0.48, 4.48]"  # 2 +- 4.303 * 1 / sqrt(3)

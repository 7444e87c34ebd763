"""Issue 32 item 5: the probes run the methods that follow the length as every stage does. The ppl probe's cells
with dynamic_yarn and with longrope on a tiny test model (orig 64), item by item, against the model as plain
transformers runs it with a fixed rope for that input length: static ``yarn`` at factor N / orig past the original
context and plain RoPE within it (the YaRN paper's dynamic scaling, Sec 3.3), and a ``longrope`` config whose two
lists both hold the set LongRoPE takes at N (short within the original context, long past it)."""
from __future__ import annotations

import json

import pytest
import torch

from rope_scaling import RopeSpec, apply_rope
from rope_scaling.spec import LongRopeFactors

ORIG = 64
SHORT = [1.0 + 0.05 * i for i in range(8)]
LONG = [1.0 + 3.0 * (i / 7) ** 1.5 for i in range(8)]
LENGTHS = [48, 100, 256]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Tiny forwards on one thread (conftest.one_thread)."""


@pytest.fixture(scope="module")
def setup(make_tiny_model, chapters, tmp_path_factory):
    model, d = make_tiny_model("qwen2", orig_ctx=ORIG, seed=7)
    g = torch.Generator().manual_seed(7)  # larger weights: losses that depend on the rope
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    model.save_pretrained(d)
    data = tmp_path_factory.mktemp("docs") / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": c["text"]}, ensure_ascii=False) + "\n" for c in chapters[:2]),
                    encoding="utf-8")
    return d, data


def reference(d, method: str, L: int):
    """The model with the rope the method runs at length L, written as a fixed transformers config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(d))
    if method == "dynamic_yarn" and L > ORIG:
        apply_rope(cfg, RopeSpec("yarn", L / ORIG))
    elif method == "longrope":
        f = LONG if L > ORIG else SHORT
        apply_rope(cfg, RopeSpec("longrope", 4, longrope_factors=LongRopeFactors(f, f)))
    return AutoModelForCausalLM.from_pretrained(str(d), config=cfg, dtype=torch.float32).eval()


@pytest.mark.parametrize("method", ["dynamic_yarn", "longrope"])
def test_ppl_cells_follow_the_length(method, setup, tmp_path, tiny_tokenizer):
    from ropescale.probes.common import load_model
    from ropescale.probes.data import load_docs
    from ropescale.probes.ppl import ppl_probe

    d, data = setup
    spec = RopeSpec(method, 4, longrope_factors=LongRopeFactors(SHORT, LONG) if method == "longrope" else None)
    docs = load_docs(data)
    ppl_probe(load_model(d, spec), docs, n=2, lengths=LENGTHS, target_len=10, batch_size=2, out=str(tmp_path / "r"),
              data=str(data))
    items = [json.loads(x) for x in (tmp_path / "r" / "items.jsonl").read_text().splitlines()]
    assert len(items) == 2 * len(LENGTHS)
    ids = {doc.id: tiny_tokenizer(doc.text, add_special_tokens=False)["input_ids"] for doc in docs}
    losses = {}
    for L in LENGTHS:
        ref = reference(d, method, L)
        for it in (i for i in items if i["col"] == L):
            s = it["target_start"]
            x = torch.tensor([ids[it["doc"]][s - it["prefix_len"]:s + 10]])
            with torch.no_grad():
                logits = ref(input_ids=x).logits[0, -11:-1]
            want = torch.nn.functional.cross_entropy(logits, x[0, -10:]).item()
            assert it["value"] == pytest.approx(want, abs=1e-4), (method, L)
            losses[L] = want
    assert len(set(round(v, 3) for v in losses.values())) == len(LENGTHS)  # the lengths differ: a test that can fail

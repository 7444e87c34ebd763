"""Issue 32 item 5 / acceptance: config -> LoRA fine-tune export -> ``finetune.py merge`` -> plain
``AutoModelForCausalLM.from_pretrained`` (no code of this repo) gives the in-process model's logits, for longrope
and llama3 at lengths below, at and past the original context (transformers runs both from the written entries).

dynamic_yarn has no transformers type: the merged config says static ``yarn`` x s (plus the ``ropescale_rope``
record saying dynamic). What plain transformers gets is static YaRN x s at every length: the in-process logits at
L = orig x s only, another rope below (checked to differ); this repo's loader (``rope_scaling.load``) reads the
record and gives the in-process logits at every length."""
from __future__ import annotations

import json
import math

import pytest
import torch

from rope_scaling import RopeSpec, read_rope
from rope_scaling.spec import LongRopeFactors
from ropescale.training.cli import main as finetune_main

ORIG, PAIRS = 64, 8  # the tiny test models: original context 64, head_dim 16
LONGROPE = LongRopeFactors([1.0 + 0.1 * i for i in range(PAIRS)], [1.0 + 3.0 * (i / 7) ** 1.5 for i in range(PAIRS)])
SPECS = {
    "longrope": RopeSpec("longrope", 4, longrope_factors=LONGROPE),
    "llama3": RopeSpec("llama3", 4, llama3_low=1.0, llama3_high=2.0),
    "dynamic_yarn": RopeSpec("dynamic_yarn", 4),
}
LENGTHS = (40, 100, 256)  # below the original context (64), between, and orig x 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Tiny forwards on one thread (conftest.one_thread)."""


def merged(make_tiny_model, tmp_path, spec):
    """The in-process fine-tuned model (LoRA with non-zero B, so the merge matters) and the merged directory."""
    from rope_scaling.load import load_config
    from ropescale.training.model import add_lora, load_model
    from ropescale.training.saving import export

    _, model_dir = make_tiny_model("qwen2", orig_ctx=ORIG, seed=5)
    cfg = load_config(model_dir, spec)
    model = load_model(cfg, torch.float32, "sdpa")
    peft_model, extra = add_lora(model, gradient_checkpointing=False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"kind": "finetune", "model": str(model_dir)}))
    export(peft_model, run / "final", extra_names=extra, base_model=str(model_dir), config=cfg.config,
           rope=read_rope(cfg.config).to_dict(), step=0, tokenizer_dir=model_dir)
    assert finetune_main(["merge", "--run", str(run), "--out", str(tmp_path / "merged"), "--dtype", "fp32"]) == 0
    return peft_model.eval(), tmp_path / "merged"


def logits(model, ids, L):
    with torch.no_grad():
        return model(input_ids=ids[:, :L]).logits


@pytest.mark.parametrize("method", sorted(SPECS))
def test_merged_model_reloads_in_plain_transformers(method, make_tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from rope_scaling.load import load_config, load_model

    ours, out = merged(make_tiny_model, tmp_path, SPECS[method])
    plain = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = torch.randint(1, 500, (1, max(LENGTHS)), generator=torch.Generator().manual_seed(1))
    for L in LENGTHS:
        want = logits(ours, ids, L)
        diff = (logits(plain, ids, L) - want).abs().max().item()
        if method != "dynamic_yarn" or L == ORIG * 4:
            assert diff < 1e-4, (method, L, diff)
        else:  # plain transformers: static YaRN x 4 at every length, not the in-process rule below orig x 4
            assert diff > 1e-2, (method, L, diff)
        with ours.disable_adapter():
            assert (logits(ours, ids, L) - want).abs().max().item() > 1e-2  # the LoRA matters (and was merged)
    if method == "dynamic_yarn":
        assert plain.config.rope_parameters["rope_type"] == "yarn"
        ours_again = load_model(out, load_config(out).config, dtype=torch.float32, attn="sdpa").eval()
        for L in LENGTHS:
            assert (logits(ours_again, ids, L) - logits(ours, ids, L)).abs().max().item() < 1e-4, L
    else:
        rp = plain.config.rope_parameters
        assert rp["rope_type"] == method
        if method == "longrope":
            assert rp["long_factor"] == pytest.approx(list(LONGROPE.long_factor))
            assert math.isclose(rp.get("attention_factor") or math.sqrt(1 + math.log(4) / math.log(ORIG)),
                                math.sqrt(1 + math.log(4) / math.log(ORIG)))

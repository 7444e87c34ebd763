"""Shared by tests/test_real_model_rope*.py: one RoPE method on SmolLM2-135M through this repo (a RopeSpec applied
by ``rope_scaling.load``, as every command loads a model) against the same model with transformers' own rope type
written into its config by hand, on 2,048 tokens of Pride and Prejudice (fp32)."""
from __future__ import annotations

import torch

BASE, ORIG = 100000.0, 8192  # SmolLM2-135M's rope_theta and context (its config.json)
TOL = 1e-4  # max |logit difference| allowed (measured: see each test file)


def ours(model_dir, spec):
    from rope_scaling.load import load_config, load_model

    cfg = load_config(model_dir, spec)
    return load_model(model_dir, cfg.config, dtype=torch.float32, attn="sdpa", state=cfg.state).eval()


def theirs(model_dir, entries: dict, max_pos: int):
    """transformers' own rope type: the entries written by hand (nothing of this repo)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(model_dir))
    cfg.rope_parameters = {"rope_theta": BASE, **entries}
    cfg.max_position_embeddings = max_pos
    return AutoModelForCausalLM.from_pretrained(str(model_dir), config=cfg, dtype=torch.float32,
                                                attn_implementation="sdpa").eval()


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def compare(model_dir, ids, spec, entries: dict, max_pos: int) -> tuple[float, torch.Tensor]:
    """(max |ours - theirs| over every position and vocabulary entry, a strided sample of ours for the teeth)."""
    a = logits(ours(model_dir, spec), ids)
    b = logits(theirs(model_dir, entries, max_pos), ids)
    return float((a - b).abs().max()), a[::64].clone()

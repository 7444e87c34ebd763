"""``rope_scaling describe`` prints the ABF base matched to a setting's pre-training angle bound
(``rope_scaling.bounds.matched_base``): on SmolLM2's numbers (head_dim 64, rope_theta 1e5, 8,192 tokens) under YaRN
x2, the printed base's own angle bound -- worked here from the inv_freq formula b^(-2i/d) -- is the printed bound."""
from __future__ import annotations

import math
import re

import pytest

from rope_scaling.bounds import reach
from rope_scaling.describe import main as describe_main

D, THETA, CTX = 64, 1e5, 8192


@pytest.fixture
def smollm2_config(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, head_dim=D, intermediate_size=256,
                num_hidden_layers=1, vocab_size=64, max_position_embeddings=CTX, rope_theta=THETA
                ).save_pretrained(tmp_path)
    return str(tmp_path)


def inv_freq(base: float) -> list[float]:
    """RoPE's inverse frequencies base^(-2i/d), i < d/2 (Su et al. 2021, Eq. 15)."""
    return [base ** (-2 * i / D) for i in range(D // 2)]


def describe_text(capsys, *argv) -> str:
    assert describe_main(list(argv)) == 0
    return capsys.readouterr().out


def test_matched_base_has_the_printed_bound(capsys, smollm2_config):
    out = describe_text(capsys, "--config", smollm2_config, "--rope", "yarn", "--scale", "2")
    bound = float(re.search(r"angle bound \(pre-training\): (\d+) tokens", out).group(1))
    base = float(re.search(r"ABF matched to this bound: base (\S+) \(bounds\.matched_base\)", out).group(1))
    assert bound == 2 * CTX  # YaRN x2: the lowest pairs are interpolated by exactly 2
    assert base == pytest.approx(3.03e5, rel=2e-3)
    # the printed base's bound over the unscaled frequencies (the base is printed to 6 digits)
    assert reach(CTX, inv_freq(THETA), inv_freq(base)) == pytest.approx(bound, rel=1e-4)
    assert reach(CTX, inv_freq(THETA), inv_freq(THETA)) == CTX  # the model's own base does not reach it
    # the first bounded pair i0 (8192 x 1e5^(-2i/64) < 2 pi from i = 20) binds: b' = 1e5 x 2^(64 / (2 x 20))
    assert min(i for i, f in enumerate(inv_freq(THETA)) if CTX * f < 2 * math.pi) == 20
    assert base == pytest.approx(THETA * 2 ** (D / 40), rel=1e-5)


def test_abf_at_the_matched_base_matches_itself(capsys, smollm2_config):
    base = THETA * 2 ** (D / 40)
    out = describe_text(capsys, "--config", smollm2_config, "--rope", "abf", "--rope-base", f"{base:.17g}")
    printed = float(re.search(r"ABF matched to this bound: base (\S+) ", out).group(1))
    assert printed == pytest.approx(base, rel=1e-5)


def test_no_matched_base_without_a_bound(capsys):
    # head_dim 8, base 10, 4,096 tokens: every pair turned a full circle, the bound is none
    out = describe_text(capsys, "--head-dim", "8", "--rope-theta", "10", "--orig-ctx", "4096", "--rope", "yarn",
                        "--scale", "2")
    assert "angle bound: none" in out and "ABF matched" not in out

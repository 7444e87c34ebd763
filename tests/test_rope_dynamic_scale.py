"""Dynamic NTK's effective NTK scale at a length (rope_scaling.formulas.dynamic_ntk_scale) against transformers'
own ``_compute_dynamic_ntk_parameters`` on SmolLM2-135M's config numbers, and the row label that states it."""
import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import _compute_dynamic_ntk_parameters

from rope_scaling import RopeSpec
from rope_scaling.bounds import reach
from rope_scaling.formulas import dynamic_ntk_scale

D, BASE, L0 = 64, 1e5, 8192


def hf_inv_freq(seq_len: int, factor: float = 2.0) -> list[float]:
    cfg = LlamaConfig(hidden_size=576, num_attention_heads=9, head_dim=D, max_position_embeddings=L0,
                      rope_parameters={"rope_type": "dynamic", "rope_theta": BASE, "factor": factor})
    inv, _ = _compute_dynamic_ntk_parameters(cfg, torch.device("cpu"), seq_len=seq_len)
    return inv.double().tolist()


def ntk_inv(s: float) -> list[float]:
    """bloc97's NTK-aware base b * s^(d/(d-2)), RoFormer's theta_i = b'^(-2i/d), written out here."""
    b = BASE * s ** (D / (D - 2))
    return [b ** (-2 * i / D) for i in range(D // 2)]


@pytest.mark.parametrize("seq_len, factor", [(16384, 2.0), (32768, 2.0), (12000, 2.0), (32768, 4.0), (4096, 2.0)])
def test_effective_scale_is_transformers_dynamic_rule(seq_len, factor):
    s = dynamic_ntk_scale(factor, seq_len, L0)
    # transformers' inverse frequencies at seq_len are plain NTK at the effective scale (float32: rel 1e-6)
    assert hf_inv_freq(seq_len, factor) == pytest.approx(ntk_inv(s), rel=1e-6)


def test_smollm2_at_16k_runs_ntk_x3():
    assert dynamic_ntk_scale(2.0, 16384, L0) == 3.0
    assert dynamic_ntk_scale(2.0, 4096, L0) == 1.0  # inside the window: the model's own rope
    hf = hf_inv_freq(16384)
    base = hf[1] ** (-D / 2)  # theta_1 = b^(-2/64)
    assert 3.10e5 < base < 3.12e5  # the 3.11e5 (1e5 * 3^(64/62) = 3.107e5)
    bound = reach(L0, [BASE ** (-2 * i / D) for i in range(D // 2)], hf)
    assert math.floor(bound) == 16642  # 8192 * 3^(40/62), the first bounded pair 20


def test_describe_states_the_effective_scale():
    """``rope describe --seq-len L`` of dynamic NTK names the NTK scale transformers' rule runs at L: x2 read at
    16K is NTK x3, at 32K NTK x7 (s L / L0 - (s - 1))."""
    from transformers import LlamaConfig

    from rope_scaling.describe import describe, format_table

    cfg = LlamaConfig(hidden_size=576, num_attention_heads=9, head_dim=D, max_position_embeddings=L0,
                      rope_parameters={"rope_type": "default", "rope_theta": BASE})
    for L, s in ((16384, 3), (32768, 7), (8192, 1)):
        text = format_table(describe(cfg, RopeSpec("dynamic_ntk", 2.0, orig_ctx=L0), seq_len=L))
        assert f"(dynamic NTK at seq_len {L}: NTK x{s} there)" in text, text.splitlines()[:2]

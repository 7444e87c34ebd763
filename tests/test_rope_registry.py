"""Issue 26.3: one reader of RoPE in an HF config. Every HF rope type a config can carry is read back by the one
registry entry that writes it (formulas.HF_READERS), and vLLM's settings come from that reader and the registry's
attention factor, not from a second parse."""
from __future__ import annotations

import math

import pytest

from rope_scaling import RopeSpec
from rope_scaling.formulas import HF_READERS, REGISTRY, hf_entries
from rope_scaling.hf import _from_entries, rope_entries


def test_every_hf_type_has_exactly_one_reader_and_it_is_the_writer():
    # the HF types transformers 4.x/5.x define for these models, each read by one method
    assert set(HF_READERS) == {"default", "linear", "dynamic", "yarn", "llama3", "longrope"}
    for t, m in HF_READERS.items():
        assert m.reads == t and m.from_hf is not None
    # ntk and abf write "default" too, but only none reads it back (a base alone cannot say which it was)
    assert REGISTRY["ntk"].reads is None and REGISTRY["abf"].reads is None
    # dynamic_yarn writes static "yarn" (HF has no dynamic YaRN): only its ropescale_rope record says dynamic
    assert REGISTRY["dynamic_yarn"].reads is None and HF_READERS["yarn"].name == "yarn"


@pytest.mark.parametrize("spec", [
    RopeSpec("dynamic_ntk", 2, orig_ctx=4096),
    RopeSpec("yarn", 16, orig_ctx=4096, yarn_alpha=0.1, yarn_beta=32), RopeSpec("yarn", 8, orig_ctx=2048,
                                                                                yarn_mscale=1.3),
    RopeSpec("llama3", 8, orig_ctx=8192, llama3_low=1, llama3_high=4),
])
def test_written_entries_read_back_as_the_same_spec(spec):
    entries, max_pos = hf_entries(spec, 10000.0, 128)
    cfg = {"rope_parameters": entries, "max_position_embeddings": max_pos, "head_dim": 128}
    assert _from_entries(cfg, rope_entries(cfg)[1]).same_rope(spec)


def test_linear_entries_alone_take_max_positions_as_the_original_context():
    """HF's linear entries carry no original context (what apply_rope writes keeps it in its own record)."""
    entries, max_pos = hf_entries(RopeSpec("pi", 4, orig_ctx=4096), 10000.0, 128)
    assert max_pos == 16384
    cfg = {"rope_parameters": entries, "max_position_embeddings": 4096, "head_dim": 128}
    assert _from_entries(cfg, rope_entries(cfg)[1]) == RopeSpec("pi", 4, orig_ctx=4096)


def test_rope_entries_says_where_the_rope_lives_in_both_layouts():
    v5 = {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}, "max_position_embeddings": 8}
    v4 = {"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 5e5, "max_position_embeddings": 8}
    for cfg, key in ((v5, "rope_parameters"), (v4, "rope_scaling")):
        k, e = rope_entries(cfg)
        assert k == key and e["rope_type"] == "linear" and e["factor"] == 2.0 and e["rope_theta"] == 5e5


@pytest.mark.parametrize("layout", ["4", "5"])
def test_vllm_yarn_factor_is_the_registry_formula_in_both_layouts(layout):
    from ropescale.evaluation.backends import vllm_settings

    spec = RopeSpec("yarn", 4, orig_ctx=64)
    entries, max_pos = hf_entries(spec, 10000.0, 16)
    cfg = {"max_position_embeddings": max_pos, "head_dim": 16, "hidden_size": 64, "num_attention_heads": 4}
    if layout == "5":
        cfg["rope_parameters"] = entries
    else:
        cfg["rope_theta"] = entries.pop("rope_theta")
        cfg["rope_scaling"] = {**entries, "type": "yarn"}
    ov, mml = vllm_settings(cfg, {}, need=100, want=200)
    rope = ov["rope_parameters" if layout == "5" else "rope_scaling"]
    hand = 0.1 * math.log(4) + 1  # YaRN Sec 3.4: sqrt(1/t) = 0.1 ln s + 1
    assert rope["attention_factor"] == pytest.approx(hand) and rope["attn_factor"] == pytest.approx(1.0)
    assert mml == 200 and ("rope_theta" in rope) == (layout == "5")

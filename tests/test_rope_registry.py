"""Issue 26.3: one reader of RoPE in an HF config. Every HF rope type a config can carry is read back by the one
registry entry that writes it (formulas.hf_readers), and vLLM's settings come from that reader and the registry's
attention factor, not from a second parse."""
from __future__ import annotations

import json
import math

import pytest

from rope_scaling import RopeSpec
from rope_scaling.formulas import REGISTRY, hf_entries, hf_readers
from rope_scaling.hf import rope_entries, spec_from_entries


def test_every_hf_type_has_exactly_one_reader_and_it_is_the_writer():
    # the HF types transformers 4.x/5.x define for these models, each read by one method
    assert set(hf_readers()) == {"default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional"}
    for t, m in hf_readers().items():
        assert m.reads == t and m.from_hf is not None
    # ntk and abf write "default" too, but only none reads it back (a base alone cannot say which it was)
    assert REGISTRY["ntk"].reads is None and REGISTRY["abf"].reads is None
    # dynamic_yarn writes static "yarn" (HF has no dynamic YaRN): only its ropescale_rope record says dynamic
    assert REGISTRY["dynamic_yarn"].reads is None and hf_readers()["yarn"].name == "yarn"


@pytest.mark.parametrize("spec", [
    RopeSpec("dynamic_ntk", 2, orig_ctx=4096),
    RopeSpec("yarn", 16, orig_ctx=4096, yarn_alpha=0.1, yarn_beta=32), RopeSpec("yarn", 8, orig_ctx=2048,
                                                                                yarn_mscale=1.3),
    RopeSpec("llama3", 8, orig_ctx=8192, llama3_low=1, llama3_high=4),
])
def test_written_entries_read_back_as_the_same_spec(spec):
    entries, max_pos = hf_entries(spec, 10000.0, 128)
    cfg = {"rope_parameters": entries, "max_position_embeddings": max_pos, "head_dim": 128}
    assert spec_from_entries(cfg, rope_entries(cfg)[1]).same_rope(spec)


def test_linear_entries_alone_take_max_positions_as_the_original_context():
    """HF's linear entries carry no original context (what apply_rope writes keeps it in its own record)."""
    entries, max_pos = hf_entries(RopeSpec("pi", 4, orig_ctx=4096), 10000.0, 128)
    assert max_pos == 16384
    cfg = {"rope_parameters": entries, "max_position_embeddings": 4096, "head_dim": 128}
    assert spec_from_entries(cfg, rope_entries(cfg)[1]) == RopeSpec("pi", 4, orig_ctx=4096)


def test_rope_entries_says_where_the_rope_lives_in_both_layouts():
    v5 = {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}, "max_position_embeddings": 8}
    v4 = {"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 5e5, "max_position_embeddings": 8}
    for cfg, key in ((v5, "rope_parameters"), (v4, "rope_scaling")):
        k, e = rope_entries(cfg)
        assert k == key and e["rope_type"] == "linear" and e["factor"] == 2.0 and e["rope_theta"] == 5e5


@pytest.mark.parametrize("layout", ["4", "5"])
def test_vllm_yarn_factor_is_the_registry_formula_in_both_layouts(layout):
    from ropescale.evaluation.backends.vllm import vllm_settings

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


# ---------------------------------------------------------------- every registry row, on arrival
# A method's smallest valid setting beyond ``--scale 4 --orig-ctx 64`` (a new method that needs more fails below,
# naming this table). Checked on a Llama config of 8 rotary pairs (head_dim 16), base 1e4, 64 positions.
SHORT, LONG = (1.0, 1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0), (1.0, 1.2, 1.6, 2.2, 3.0, 4.0, 5.0, 6.0)
EXAMPLES = {"none": {"scale": 1.0}, "abf": {"scale": 1.0, "rope_base": 5e5}, "proportional": {"rope_proportion": 0.5},
            "longrope": {"longrope_factors": {"short_factor": SHORT, "long_factor": LONG}}}


def _toy_freqs(d, base, spec, seq_len):
    """theta_i / sqrt(s): interpolation by the square root of the scale (no paper: a row for the test only)."""
    from rope_scaling.formulas import Freqs, rope_inv_freq

    return Freqs([f / math.sqrt(spec.scale) for f in rope_inv_freq(d, base)], 1.0, base)


def _toy_hf(spec, b, d):
    # plain transformers runs it as linear interpolation by sqrt(s); the ropescale_rope record says toy
    return {"rope_type": "linear", "rope_theta": b, "factor": math.sqrt(spec.scale)}, int(spec.orig_ctx * spec.scale)


@pytest.fixture
def toy_method(monkeypatch):
    """One row registered for the length of a test: the whole method (no other file knows it)."""
    from rope_scaling.formulas import REGISTRY, Method

    monkeypatch.setitem(REGISTRY, "toy_sqrt", Method("toy_sqrt", "positions / sqrt(s) (a test's row)", _toy_freqs,
                                                     _toy_hf))
    return "toy_sqrt"


def _base_config():
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                       max_position_embeddings=64, num_hidden_layers=1, vocab_size=32, intermediate_size=32,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _example(name: str) -> RopeSpec:
    from ropescale.common.io import InputError

    try:
        return RopeSpec(**{"method": name, "scale": 4.0, "orig_ctx": 64, **EXAMPLES.get(name, {})})
    except InputError as e:
        pytest.fail(f"{name}: add its smallest valid setting to EXAMPLES in this file ({e})")


def _rotary_cos(model, length: int):
    """cos of the model's own rotary module for positions 0 .. length-1 (its attention factor included)."""
    import torch

    pos = torch.arange(length).unsqueeze(0)
    cos, _ = model.model.rotary_emb(torch.zeros(1, length, 64), pos)
    return cos[0].double()


def _expected_cos(freqs, length: int):
    import torch

    inv = torch.tensor(freqs.inv_freq, dtype=torch.float64)
    ang = torch.arange(length, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang, ang], dim=-1).cos() * freqs.attention_factor


def check_method(name: str, tmp_path, spec: RopeSpec | None = None) -> None:
    """The registry-wide checks of one row (module doc of rope_scaling/formulas.py: the row is the whole method), on
    its smallest valid setting or on ``spec`` (a variant of the row's own fields, e.g. YaRN's DeepSeek form)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from rope_scaling import apply_rope, extended_context, rope_state
    from rope_scaling.describe import describe, format_table
    from rope_scaling.formulas import REGISTRY, frequencies
    from rope_scaling.load import install_rope_rule, load_config
    from ropescale.common.io import InputError
    from ropescale.evaluation.backends.vllm import vllm_settings

    m, spec = REGISTRY[name], spec if spec is not None else _example(name)
    # HF round trip: written as plain entries, saved, reloaded by plain transformers, read back as the same spec
    apply_rope(_base_config(), spec).save_pretrained(tmp_path)
    cfg = AutoConfig.from_pretrained(str(tmp_path))
    st = rope_state(cfg)
    assert st.spec.same_rope(spec) and (st.base, st.orig_ctx, st.rotary_dim) == (10000.0, 64, 16)
    long = extended_context(cfg, st)
    # the formula against transformers' own init function for the type the row writes (at the extended context,
    # where a length rule and its static entries agree), then inside a model: its rotary module, with this repo's
    # runtime rule installed (Method.per_forward), at a length inside the original context and at the extended one
    t = cfg.rope_parameters["rope_type"]
    if t in ROPE_INIT_FUNCTIONS:
        inv, att = ROPE_INIT_FUNCTIONS[t](cfg, "cpu", seq_len=long)
        ours = st.frequencies(long)
        assert ours.inv_freq == pytest.approx(inv.double().tolist(), rel=1e-6)
        assert ours.attention_factor == pytest.approx(float(att), rel=1e-6)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    assert (install_rope_rule(model, st) > 0) == m.per_forward
    with torch.no_grad():
        for length in (48, long):
            want = _expected_cos(st.frequencies(length if m.by_length else None), length)
            assert torch.allclose(_rotary_cos(model, length), want, rtol=1e-5, atol=1e-5), (name, length)
    assert frequencies(spec, 16, 10000.0).inv_freq == st.frequencies().inv_freq
    # Method.one_base: plain RoPE, b^(-2i/d) with no attention factor, at one base b whatever the length (inside the
    # original context and at the extended one) -- the case of Liu et al. 2023's closed form
    at = [st.frequencies(n) for n in (48, long)]
    one_base = at[0].base == at[1].base and all(
        f.inv_freq == pytest.approx([f.base ** (-2 * i / 16) for i in range(8)], rel=1e-9) and f.attention_factor == 1
        for f in at)
    assert one_base == m.one_base, name
    # describe runs, as a table and as JSON, on the config dict
    d = describe(cfg.to_dict(), None)
    assert d["rope"] == name and sum(d["counts"].values()) == 8 and len(d["dims"]) == 8
    assert format_table(d).startswith(f"rope {spec.label()}")
    json.dumps(d)
    # a backend serves it or refuses it in one line: vLLM (its registry rule; the release with LongRoPE's fix)
    mc = load_config(tmp_path)
    try:
        ov, mml = vllm_settings(mc.config, mc.rope_fields(), need=long, want=2 * long, state=mc.state, vllm="0.11.1")
    except InputError as e:
        assert "\n" not in str(e) and "--backend hf" in str(e), str(e)
    else:
        assert isinstance(ov, dict) and long <= mml <= 2 * long


@pytest.mark.parametrize("name", [*REGISTRY, "toy_sqrt"])
def test_every_method_of_the_registry(name, tmp_path, request):
    if name == "toy_sqrt":  # registered by the test itself: covered with no other file touched
        request.getfixturevalue("toy_method")
    check_method(name, tmp_path)


def test_a_registered_row_is_the_whole_method(toy_method):
    """What the toy row gets from the registry alone: --rope's name check, its label, a refusal on vLLM (no rule),
    and no other method's fields."""
    from ropescale.common.io import InputError

    spec = RopeSpec(toy_method, 4, orig_ctx=64)
    assert spec.scaled and spec.label() == "toy_sqrt x4"
    with pytest.raises(InputError, match="--yarn-mscale only applies to --rope yarn, not toy_sqrt"):
        RopeSpec(toy_method, 4, yarn_mscale=1.2)

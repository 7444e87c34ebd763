"""Issue 32 (phase 1): longrope, dynamic_yarn and llama3 as methods one applies, and the fine-tune-aware bound
(issue 31.4), each checked against an independent reference:

- longrope and llama3: transformers' own ``ROPE_INIT_FUNCTIONS`` (inv_freq and attention factor) on the configs
  ``apply_rope`` writes and on a Phi-3-style config.json, at lengths below and above the original context;
- dynamic_yarn: numbers worked by hand from the YaRN reference code's definition (jquesnelle/yarn,
  ``LlamaDynamicYaRNScaledRotaryEmbedding``: s = L / L_orig past the original context, the NTK-by-parts ramp linear
  in the pair index between floor(i(beta)) and ceil(i(alpha)), i(r) = d ln(L_orig / (2 pi r)) / (2 ln b), attention
  0.1 ln s + 1 -- YaRN arXiv 2309.00071 Sec 3.2-3.4);
- the bounds: cases worked by hand (the tiny default: head_dim 64, base 1e4, original context 512).
"""
from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from rope_scaling import InputError, RopeSpec, add_rope_args, apply_rope, read_rope, spec_from_args
from rope_scaling.bounds import critical_dimension, critical_period, finetune_bound, reach
from rope_scaling.describe import main as describe_main
from rope_scaling.formulas import frequencies, hf_entries, rescale_factors
from rope_scaling.hf import plan_rope, rope_entries, rope_state, spec_from_entries
from rope_scaling.spec import LongRopeFactors, read_longrope_factors


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Tiny forwards on one thread (conftest.one_thread)."""


def hf_init(cfg, rope_type, seq_len=None):
    """transformers' own frequencies for ``cfg`` (the independent reference)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv, att = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", seq_len=seq_len)
    return inv.double().tolist(), float(att)


def close(a, b, tol=1e-6):
    assert len(a) == len(b)
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    assert worst <= tol, f"max relative error {worst:.2e} > {tol:g}"


def llama_cfg(head_dim=16, heads=4, max_pos=64, theta=10000.0, **kw):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=head_dim * heads, num_attention_heads=heads, num_key_value_heads=heads,
                       head_dim=head_dim, max_position_embeddings=max_pos, num_hidden_layers=1, vocab_size=32,
                       intermediate_size=32, rope_parameters={"rope_type": "default", "rope_theta": theta}, **kw)


SHORT = (1.0, 1.05, 0.98, 1.1, 1.02, 1.0, 1.07, 1.01)  # not monotone, as Phi-3's short factors are not
LONG = (1.0, 1.2, 1.9, 3.3, 5.0, 7.4, 8.8, 9.5)


def factors(att=None, short=SHORT, long=LONG):
    return LongRopeFactors(short, long, att)


# ---------------------------------------------------------------- longrope
@pytest.mark.parametrize("att", [None, 1.3])
def test_longrope_equals_transformers_below_and_above_the_original_context(att):
    spec = RopeSpec("longrope", 8, orig_ctx=64, longrope_factors=factors(att))
    cfg = apply_rope(llama_cfg(), spec)  # the HF-native entry, as a merged model's config.json carries it
    assert cfg.rope_parameters["rope_type"] == "longrope" and cfg.max_position_embeddings == 512
    assert read_rope(cfg).same_rope(spec)
    want_att = att if att is not None else math.sqrt(1 + math.log(8) / math.log(64))  # HF's default, by hand
    for L in (None, 1, 40, 64, 65, 200, 512, 4096):  # HF: short up to the original context, long past it
        ours = frequencies(read_rope(cfg), 16, 10000.0, L)
        inv, a = hf_init(cfg, "longrope", L)
        close(ours.inv_freq, inv)
        assert ours.attention_factor == pytest.approx(a, rel=1e-12) == pytest.approx(want_att, rel=1e-12)
        lam = LONG if L is not None and L > 64 else SHORT
        close(ours.inv_freq, [10000.0 ** (-2 * i / 16) / lam[i] for i in range(8)], 1e-12)  # theta_i / lambda_i


PHI3_STYLE = {  # the shape Phi-3 / Phi-3.5 ship (4.x layout): no factor, original context beside the rope dict
    "model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 1, "intermediate_size": 32, "vocab_size": 32, "max_position_embeddings": 2048,
    "original_max_position_embeddings": 64, "rope_theta": 10000.0, "partial_rotary_factor": 1.0,
    "rope_scaling": {"type": "longrope", "short_factor": list(SHORT), "long_factor": list(LONG)},
}


def test_phi3_style_config_reads_back_as_the_same_spec(tmp_path):
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps(PHI3_STYLE))
    loaded = AutoConfig.from_pretrained(str(tmp_path))  # transformers 5.x: rope_parameters, orig moved inside
    want = RopeSpec("longrope", 32, orig_ctx=64, longrope_factors=factors())  # factor = 2048 / 64, as HF takes it
    for cfg in (PHI3_STYLE, loaded):
        st = rope_state(cfg)
        assert st.spec.same_rope(want) and st.orig_ctx == 64 and st.rotary_dim == 16
    for L in (None, 64, 65, 2048):
        inv, a = hf_init(loaded, "longrope", L)
        ours = rope_state(loaded).frequencies(L)
        close(ours.inv_freq, inv)
        assert ours.attention_factor == pytest.approx(a, rel=1e-12)
    # the same setting again is a no-op (from a file or not); another one needs --replace
    assert plan_rope(loaded, want).action == "unchanged"
    other = RopeSpec("longrope", 32, orig_ctx=64, longrope_factors=factors(short=LONG))
    with pytest.raises(InputError, match="pass --replace"):
        plan_rope(loaded, other)
    assert plan_rope(loaded, RopeSpec("longrope", 32, longrope_factors=factors(short=LONG), replace=True)).action \
        == "replaced"


def test_partial_rotary_phi4_mini_shape():
    """Phi-4-mini rotates 3/4 of each head: one factor per rotary pair (48 of 64 at head_dim 128)."""
    from transformers import Phi3Config

    short, long = [1.0] * 48, [1.0 + i / 10 for i in range(48)]
    cfg = Phi3Config(hidden_size=1024, num_attention_heads=8, num_key_value_heads=8, num_hidden_layers=1,
                     intermediate_size=32, vocab_size=32, max_position_embeddings=4096, partial_rotary_factor=0.75,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    spec = RopeSpec("longrope", 4, orig_ctx=1024, longrope_factors=LongRopeFactors(short, long))
    apply_rope(cfg, spec)
    assert rope_state(cfg).rotary_dim == 96
    for L in (1024, 1025):
        inv, a = hf_init(cfg, "longrope", L)
        ours = rope_state(cfg).frequencies(L)
        close(ours.inv_freq, inv)
        assert ours.attention_factor == pytest.approx(a, rel=1e-12)
    with pytest.raises(InputError, match="rotary dim 96 needs 48"):
        apply_rope(Phi3Config(hidden_size=1024, num_attention_heads=8, partial_rotary_factor=0.75),
                   RopeSpec("longrope", 4, longrope_factors=LongRopeFactors([1.0] * 64, [1.0] * 64)))


def test_longrope_model_runs_in_plain_transformers(make_tiny_model):
    """The written config loads in plain ``AutoModelForCausalLM``: short factors within the original context, long
    past it (transformers' switch), cos/sin scaled by the attention factor."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _, d = make_tiny_model("qwen2", orig_ctx=64)
    cfg = AutoConfig.from_pretrained(str(d))
    apply_rope(cfg, RopeSpec("longrope", 8, longrope_factors=factors()))
    cfg.save_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(str(d)).eval()
    rot = model.model.rotary_emb
    theta = [10000.0 ** (-2 * i / 16) for i in range(8)]
    close(rot.inv_freq.double().tolist(), [t / x for t, x in zip(theta, SHORT)])
    x = torch.zeros(1, 1, 16)
    for n, lam in ((64, SHORT), (65, LONG)):
        cos, _ = rot(x, torch.arange(n)[None])
        close(rot.inv_freq.double().tolist(), [t / x_ for t, x_ in zip(theta, lam)])
        want = math.sqrt(1 + math.log(8) / math.log(64)) * math.cos((n - 1) * theta[3] / lam[3])
        assert cos[0, -1, 3].item() == pytest.approx(want, rel=1e-5)
    assert read_rope(AutoConfig.from_pretrained(str(d))).same_rope(RopeSpec("longrope", 8, orig_ctx=64,
                                                                            longrope_factors=factors()))


# ---------------------------------------------------------------- dynamic YaRN
def test_dynamic_yarn_by_hand_at_four_lengths():
    # d 8, base 1e4, L_orig 64, alpha 1, beta 32: theta = 1, 0.1, 0.01, 0.001. i(32) = 8 ln(64/(2 pi 32)) /
    # (2 ln 1e4) = -0.50 -> floor -1 -> 0; i(1) = 8 ln(64/(2 pi)) / (2 ln 1e4) = 1.008 -> ceil 2: pair 0 kept, pair 1
    # half-way on the ramp (theta/s * 1/2 + theta * 1/2), pairs 2-3 divided by s. s = max(1, L / 64).
    spec = RopeSpec("dynamic_yarn", 8, orig_ctx=64)
    cases = {
        32: ([1.0, 0.1, 0.01, 0.001], 1.0),  # inside the original context: plain RoPE
        64: ([1.0, 0.1, 0.01, 0.001], 1.0),
        100: ([1.0, 0.1 * (0.5 / 1.5625 + 0.5), 0.01 / 1.5625, 0.001 / 1.5625], 1 + 0.1 * math.log(1.5625)),
        128: ([1.0, 0.075, 0.005, 0.0005], 1 + 0.1 * math.log(2)),
        256: ([1.0, 0.0625, 0.0025, 0.00025], 1 + 0.1 * math.log(4)),
    }
    for L, (inv, att) in cases.items():
        got = frequencies(spec, 8, 10000.0, L)
        close(got.inv_freq, inv, 1e-12)
        assert got.attention_factor == pytest.approx(att, rel=1e-12)
    assert frequencies(spec, 8, 10000.0).inv_freq == cases[64][0]  # no length: the original context


def test_dynamic_yarn_written_as_static_yarn_and_read_back(make_tiny_model):
    """HF has no dynamic YaRN: the config carries static ``yarn`` x s (plain transformers runs that: equal to
    dynamic YaRN at the extended context) and the ropescale_rope record that reads back as dynamic_yarn."""
    from transformers import AutoConfig

    _, d = make_tiny_model("llama", orig_ctx=64)
    cfg = AutoConfig.from_pretrained(str(d))
    spec = RopeSpec("dynamic_yarn", 8, yarn_alpha=2.0, yarn_beta=16.0)
    apply_rope(cfg, spec)
    rp = cfg.rope_parameters
    assert (rp["rope_type"], rp["factor"], rp["original_max_position_embeddings"], rp["beta_fast"], rp["beta_slow"]) \
        == ("yarn", 8.0, 64, 16.0, 2.0) and cfg.max_position_embeddings == 512 and "attention_factor" not in rp
    cfg.save_pretrained(d)
    again = AutoConfig.from_pretrained(str(d))
    st = rope_state(again)
    assert st.spec.same_rope(RopeSpec("dynamic_yarn", 8, orig_ctx=64, yarn_alpha=2.0, yarn_beta=16.0))
    inv, att = hf_init(again, "yarn")
    ours = st.frequencies(512)
    close(ours.inv_freq, inv)
    assert ours.attention_factor == pytest.approx(att, rel=1e-6)
    assert st.frequencies(64).inv_freq == frequencies(RopeSpec(), 16, 10000.0).inv_freq  # and plain RoPE inside
    with pytest.raises(InputError, match="only applies to --rope yarn"):
        RopeSpec("dynamic_yarn", 8, yarn_mscale=1.2)


# ---------------------------------------------------------------- llama3, applied by users
@pytest.mark.parametrize("argv,d,base", [
    (["--scale", "8", "--orig-ctx", "8192"], 128, 500000.0),  # Llama 3.1's own setting
    (["--scale", "4", "--llama3-low-freq-factor", "2", "--llama3-high-freq-factor", "8"], 16, 10000.0),
    (["--scale", "16", "--llama3-low-freq-factor", "0.5", "--llama3-high-freq-factor", "2"], 16, 10000.0),
])
def test_llama3_from_the_flags_equals_transformers(argv, d, base):
    spec = spec_from_args(add_rope_args(argparse.ArgumentParser()).parse_args(["--rope", "llama3", *argv]))
    cfg = apply_rope(llama_cfg(head_dim=d, max_pos=8192 if d == 128 else 64, theta=base), spec)
    st = rope_state(cfg)
    assert st.spec.same_rope(spec if spec.orig_ctx else RopeSpec(**{**spec.to_dict(), "orig_ctx": 64}))
    inv, att = hf_init(cfg, "llama3")
    ours = st.frequencies()
    close(ours.inv_freq, inv)
    assert att == ours.attention_factor == 1.0
    kinds = {round(a / b, 9) for a, b in zip(frequencies(RopeSpec(), d, base).inv_freq, ours.inv_freq)}
    assert 1.0 in kinds and spec.scale in kinds and len(kinds) > 2  # kept, divided by s, and blended pairs


def test_llama3_flags_belong_to_llama3():
    with pytest.raises(InputError, match="only applies to --rope llama3"):
        RopeSpec("yarn", 4, llama3_low=2.0)
    with pytest.raises(InputError, match="low_freq_factor < high_freq_factor"):
        RopeSpec("llama3", 4, llama3_low=4.0, llama3_high=2.0)
    assert RopeSpec("llama3", 8, llama3_low=2.0).label() == "llama3 x8 low=2"


# ---------------------------------------------------------------- factor files and the spec
def write(tmp_path, obj, name="f.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def test_factor_file_reaches_a_frozen_spec_and_its_record(tmp_path):
    a = write(tmp_path, {"short_factor": [1] * 8, "long_factor": list(LONG)}, "a.json")
    b = write(tmp_path, '{"long_factor": [1.0, 1.2, 1.9, 3.3, 5.0, 7.4, 8.8, 9.5],\n'
                        ' "short_factor": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]}', "b.json")
    p = add_rope_args(argparse.ArgumentParser())
    sa = spec_from_args(p.parse_args(["--rope", "longrope", "--scale", "8", "--longrope-factors", str(a)]))
    sb = spec_from_args(p.parse_args(["--rope", "longrope", "--scale", "8", "--longrope-factors", str(b)]))
    assert sa.longrope_factors.source == str(a) and sa.longrope_factors.long_factor == LONG
    assert sa == sb and sa.same_rope(sb) and hash(sa) == hash(sb)  # same numbers, another file: the same setting
    assert sa.label() == sb.label() == f"longrope x8 factors={sa.longrope_factors.short_hash}"
    rec = json.loads(json.dumps(sa.to_dict()))  # what run.json holds
    assert rec["longrope_factors"]["long_factor"] == list(LONG)
    for back in (RopeSpec.from_dict(rec), RopeSpec.from_record(rec)):
        assert back == sa and back.same_rope(sa) and back.label() == sa.label()
    a.unlink()  # a recorded run never needs the file again
    assert RopeSpec.from_record(rec) == sa
    other = RopeSpec("longrope", 8, longrope_factors=factors())
    assert not other.same_rope(sa) and other.label() != sa.label()
    assert RopeSpec("longrope", 8, longrope_factors=factors(1.2)).label() != other.label()  # attention counts


def test_factor_file_in_a_recipe(tmp_path):
    from ropescale.common.settings import read_recipe

    f = write(tmp_path, {"short_factor": [1.0] * 8, "long_factor": list(LONG), "attention_factor": 1.25})
    r = write(tmp_path, f"rope: longrope\nscale: 8\nlongrope_factors: {f}\n", "r.yaml")
    got = read_recipe(r, RopeSpec)
    assert got["longrope_factors"] == LongRopeFactors([1.0] * 8, LONG, 1.25)


@pytest.mark.parametrize("content,words", [
    ({"short_factor": [1.0] * 8, "long_factor": [1.0] * 7}, "short_factor has 8 values, long_factor 7"),
    ({"short_factor": [1.0] * 8, "long_factor": [1.0] * 7 + [0.0]}, "long_factor values must be finite numbers > 0"),
    ({"short_factor": [1.0] * 8, "long_factor": [1.0] * 7 + [-2]}, "got -2 (at index 7)"),
    ('{"short_factor": [1, 1, 1, 1, 1, 1, 1, NaN], "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]}', "finite numbers > 0"),
    ({"short_factor": [1.0] * 8, "long_factor": [1.0] * 8, "attention_factor": 0}, "attention_factor must be"),
    ({"short_factor": [1.0] * 8}, "no long_factor"),
    ({"short_factor": [1.0] * 8, "long_factor": [1.0] * 8, "scale": 8}, "unknown key(s) scale"),
    ({"short_factor": "1,1", "long_factor": [1.0] * 8}, "short_factor must be a non-empty list"),
    ('{"short_factor": [1.0],\n oops}', ":2: malformed JSON"),
    ([1.0, 2.0], "expected a JSON object"),
])
def test_bad_factor_files_are_one_line_naming_the_file(tmp_path, capsys, content, words):
    f = write(tmp_path, content)
    with pytest.raises(InputError) as e:
        read_longrope_factors(f)
    assert str(e.value).startswith(str(f)) and words in str(e.value) and "\n" not in str(e.value)
    rc = describe_main(["--config", "assets/tiny", "--rope", "longrope", "--scale", "8", "--longrope-factors",
                        str(f)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"error: {f}") and words in err and err.count("\n") == 1


def test_factor_length_is_checked_against_the_model(tmp_path, capsys):
    f = write(tmp_path, {"short_factor": [1.0] * 8, "long_factor": list(LONG)})  # 8 pairs: head_dim 16
    rc = describe_main(["--config", "assets/tiny", "--rope", "longrope", "--scale", "8", "--longrope-factors", str(f)])
    err = capsys.readouterr().err
    assert rc == 2 and err == f"error: {f}: short_factor has 8 values; this model's rotary dim 64 needs 32 " \
                              f"(one per pair)\n"
    with pytest.raises(InputError, match=f"{f}: 8 factors per list; rotary dim 64 needs 32"):
        read_longrope_factors(f, rotary_dim=64)


def test_monotone_when_asked(tmp_path):
    f = write(tmp_path, {"short_factor": [1.0] * 8, "long_factor": [1.0, 2.0, 3.0, 2.5, 4, 5, 6, 7]})
    assert read_longrope_factors(f).long_factor[3] == 2.5  # not asked: a factor file may be any shape
    with pytest.raises(InputError, match=r"f.json: long_factor is not monotone: value 3 \(2.5\) is below value 2"):
        read_longrope_factors(f, monotone=True)


def test_longrope_on_the_tiny_default_describes(tmp_path, capsys):
    f = write(tmp_path, {"short_factor": [1.0] * 32, "long_factor": [1.0 + 7 * i / 31 for i in range(32)]})
    assert describe_main(["--config", "assets/tiny", "--rope", "longrope", "--scale", "8", "--longrope-factors",
                          str(f), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rope"] == "longrope" and d["extended_context"] == 4096 and d["seq_len"] == 4096
    assert [r["ratio"] for r in d["dims"]] == pytest.approx([1.0 + 7 * i / 31 for i in range(32)])
    assert d["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(8) / math.log(512)))


def test_written_entries_read_back_as_the_same_spec():
    for spec in (RopeSpec("longrope", 8, orig_ctx=4096, longrope_factors=LongRopeFactors([1.0] * 64,
                                                                                           [2.0] * 64, 1.1)),
                 RopeSpec("llama3", 4, orig_ctx=8192, llama3_low=2, llama3_high=8)):
        entries, max_pos = hf_entries(spec, 10000.0, 128)
        cfg = {"rope_parameters": entries, "max_position_embeddings": max_pos, "head_dim": 128}
        assert spec_from_entries(cfg, rope_entries(cfg)[1]).same_rope(spec) and max_pos == spec.orig_ctx * spec.scale


def test_a_record_is_trusted_only_while_the_factors_match():
    spec = RopeSpec("longrope", 8, longrope_factors=factors())
    cfg = apply_rope(llama_cfg(), spec)
    cfg.rope_parameters["long_factor"] = [2.0] * 8  # edited by hand: the entries win over the record
    got = read_rope(cfg)
    assert got.longrope_factors.long_factor == (2.0,) * 8 and got.longrope_factors.short_factor == SHORT


# ---------------------------------------------------------------- the bounds (issue 31.4)
def test_finetune_bound_by_hand():
    # L = 10, pairs theta = 1 (wavelength 6.3: full turns, unbounded), 0.1, 0.01; PI x4: theta' = theta / 4.
    # pre-training bound: 10 * 4 = 40. A fine-tune at 100 tokens: pair 1 saw 100 * 0.025 = 2.5 rad (> its 1 rad),
    # bound 2.5 / 0.025 = 100; pair 2 saw 100 * 0.0025 = 0.25 rad (> 0.1), bound 100: the bound is 100.
    th, pi4 = [1.0, 0.1, 0.01], [0.25, 0.025, 0.0025]
    assert reach(10, th, pi4) == pytest.approx(40)
    assert finetune_bound(10, th, pi4, None) == pytest.approx(40)
    assert finetune_bound(10, th, pi4, 20) == pytest.approx(40)  # shorter than the pre-training bound: no change
    assert finetune_bound(10, th, pi4, 100) == pytest.approx(100)
    # at 300 tokens pair 1 turns 7.5 rad > 2 pi: it saw every angle; pair 2 (0.75 rad) bounds at 300
    assert finetune_bound(10, th, pi4, 300) == pytest.approx(300)
    assert math.isinf(finetune_bound(10, th, pi4, 3000))  # every pair turned a full circle


def test_ntk_x8_on_the_tiny_default_by_hand():
    # theta_i = 1e4^(-i/32); NTK x8: b' = 1e4 * 8^(64/62), theta_i / theta'_i = 8^(2i/62). Pairs i >= 16 have
    # wavelength > 512; pre-training bound 512 * 8^(32/62) = 512 * 2^(48/31) = 1,497.6 (pair 16).
    d, b, L = 64, 1e4, 512
    spec = RopeSpec("ntk", 8, orig_ctx=L)
    th, new = frequencies(RopeSpec(), d, b).inv_freq, frequencies(spec, d, b).inv_freq
    assert reach(L, th, new) == pytest.approx(512 * 2 ** (48 / 31))
    # the NTK fine-tune's longest sample, 2,024 tokens: pair 16 now turns 2024 / (1e4 * 2^(96/31))^(1/2) = 6.92 rad
    # > 2 pi (unbounded); pair 17 saw max(512 * 1e4^(-17/32), 2024 * theta'_17) = 2024 theta'_17: bound 2,024
    assert finetune_bound(L, th, new, 2024) == pytest.approx(2024)
    # Liu et al.: (d/2) log_1e4(512 / 2 pi) = 32 * 0.4777 = 15.29 -> d_extra = 2 * 16 = 32;
    # T_extra = 2 pi (1e4 * 2^(96/31))^(32/64) = 200 pi * 2^(48/31) = 1,838.0
    assert critical_dimension(d, b, L) == 32
    t = critical_period(d, b, b * 8 ** (64 / 62), L)
    assert t == pytest.approx(200 * math.pi * 2 ** (48 / 31)) and 1837 < t < 1839
    # LLaMA-2 (d 128, T 4096): the paper's own example, d_extra = 92
    assert critical_dimension(128, 1e4, 4096) == 92
    assert math.isinf(critical_period(8, 1e4, 1e4, 1e9))  # every pair turned: no critical dimension


def test_rescale_factors_of_the_registry_formulas():
    d, b = 64, 1e4
    assert rescale_factors(RopeSpec("pi", 8), d, b) == pytest.approx([8.0] * 32)
    assert rescale_factors(RopeSpec("ntk", 8), d, b) == pytest.approx([8 ** (2 * i / 62) for i in range(32)])
    y = rescale_factors(RopeSpec("yarn", 8, orig_ctx=512), d, b)
    assert y[0] == pytest.approx(1.0) and y[-1] == pytest.approx(8.0) and y == sorted(y)
    with pytest.raises(ValueError, match="rope-base"):
        rescale_factors(RopeSpec("abf", rope_base=5e5), d, b)

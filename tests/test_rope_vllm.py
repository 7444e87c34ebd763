"""Issue 32 phase 2: what ``--backend vllm`` is told for llama3, LongRoPE and dynamic YaRN (vLLM absent here:
``vllm_settings`` is a pure function).

vLLM's LongRoPE, transcribed from vLLM's ``model_executor/layers/rotary_embedding/phi3_long_rope_scaled_rope.py``
and ``get_rope`` (independently of ropescale.evaluation.backends): the long factors for every token when
max_model_len > original_max_position_embeddings, else the short ones; cos/sin scaled by ``short_mscale`` /
``long_mscale`` (the only attention keys get_rope passes on), by default sqrt(1 + ln(max_pos / orig) / ln(orig));
a long cache of max_position_embeddings positions. Its llama3 rope reads factor, low/high_freq_factor and
original_max_position_embeddings, with a cache of max_position_embeddings positions.
"""
from __future__ import annotations

import json
import math

import pytest

from ropescale.common.io import InputError

ORIG = 64
SHORT = [1.0, 1.02, 0.97, 1.05, 1.0, 1.08, 0.99, 1.03]
LONG = [1.0, 1.3, 1.9, 2.8, 3.6, 4.4, 5.2, 6.0]


def vllm_longrope(cfg: dict, max_model_len: int) -> dict:
    """What vLLM's longrope module computes for a (5.x) config dict: the factor set, the cos/sin scale, the
    long cache's length."""
    rp, max_pos = cfg["rope_parameters"], cfg["max_position_embeddings"]
    orig = rp["original_max_position_embeddings"]
    long = max_model_len > orig
    scale = max_pos / orig
    default = 1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(orig))
    mscale = rp.get("long_mscale" if long else "short_mscale", default)
    return {"factors": rp["long_factor" if long else "short_factor"], "mscale": mscale,
            "positions": max_pos if long else orig}


def applied(cfg: dict, overrides: dict) -> dict:
    return {**cfg, **json.loads(json.dumps(overrides))}


@pytest.fixture(scope="module")
def base_dir(make_tiny_model):
    return make_tiny_model("qwen2", orig_ctx=ORIG, seed=21)[1]


def scaled(base_dir, spec):
    from rope_scaling.load import load_config

    cfg = load_config(base_dir, spec)
    return cfg


def longrope(att=None):
    from rope_scaling import RopeSpec
    from rope_scaling.spec import LongRopeFactors

    return RopeSpec("longrope", 4, longrope_factors=LongRopeFactors(SHORT, LONG, att))


@pytest.mark.parametrize("att", [None, 1.25])
def test_longrope_all_past_the_original_context_gets_the_long_factors_and_our_attention(base_dir, att):
    from ropescale.evaluation.backends.vllm import vllm_settings

    cfg = scaled(base_dir, longrope(att))
    before = cfg.config.to_dict()
    ov, mml = vllm_settings(cfg.config, cfg.rope_fields(), need=300, want=600, state=cfg.state, short=80)
    assert mml == 600
    got = vllm_longrope(applied(before, ov), mml)
    hf_att = att if att is not None else math.sqrt(1 + math.log(4) / math.log(ORIG))  # transformers' default
    assert got["factors"] == LONG and got["mscale"] == pytest.approx(hf_att, rel=1e-12)
    assert got["positions"] >= mml  # 600 > 64 x 4: max_position_embeddings raised, the attention kept
    assert applied(before, ov)["max_position_embeddings"] == 600


def test_longrope_all_within_the_original_context_stays_on_the_short_factors(base_dir):
    from ropescale.evaluation.backends.vllm import vllm_settings

    cfg = scaled(base_dir, longrope())
    ov, mml = vllm_settings(cfg.config, cfg.rope_fields(), need=60, want=512, state=cfg.state, short=20)
    assert mml == ORIG  # capped: max_model_len 512 would switch vLLM to the long factors
    got = vllm_longrope(applied(cfg.config.to_dict(), ov), mml)
    assert got["factors"] == SHORT and got["positions"] >= 60
    assert got["mscale"] == pytest.approx(math.sqrt(1 + math.log(4) / math.log(ORIG)), rel=1e-12)


def test_longrope_samples_on_both_sides_are_refused(base_dir):
    from ropescale.evaluation.backends.vllm import vllm_settings

    cfg = scaled(base_dir, longrope())
    with pytest.raises(InputError, match=r"reach 40 to 300 tokens, on both sides.*--backend hf"):
        vllm_settings(cfg.config, cfg.rope_fields(), need=300, want=512, state=cfg.state, short=40)


def test_dynamic_yarn_is_refused_and_llama3_passes(base_dir):
    from rope_scaling import RopeSpec
    from ropescale.evaluation.backends.vllm import vllm_settings

    cfg = scaled(base_dir, RopeSpec("dynamic_yarn", 4))
    assert cfg.config.rope_parameters["rope_type"] == "yarn"  # what vLLM would read: static yarn
    with pytest.raises(InputError, match=r"cannot run dynamic_yarn.*static yarn x4.*--backend hf"):
        vllm_settings(cfg.config, cfg.rope_fields(), need=100, want=200, state=cfg.state)
    cfg = scaled(base_dir, RopeSpec("llama3", 4))
    before = cfg.config.to_dict()
    ov, mml = vllm_settings(cfg.config, cfg.rope_fields(), need=300, want=600, state=cfg.state)
    after = applied(before, ov)
    assert mml == 600 and after["max_position_embeddings"] >= 600  # vLLM's llama3 cache: max_position_embeddings
    assert after["rope_parameters"] == before["rope_parameters"]  # the frequencies as transformers computes them
    assert set(ov) - set(cfg.rope_fields()) <= {"max_position_embeddings"}


# ---------------------------------------------------------------- the vLLM release that keeps one factor set a run
@pytest.mark.parametrize("version,fixed", [
    ("0.6.3", False), ("0.10.1.1", False), ("0.11.0", False), ("0.11.0+cu128", False), ("0.11.1rc2", False),
    ("0.11.1.dev12+g1a2b3c", False), ("0.11.1", True), ("0.11.1+cu129", True), ("0.11.2", True),
    ("0.12.0rc1", True), ("0.12.0", True), ("1.0", True), ("v0.13.0", True), ("not a version", False),
])
def test_vllm_longrope_fix_by_release(version, fixed):
    """vLLM up to 0.11.0 took the long factors for a whole forward batch once any position passed the original
    context (``torch.any(positions > k)`` in phi3_long_rope_scaled_rope.py); 0.11.1 picks one set at load time from
    max_model_len. A pre-release or dev build of 0.11.1 is not trusted with it."""
    from ropescale.evaluation.backends.vllm import longrope_fixed as vllm_longrope_fixed

    assert vllm_longrope_fixed(version) is fixed


def test_longrope_past_the_window_is_refused_on_vllm_before_the_fix(base_dir):
    """The issue's case at this model's size: every prompt within the window (49..60 tokens of 64) decoded past it
    (+ 16 new tokens): the hf backend runs the long factors from the prefill on; vLLM 0.11.0 would prefill with the
    short ones and decode with the long ones over that cache."""
    from ropescale.evaluation.backends.vllm import vllm_settings

    cfg = scaled(base_dir, longrope())
    ask = dict(need=76, want=152, state=cfg.state, short=65)
    for old in ("0.6.0", "0.11.0"):
        with pytest.raises(InputError, match=rf"vLLM {old} switches LongRoPE's factors within a sample.*"
                                             r"vllm>=0\.11\.1; use --backend hf"):
            vllm_settings(cfg.config, cfg.rope_fields(), vllm=old, **ask)
    ov, mml = vllm_settings(cfg.config, cfg.rope_fields(), vllm="0.11.1", **ask)
    assert vllm_longrope(applied(cfg.config.to_dict(), ov), mml)["factors"] == LONG and mml == 152
    # all samples within the window: max_model_len capped to it, no position passes it, every release is short
    ov, mml = vllm_settings(cfg.config, cfg.rope_fields(), need=60, want=512, state=cfg.state, short=20,
                            vllm="0.6.0")
    assert mml == ORIG and vllm_longrope(applied(cfg.config.to_dict(), ov), mml)["factors"] == SHORT

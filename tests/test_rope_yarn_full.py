"""Issue 51.1: YaRN's full form -- DeepSeek-V3 / Kimi-K2's ``mscale`` / ``mscale_all_dim`` and gpt-oss'
``truncate: false`` -- read, written and applied, each equal to transformers' own ``ROPE_INIT_FUNCTIONS["yarn"]`` on
the same config (inv_freq to 1e-6 relative, attention factor to 1e-9); the acceptance configs through
``python -m rope_scaling describe --config DIR``; issue 48's --rope hints, range warning and ``--model`` alias."""
from __future__ import annotations

import json
import math

import pytest

from rope_scaling import RopeSpec
from ropescale.common.io import InputError
from tests.test_rope_registry import check_method

DEEPSEEK = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "mscale": 0.707,
            "mscale_all_dim": 0.707}
GPT_OSS = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
           "beta_slow": 1.0, "truncate": False}
# DeepSeek's coefficients unequal (the ratio is not 1), and a DeepSeek config with no factor (transformers: max_pos /
# original), and both forms together
KIMI = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
        "mscale_all_dim": 0.5}
NO_FACTOR = {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096, "mscale": 1.0,
             "mscale_all_dim": 1.0}
BOTH = {**KIMI, "truncate": False, "beta_fast": 16.0, "beta_slow": 2.0}


def _run(argv) -> int:
    """describe's exit status (argparse exits with 2 on a bad flag value)."""
    from rope_scaling.describe import main

    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _llama(tmp_path, rope: dict, base: float = 10000.0, max_pos: int = 16384):
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, head_dim=64, num_hidden_layers=1,
                      vocab_size=32, intermediate_size=64, max_position_embeddings=max_pos,
                      rope_parameters={**rope, "rope_theta": base})
    cfg.save_pretrained(tmp_path)
    return cfg


def _transformers_yarn(cfg):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv, att = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    return inv.double().tolist(), float(att)


def _hand_attention(rope: dict, max_pos: int) -> float:
    """transformers' rule written out: attention_factor, else mscale(s, c) / mscale(s, c') when both are set, else
    0.1 ln s + 1 (s: the factor, or max_pos / original when none)."""
    s = rope.get("factor") or max_pos / rope["original_max_position_embeddings"]

    def m(c):
        return 1.0 if s <= 1 else 0.1 * c * math.log(s) + 1.0
    return m(rope["mscale"]) / m(rope["mscale_all_dim"]) if rope.get("mscale") and rope.get("mscale_all_dim") else m(1)


@pytest.mark.parametrize("rope,base,max_pos", [(DEEPSEEK, 10000.0, 16384), (GPT_OSS, 150000.0, 131072),
                                               (KIMI, 50000.0, 131072), (NO_FACTOR, 10000.0, 32768),
                                               (BOTH, 10000.0, 131072)])
def test_describe_reads_the_config_and_equals_transformers(rope, base, max_pos, tmp_path, capsys):
    from rope_scaling.describe import main

    cfg = _llama(tmp_path, rope, base, max_pos)
    inv, att = _transformers_yarn(cfg)
    assert main(["--config", str(tmp_path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rope"] == "yarn"
    assert [r["inv_freq_scaled"] for r in d["dims"]] == pytest.approx(inv, rel=1e-6)
    assert d["attention_factor"] == pytest.approx(att, rel=1e-9, abs=1e-12)
    assert att == pytest.approx(_hand_attention(rope, max_pos), rel=1e-9)  # the reference itself, written out
    assert d["yarn"]["truncate"] is rope.get("truncate", True)
    # --model DIR is the same as --config DIR (issue 48)
    assert main(["--model", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dims"] == d["dims"]


def test_truncate_false_changes_the_ramp_ends():
    """truncate: false keeps the ramp's exact (fractional) ends; truncate true floors / ceils them: the two differ on
    the pairs at the ends (the test would pass vacuously otherwise)."""
    from rope_scaling.formulas import frequencies, yarn_correction_range

    lo, hi = yarn_correction_range(64, 150000.0, 4096, 32.0, 1.0, truncate=False)
    assert lo != int(lo) and hi != int(hi)
    assert yarn_correction_range(64, 150000.0, 4096, 32.0, 1.0) == (math.floor(lo), math.ceil(hi))
    a = frequencies(RopeSpec("yarn", 32, orig_ctx=4096), 64, 150000.0).inv_freq
    b = frequencies(RopeSpec("yarn", 32, orig_ctx=4096, yarn_truncate=False), 64, 150000.0).inv_freq
    assert max(abs(x / y - 1) for x, y in zip(a, b)) > 1e-3


@pytest.mark.parametrize("fields", [{"yarn_mscale_coef": 0.707, "yarn_mscale_all_dim": 0.707},
                                    {"yarn_mscale_coef": 1.0, "yarn_mscale_all_dim": 0.5},
                                    {"yarn_truncate": False},
                                    {"yarn_mscale_coef": 1.0, "yarn_mscale_all_dim": 0.5, "yarn_truncate": False}])
def test_registry_wide_checks_on_the_full_yarn_forms(fields, tmp_path):
    """The registry-wide test of the yarn row (HF round trip, transformers' init function, the model's rotary module,
    describe, the vllm rule) on each full form written by --rope yarn."""
    check_method("yarn", tmp_path, RopeSpec("yarn", 4.0, orig_ctx=64, **fields))


def test_flags_write_the_entries_transformers_reads(tmp_path):
    import argparse

    from rope_scaling import add_rope_args, apply_rope, spec_from_args

    p = add_rope_args(argparse.ArgumentParser())
    spec = spec_from_args(p.parse_args(["--rope", "yarn", "--scale", "4", "--yarn-mscale-coef", "1",
                                        "--yarn-mscale-all-dim", "0.5", "--yarn-truncate", "false"]))
    assert (spec.yarn_mscale_coef, spec.yarn_mscale_all_dim, spec.yarn_truncate) == (1.0, 0.5, False)
    assert spec.label() == "yarn x4 mscale_coef=1 mscale_all_dim=0.5 truncate=false"
    cfg = apply_rope(_llama(tmp_path, {"rope_type": "default"}, max_pos=4096), spec)
    rp = cfg.rope_parameters
    assert (rp["mscale"], rp["mscale_all_dim"], rp["truncate"]) == (1.0, 0.5, False)
    inv, att = _transformers_yarn(cfg)
    assert att == pytest.approx((0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1), rel=1e-12)
    with pytest.raises(InputError, match="--yarn-truncate only applies to --rope yarn"):
        RopeSpec("pi", 4, yarn_truncate=False)


def test_vllm_gets_the_factor_and_refuses_truncate_before_it_reads_it(tmp_path):
    from rope_scaling.load import load_config
    from ropescale.evaluation.backends.vllm import vllm_settings

    _llama(tmp_path, KIMI, max_pos=131072)
    mc = load_config(tmp_path)
    ov, mml = vllm_settings(mc.config, mc.rope_fields(), need=1000, want=2000, state=mc.state, vllm="0.11.1")
    want = _hand_attention(KIMI, 131072)
    rope = ov["rope_parameters"]
    assert rope["attention_factor"] == pytest.approx(want, rel=1e-9)
    assert rope["attn_factor"] * (0.1 * math.log(32) + 1) == pytest.approx(want, rel=1e-9)  # vLLM's multiplier
    _llama(tmp_path, GPT_OSS, 150000.0, 131072)
    mc = load_config(tmp_path)
    with pytest.raises(InputError, match=r"vLLM 0\.9\.2 rounds YaRN's ramp ends.*--backend hf"):
        vllm_settings(mc.config, mc.rope_fields(), need=1000, want=2000, state=mc.state, vllm="0.9.2")
    ov, _ = vllm_settings(mc.config, mc.rope_fields(), need=1000, want=2000, state=mc.state, vllm="0.10.1")
    assert ov.get("rope_parameters", mc.config.rope_parameters)["truncate"] is False


@pytest.mark.parametrize("word,hint", [("linear", "did you mean pi? transformers calls it 'linear'"),
                                       ("YaRN", "did you mean yarn?"), ("dynamic", "did you mean dynamic_ntk?")])
def test_rope_names_get_a_hint(word, hint, capsys):
    assert _run(["--preset", "llama2-7b", "--rope", word, "--scale", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert hint in err and err.count("did you mean") == 1
    with pytest.raises(InputError, match=hint.split("?")[0]):
        RopeSpec(word, 2)


@pytest.mark.parametrize("args,warned", [(["--rope", "yarn", "--scale", "64"], True),
                                         (["--rope", "pi", "--scale", "1000"], True),
                                         (["--rope", "yarn", "--scale", "32"], False),
                                         (["--rope", "longrope"], False)])
def test_a_scale_past_the_published_range_warns_in_one_line(args, warned, capsys):
    assert _run(["--preset", "llama2-7b", *args]) == (2 if args[1] == "longrope" else 0)  # longrope: no factors
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert len(err) == (1 if warned else 0)
    if warned:
        assert "past the largest extension its sources report" in err[0]

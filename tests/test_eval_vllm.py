"""The vllm backend's arguments and refusals (issue 15.5), computed by pure functions with vLLM absent.

vLLM precomputes a cos/sin cache when it loads a model and indexes it by position; VLLM_ALLOW_LONG_MAX_MODEL_LEN
only skips its length check. The cache lengths below are transcribed from vLLM's
``model_executor/layers/rotary_embedding`` (base.py, linear_scaling_rope.py, dynamic_ntk_scaling_rope.py,
yarn_scaling_rope.py, get_rope in __init__.py), independently of ropescale.evaluation.backends."""
from __future__ import annotations

import importlib.util
import json
import math

import pytest

from ropescale.common.io import InputError


def vllm_rotary_cache_len(cfg: dict) -> int:
    """How many positions vLLM's rotary cache holds for a (transformers 5.x) config dict."""
    rp = cfg["rope_parameters"]
    t, max_pos = rp.get("rope_type", "default"), cfg["max_position_embeddings"]
    if t in ("default", "llama3"):
        return max_pos  # RotaryEmbedding: arange(max_position_embeddings)
    if t in ("linear", "dynamic"):
        return math.ceil(max_pos * rp["factor"])  # arange(max_position_embeddings * factor)
    if t == "yarn":  # get_rope passes original_max_position_embeddings; cache arange(orig * factor)
        return math.ceil(rp["original_max_position_embeddings"] * rp["factor"])
    raise AssertionError(t)


def vllm_yarn_mscale(rp: dict) -> set:
    """cos/sin scale of vLLM's YaRN in the versions seen: <= 0.15 read attn_factor as a multiplier of
    0.1 ln(s) + 1 (HF's attention_factor dropped by get_rope), later ones read attention_factor itself."""
    s = rp["factor"]
    old = (0.1 * math.log(s) + 1) * rp.get("attn_factor", 1.0)
    new = rp["attention_factor"] if rp.get("attention_factor") is not None else 0.1 * math.log(s) + 1
    return {round(old, 12), round(new, 12)}


def applied(cfg: dict, overrides: dict) -> dict:
    """vLLM's hf_overrides: top-level config fields replaced."""
    return {**cfg, **json.loads(json.dumps(overrides))}


@pytest.fixture(scope="module")
def base_dir(make_tiny_model):
    return make_tiny_model("qwen2", orig_ctx=64, seed=9)[1]


def scaled(base_dir, **spec):
    from rope_scaling import RopeSpec
    from rope_scaling.load import load_config

    cfg = load_config(base_dir, RopeSpec(**spec) if spec else None)
    return cfg.config, cfg.rope_fields()


def test_vllm_is_absent_here():
    assert importlib.util.find_spec("vllm") is None  # everything below runs without it


@pytest.mark.parametrize("spec,want,need", [
    ({}, 512, 300), ({"method": "ntk", "scale": 4.0}, 512, 300), ({"method": "abf", "rope_base": 80000.0}, 512, 70),
    ({"method": "pi", "scale": 4.0}, 512, 300), ({"method": "pi", "scale": 4.0}, 4096, 300),
    ({"method": "pi", "scale": 2.0}, 256, 700),
])
def test_default_and_linear_rope_get_a_rotary_cache_covering_max_model_len(base_dir, spec, want, need):
    from ropescale.evaluation.backends.vllm import vllm_settings

    config, overrides = scaled(base_dir, **spec)
    before = config.to_dict()
    hf_overrides, mml = vllm_settings(config, overrides, need=need, want=want)
    assert mml == max(want, need)
    after = applied(before, hf_overrides)
    assert vllm_rotary_cache_len(after) >= mml
    # the frequencies vLLM computes are the ones HF computes: only max_position_embeddings may differ
    assert after["rope_parameters"] == before["rope_parameters"]
    assert set(hf_overrides) - set(overrides) <= {"max_position_embeddings"}
    if vllm_rotary_cache_len(before) >= mml:
        assert "max_position_embeddings" not in hf_overrides or hf_overrides == overrides


def test_linear_raises_max_positions_by_what_the_factor_does_not_cover(base_dir):
    from ropescale.evaluation.backends.vllm import vllm_settings

    config, overrides = scaled(base_dir, method="pi", scale=4.0)  # max_position_embeddings 256, cache 1024
    assert vllm_settings(config, overrides, need=300, want=1024)[0].get("max_position_embeddings", 256) == 256
    assert vllm_settings(config, overrides, need=300, want=4096)[0]["max_position_embeddings"] == 1024


@pytest.mark.parametrize("mscale", [None, 1.5])
def test_yarn_attention_factor_reaches_every_vllm_version(base_dir, mscale):
    from ropescale.evaluation.backends.vllm import vllm_settings

    config, overrides = scaled(base_dir, method="yarn", scale=4.0, yarn_mscale=mscale)
    hf_overrides, mml = vllm_settings(config, overrides, need=200, want=512)
    assert mml == 256  # capped to vLLM's yarn cache: 64 x 4 (2x the target would be 512)
    rp = applied(config.to_dict(), hf_overrides)["rope_parameters"]
    hf_factor = mscale if mscale is not None else 0.1 * math.log(4.0) + 1  # what transformers applies
    assert vllm_yarn_mscale(rp) == {round(hf_factor, 12)}
    assert vllm_rotary_cache_len(applied(config.to_dict(), hf_overrides)) >= mml


def test_yarn_past_vllms_rotary_cache_is_refused(base_dir):
    from ropescale.evaluation.backends.vllm import vllm_settings

    config, overrides = scaled(base_dir, method="yarn", scale=4.0)
    with pytest.raises(InputError, match=r"257 tokens, past vLLM's YaRN rotary cache of 256 .*--backend hf"):
        vllm_settings(config, overrides, need=257, want=512)


def test_dynamic_ntk_is_refused_on_vllm(base_dir):
    from ropescale.evaluation.backends.vllm import vllm_settings

    config, overrides = scaled(base_dir, method="dynamic_ntk", scale=4.0)
    with pytest.raises(InputError, match=r"dynamic_ntk x4.*from the current length.*static NTK base.*--backend hf"):
        vllm_settings(config, overrides, need=10, want=10)  # even when it would fit


def test_generate_refuses_before_looking_for_vllm(base_dir, chapters, tmp_path, capsys):
    """The rope refusals (dynamic NTK, dynamic YaRN) come first (they hold on a GPU machine with vLLM too), and
    nothing is written."""
    from ropescale.evaluation.cli import main

    data = tmp_path / "cnnsum_L_16k.jsonl"
    data.write_text(json.dumps({"context": chapters[0]["text"][:100], "summary": "x"}, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    for method, says in (("dynamic_ntk", "static NTK base"), ("dynamic_yarn", "dynamic_yarn")):
        rc = main(["generate", "--model", str(base_dir), "--data", str(data), "--prompt", "ie", "--out",
                   str(tmp_path / "o"), "--backend", "vllm", "--rope", method, "--scale", "4"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and says in err[-1] and "--backend hf" in err[-1] and "Traceback" not in "".join(err)
        assert not (tmp_path / "o").exists()
    rc = main(["generate", "--model", str(base_dir), "--data", str(data), "--prompt", "ie", "--out",
               str(tmp_path / "o"), "--backend", "vllm", "--rope", "ntk", "--scale", "4"])
    assert rc == 2 and "needs the vllm package" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()

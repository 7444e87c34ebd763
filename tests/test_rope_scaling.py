"""rope_scaling: the model really gets the rope each method implies.

The expected frequencies here are written from the papers, independently of ``rope_scaling.formulas``:
RoPE theta_i = b^(-2i/d) (RoFormer Eq. 15); PI divides them by s (arXiv 2306.15595); NTK-aware uses
b' = b * s^(d/(d-2)); dynamic NTK recomputes b' from the current length L (transformers' rule); YaRN keeps pairs
that turn more than beta times over the original context, divides by s those that turn fewer than alpha times and
ramps linearly in between (pair index bounds solved from r(i) = L / (2*pi*b^(2i/d)), floored/ceiled), with
attention factor 0.1*ln(s)+1 (arXiv 2309.00071 Sec 3.2-3.4); ABF is RoPE with a new base.
"""
from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rope_scaling import InputError, RopeSpec, apply_rope, extended_context, read_rope
from rope_scaling.describe import main as describe_main

ORIG = 64  # the tiny models' original context
D = 16  # their head_dim (hidden 64 / 4 heads)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Tiny forwards run ~20x faster on one thread than fighting over the shared cores (conftest.one_thread)."""


# ---------------------------------------------------------------- independent reference
def ref_rope(d: int, b: float) -> list[float]:
    return [1.0 / b ** (2 * i / d) for i in range(d // 2)]


def ref_yarn(d, b, s, L, alpha=1.0, beta=32.0):
    # pair i turns r(i) = L / (2*pi*b^(2i/d)) times over L, so r(i) = r  <=>  i = d*ln(L/(2*pi*r)) / (2*ln b)
    i_of = lambda r: d * math.log(L / (2 * math.pi * r)) / (2 * math.log(b))  # noqa: E731
    lo = max(math.floor(i_of(beta)), 0)
    hi = min(math.ceil(i_of(alpha)), d - 1)
    out = []
    for i, th in enumerate(ref_rope(d, b)):
        if i <= lo:
            out.append(th)  # fast pairs: unchanged
        elif i >= hi:
            out.append(th / s)  # slow pairs: position interpolation
        else:
            g = (i - lo) / (hi - lo)
            out.append(g * th / s + (1 - g) * th)
    return out


def expected(method, s=1.0, base=10000.0, rope_base=None, seq_len=ORIG, alpha=1.0, beta=32.0, mscale=None, d=D,
             L=ORIG):
    """(inv_freq, attention factor) a model must use."""
    b = rope_base or base
    if method in ("none", "abf"):
        return ref_rope(d, b), 1.0
    if method == "pi":
        return [t / s for t in ref_rope(d, b)], 1.0
    if method == "ntk":
        return ref_rope(d, b * s ** (d / (d - 2))), 1.0
    if method == "dynamic_ntk":
        n = max(seq_len, L)
        return ref_rope(d, b * (s * n / L - (s - 1)) ** (d / (d - 2))), 1.0
    if method == "yarn":
        return ref_yarn(d, b, s, L, alpha, beta), (mscale if mscale else 0.1 * math.log(s) + 1)
    raise AssertionError(method)


def assert_rel(actual, want, tol=1e-6):
    a = torch.as_tensor(actual, dtype=torch.float64)
    w = torch.tensor(want, dtype=torch.float64)
    assert a.shape == w.shape
    rel = ((a - w).abs() / w.abs()).max().item()
    assert rel <= tol, f"max relative error {rel:.2e} > {tol:g}"


def test_reference_is_not_trivial():
    """The reference itself separates the methods (else the model checks below could not fail)."""
    got = {m: expected(m, s=8, rope_base=5e5 if m == "abf" else None, seq_len=8 * ORIG)[0]
           for m in ("none", "pi", "ntk", "dynamic_ntk", "yarn", "abf")}
    for a in got:
        for b in got:
            if a < b:
                assert max(abs(x / y - 1) for x, y in zip(got[a], got[b])) > 1e-3, (a, b)


# ---------------------------------------------------------------- inside the instantiated model
CASES = [
    ("none", {}),
    ("pi", {"scale": 4.0}),
    ("ntk", {"scale": 8.0}),
    ("dynamic_ntk", {"scale": 4.0}),
    ("yarn", {"scale": 8.0}),
    ("yarn", {"scale": 16.0, "yarn_alpha": 2.0, "yarn_beta": 16.0, "yarn_mscale": 1.5}),
    ("abf", {"rope_base": 500000.0}),
    ("pi", {"scale": 8.0, "rope_base": 1e6}),
    ("ntk", {"scale": 4.0, "rope_base": 5e5}),
    ("dynamic_ntk", {"scale": 8.0, "rope_base": 1e6}),
    ("yarn", {"scale": 8.0, "rope_base": 1e6}),
]


def _rotary(model):
    return model.model.rotary_emb


def _exp_kwargs(kw):
    return {"s": kw.get("scale", 1.0), "rope_base": kw.get("rope_base"), "alpha": kw.get("yarn_alpha", 1.0),
            "beta": kw.get("yarn_beta", 32.0), "mscale": kw.get("yarn_mscale")}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_model_gets_the_rope(arch, make_tiny_model, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    base_model, src = make_tiny_model(arch, orig_ctx=ORIG)
    torch.manual_seed(1)
    ids = torch.randint(0, base_model.config.vocab_size, (1, 8 * ORIG))
    with torch.no_grad():
        base_logits = base_model(ids).logits
    for method, kw in CASES:
        spec = RopeSpec(method, **kw)
        cfg = AutoConfig.from_pretrained(src)
        apply_rope(cfg, spec)
        model = AutoModelForCausalLM.from_pretrained(src, config=cfg).eval()
        e = _exp_kwargs(kw)
        want, att = expected(method, seq_len=ORIG, **e)
        assert_rel(_rotary(model).inv_freq, want)
        assert _rotary(model).attention_scaling == pytest.approx(att, rel=1e-9)

        with torch.no_grad():  # a forward pass at 8x the original context
            logits = model(ids).logits
        assert logits.shape == (1, 8 * ORIG, cfg.vocab_size) and torch.isfinite(logits).all()
        if method == "dynamic_ntk":  # the base is recomputed from the 8x length
            assert_rel(_rotary(model).inv_freq, expected(method, seq_len=8 * ORIG, **e)[0])
        if method == "none":
            assert torch.equal(logits, base_logits)
        else:
            assert (logits - base_logits).abs().max() > 1e-4, f"{method} did not change the model"

        out = tmp_path / f"{arch}_{method}_{len(kw)}"
        model.save_pretrained(out)
        reloaded = AutoModelForCausalLM.from_pretrained(out).eval()  # plain transformers, no rope_scaling
        with torch.no_grad():
            logits2 = reloaded(ids).logits
        assert torch.equal(logits, logits2), f"{arch} {method}: reloaded logits differ"
        got = read_rope(AutoConfig.from_pretrained(out))
        assert got.same_rope(RopeSpec(method, orig_ctx=ORIG, **kw)), got
        raw = json.loads((out / "config.json").read_text())
        assert raw["max_position_embeddings"] == (ORIG if method == "dynamic_ntk" else ORIG * kw.get("scale", 1))


def test_yarn_matches_transformers_on_real_shapes():
    """Our formulas against transformers' own yarn / dynamic functions on Yi / Qwen / Llama-2 shapes."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from rope_scaling import frequencies

    for base, orig, s in [(5e6, 4096, 16.0), (1e6, 32768, 4.0), (1e4, 4096, 8.0)]:
        cfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, max_position_embeddings=orig,
                          rope_parameters={"rope_type": "default", "rope_theta": base})
        apply_rope(cfg, RopeSpec("yarn", scale=s))
        hf, att = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
        ours = frequencies(RopeSpec("yarn", scale=s, orig_ctx=orig), 128, base)
        assert_rel(hf, ours.inv_freq)
        assert att == pytest.approx(ours.attention_factor)
        assert_rel(ours.inv_freq, expected("yarn", s=s, base=base, d=128, L=orig)[0], 1e-12)


# ---------------------------------------------------------------- describe: the acceptance numbers
def _describe_json(capsys, *argv):
    rc = describe_main([*argv, "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    return json.loads(out)


def test_describe_yi_yarn_split(capsys):
    """CNNSum App.: YaRN s=16 on Yi-6B (base 5e6, 4k): 13 of 64 pairs not interpolated, 37 use PI."""
    d = _describe_json(capsys, "--preset", "yi-6b", "--rope", "yarn", "--scale", "16")
    assert d["counts"] == {"extrapolated": 13, "mixed": 14, "interpolated": 37}
    assert len(d["dims"]) == 64 and d["base"] == 5e6 and d["rope"] == "yarn" and d["scale"] == 16
    kinds = [r["kind"] for r in d["dims"]]
    assert kinds == ["extrapolated"] * 13 + ["mixed"] * 14 + ["interpolated"] * 37  # contiguous bands
    assert_rel([r["inv_freq_scaled"] for r in d["dims"]], ref_yarn(128, 5e6, 16, 4096), 1e-9)


def test_describe_llama2_yarn_attention(capsys):
    d = _describe_json(capsys, "--preset", "llama2-7b", "--rope", "yarn", "--scale", "16")
    assert abs(d["attention_factor"] - 1.27726) <= 1e-5
    assert d["attention_factor"] == pytest.approx(0.1 * math.log(16) + 1, rel=1e-12)


def test_describe_ntk_manual(capsys):
    d = _describe_json(capsys, "--head-dim", "128", "--base", "10000", "--orig-ctx", "4096", "--rope", "ntk",
                       "--scale", "8")
    assert abs(d["effective_base"] - 82684.6) <= 0.5
    assert d["counts"] == {"extrapolated": 1, "mixed": 62, "interpolated": 1}
    assert d["dims"][0]["kind"] == "extrapolated" and d["dims"][-1]["kind"] == "interpolated"


def test_describe_other_methods(capsys):
    pi = _describe_json(capsys, "--preset", "qwen1.5-7b", "--rope", "pi", "--scale", "4")
    assert pi["counts"] == {"extrapolated": 0, "mixed": 0, "interpolated": 64}
    assert pi["extended_context"] == 4 * 32768
    none = _describe_json(capsys, "--preset", "qwen1.5-7b")
    assert none["counts"]["extrapolated"] == 64 and none["effective_base"] == 1e6
    abf = _describe_json(capsys, "--preset", "llama2-7b", "--rope", "abf", "--rope-base", "500000")
    assert abf["effective_base"] == 5e5 and abf["counts"]["mixed"] == 63  # pair 0 (theta = 1) never moves
    dyn = _describe_json(capsys, "--preset", "llama2-7b", "--rope", "dynamic_ntk", "--scale", "4",
                         "--seq-len", "8192")
    assert dyn["effective_base"] == pytest.approx(1e4 * (4 * 8192 / 4096 - 3) ** (128 / 126), rel=1e-12)
    l3 = _describe_json(capsys, "--preset", "llama3.1-8b")  # native llama3 scaling, described as it ships
    assert l3["rope"] == "llama3" and l3["scale"] == 8 and l3["extended_context"] == 131072
    # Meta's rule: wavelengths < 8192/4 kept, > 8192/1 divided by 8
    for r in l3["dims"]:
        if r["wavelength"] < 2048:
            assert r["kind"] == "extrapolated"
        elif r["wavelength"] > 8192:
            assert r["kind"] == "interpolated"
        else:
            assert r["kind"] == "mixed"
    y = _describe_json(capsys, "--preset", "llama3.1-8b", "--rope", "yarn", "--scale", "16", "--replace")
    assert y["rope"] == "yarn" and y["orig_ctx"] == 8192 and y["base"] == 5e5
    assert_rel([r["inv_freq_scaled"] for r in y["dims"]], ref_yarn(128, 5e5, 16, 8192), 1e-9)


def test_describe_presets_are_the_published_configs(capsys):
    """Values of each model's config.json on the Hub (Qwen2-7B, the base model: 131072; 32768 is the Instruct
    model's)."""
    want = {"qwen2-7b": (1e6, 131072, 128), "qwen1.5-7b": (1e6, 32768, 128), "yi-6b": (5e6, 4096, 128),
            "llama2-7b": (1e4, 4096, 128), "mistral-7b": (1e4, 32768, 128)}
    for name, (base, ctx, d) in want.items():
        r = _describe_json(capsys, "--preset", name)
        assert (r["base"], r["orig_ctx"], r["extended_context"], r["head_dim"]) == (base, ctx, ctx, d), name
    r = _describe_json(capsys, "--preset", "qwen2-7b", "--rope", "yarn", "--scale", "4")
    assert r["orig_ctx"] == 131072 and r["extended_context"] == 4 * 131072


def test_describe_table_and_config_dir(capsys, make_tiny_model, tmp_path):
    from transformers import AutoConfig

    _, src = make_tiny_model("llama", orig_ctx=ORIG)
    cfg = AutoConfig.from_pretrained(src)
    apply_rope(cfg, RopeSpec("ntk", scale=4))
    cfg.save_pretrained(tmp_path)
    assert describe_main(["--config", str(tmp_path)]) == 0  # the scaled model dir describes what it carries
    out = capsys.readouterr().out
    # + the angle bound, Liu et al.'s critical dimension (a changed base) and the matched ABF base
    assert "rope ntk" in out and "kind" in out and len(out.splitlines()) == 9 + D // 2
    assert f"effective base {10000 * 4 ** (16 / 14):.6g}" in out
    assert "the config carries ntk x4" in out


def test_describe_config_that_already_carries_scaling(capsys, make_tiny_model, tmp_path):
    """The one rule of rope_scaling.apply_rope: the same spec again is a no-op, another one needs --replace; the
    report says which happened."""
    from transformers import AutoConfig

    _, src = make_tiny_model("qwen2", orig_ctx=ORIG)
    cfg = AutoConfig.from_pretrained(src)
    apply_rope(cfg, RopeSpec("ntk", scale=4))
    cfg.save_pretrained(tmp_path)
    carried = _describe_json(capsys, "--config", str(tmp_path))
    assert carried["rope_change"]["action"] == "kept" and carried["rope"] == "ntk"
    same = _describe_json(capsys, "--config", str(tmp_path), "--rope", "ntk", "--scale", "4")
    assert same["rope_change"] == {"action": "unchanged", "carried": "ntk x4", "requested": "ntk x4",
                                   "message": same["rope_change"]["message"]}
    assert "already carries ntk x4" in same["rope_change"]["message"]
    assert {k: v for k, v in same.items() if k != "rope_change"} == \
        {k: v for k, v in carried.items() if k != "rope_change"}
    assert describe_main(["--config", str(tmp_path), "--rope", "ntk", "--scale", "4"]) == 0
    assert "unchanged" in capsys.readouterr().out
    assert describe_main(["--config", str(tmp_path), "--rope", "pi", "--scale", "2"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1
    assert "already carries ntk x4" in cap.err and "--replace" in cap.err
    rep = _describe_json(capsys, "--config", str(tmp_path), "--rope", "pi", "--scale", "2", "--replace")
    assert rep["rope_change"]["action"] == "replaced" and rep["rope"] == "pi" and rep["scale"] == 2
    assert rep["base"] == 10000.0 and rep["orig_ctx"] == ORIG and rep["extended_context"] == 2 * ORIG
    assert "replaced ntk x4 by pi x2" in rep["rope_change"]["message"]
    fresh = _describe_json(capsys, "--preset", "llama2-7b", "--rope", "pi", "--scale", "2")
    assert fresh["rope_change"]["action"] == "applied"


# ---------------------------------------------------------------- the adapter
def test_transformers5_entries_are_complete(make_tiny_model):
    from transformers import AutoConfig

    _, src = make_tiny_model("qwen2", orig_ctx=ORIG)
    cfg = AutoConfig.from_pretrained(src)
    apply_rope(cfg, RopeSpec("yarn", scale=4, rope_base=20000.0))
    assert cfg.rope_parameters == {"rope_type": "yarn", "rope_theta": 20000.0, "factor": 4.0,
                                   "original_max_position_embeddings": ORIG, "beta_fast": 32.0, "beta_slow": 1.0}
    assert cfg.max_position_embeddings == 4 * ORIG and extended_context(cfg) == 4 * ORIG
    apply_rope(cfg, RopeSpec("pi", scale=2, replace=True))  # replaces: back to base 10000, then PI
    assert cfg.rope_parameters == {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    assert cfg.max_position_embeddings == 2 * ORIG
    apply_rope(cfg, RopeSpec("none", replace=True))
    assert cfg.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert cfg.max_position_embeddings == ORIG and read_rope(cfg).method == "none"


def test_transformers4_style_config():
    """4.x keeps rope_theta top-level and the scaling in rope_scaling (object or config.json dict)."""
    for cfg in (SimpleNamespace(hidden_size=64, num_attention_heads=4, max_position_embeddings=ORIG,
                                rope_theta=10000.0, rope_scaling=None),
                {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": ORIG,
                 "rope_theta": 10000.0, "rope_scaling": None}):
        get = (lambda k: cfg[k]) if isinstance(cfg, dict) else (lambda k: getattr(cfg, k))
        apply_rope(cfg, RopeSpec("ntk", scale=4))
        assert get("rope_scaling") is None and get("rope_theta") == pytest.approx(1e4 * 4 ** (16 / 14))
        assert read_rope(cfg).same_rope(RopeSpec("ntk", scale=4, orig_ctx=ORIG))
        apply_rope(cfg, RopeSpec("dynamic_ntk", scale=2, replace=True))
        assert get("rope_theta") == 10000.0 and get("max_position_embeddings") == ORIG
        assert get("rope_scaling") == {"rope_type": "dynamic", "type": "dynamic", "factor": 2.0}
        assert extended_context(cfg) == 2 * ORIG
        apply_rope(cfg, RopeSpec("yarn", scale=8, yarn_mscale=1.5, replace=True))
        assert get("rope_scaling")["original_max_position_embeddings"] == ORIG
        assert get("rope_scaling")["attention_factor"] == 1.5
        assert read_rope(cfg).yarn_mscale == 1.5


def test_llama3_native_scaling(make_tiny_model):
    from transformers import AutoModelForCausalLM

    l3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    model, _ = make_tiny_model("llama", orig_ctx=128, save=False)
    cfg = copy.deepcopy(model.config)
    cfg.rope_parameters = dict(l3)
    spec = read_rope(cfg)
    assert (spec.method, spec.scale, spec.orig_ctx) == ("llama3", 8.0, 16)
    with pytest.raises(InputError, match="--replace"):
        apply_rope(cfg, RopeSpec("yarn", scale=4))
    assert cfg.rope_parameters == l3  # nothing half-applied
    apply_rope(cfg, RopeSpec("yarn", scale=4, replace=True))
    assert cfg.rope_parameters["rope_type"] == "yarn" and cfg.max_position_embeddings == 64
    m = AutoModelForCausalLM.from_config(cfg)
    assert_rel(m.model.rotary_emb.inv_freq, expected("yarn", s=4, base=5e5, L=16)[0])


def test_foreign_scaled_configs_are_read():
    qwen_yarn = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 32768,
                 "rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 32768}}
    s = read_rope(qwen_yarn)
    assert (s.method, s.scale, s.orig_ctx, s.yarn_alpha, s.yarn_beta) == ("yarn", 4.0, 32768, 1.0, 32.0)
    assert extended_context(qwen_yarn) == 131072
    lin = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 4096,
           "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}}
    assert read_rope(lin).method == "pi" and extended_context(lin) == 16384


def test_reapply_is_noop_and_stale_record_ignored():
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": ORIG,
           "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    apply_rope(cfg, RopeSpec("ntk", scale=4))
    before = copy.deepcopy(cfg)
    apply_rope(cfg, RopeSpec("ntk", scale=4))  # same spec again: nothing to stack
    assert cfg == before
    cfg["rope_parameters"]["rope_theta"] = 12345.0  # edited by hand: the record no longer describes it
    assert read_rope(cfg).method == "none"


# ---------------------------------------------------------------- bad input: one clear error, no output
BAD = [
    (["--preset", "yi-6b", "--rope", "pi", "--scale", "0.5"], "scale must be >= 1"),
    (["--preset", "yi-6b", "--rope", "yarn", "--scale", "4", "--yarn-alpha", "32", "--yarn-beta", "32"],
     "must be < yarn beta"),
    (["--preset", "yi-6b", "--rope", "abf"], "needs --rope-base"),
    (["--preset", "llama3.1-8b", "--rope", "yarn", "--scale", "2"], "pass --replace"),
    (["--preset", "yi-6b", "--head-dim", "128", "--base", "1e4"], "exactly one model"),
]


@pytest.mark.parametrize("argv,msg", BAD)
def test_bad_input_cli(argv, msg, capsys):
    assert describe_main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert msg in cap.err and len(cap.err.strip().splitlines()) == 1


def test_bad_configs(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64}))
    assert describe_main(["--config", str(tmp_path), "--rope", "pi", "--scale", "2"]) == 2
    assert "no RoPE fields" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"rope_theta": 1e4,\n oops}')
    assert describe_main(["--config", str(bad)]) == 2
    assert f"{bad}:2: malformed JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # argparse refuses an unknown method
        describe_main(["--preset", "yi-6b", "--rope", "bogus"])
    assert e.value.code == 2 and capsys.readouterr().out == ""
    with pytest.raises(InputError, match="unknown RoPE method"):
        RopeSpec("su")  # Phi-3's old name for longrope
    with pytest.raises(InputError, match="needs --longrope-factors FILE"):
        RopeSpec("longrope")
    with pytest.raises(InputError, match="no RoPE fields"):
        apply_rope({"hidden_size": 64, "num_attention_heads": 4}, RopeSpec("pi", scale=2))


def test_spec_roundtrip_and_args():
    import argparse

    from rope_scaling import add_rope_args, spec_from_args

    p = add_rope_args(argparse.ArgumentParser())
    a = p.parse_args(["--rope", "yarn", "--scale", "16", "--rope-base", "5e6", "--orig-ctx", "4096",
                      "--yarn-alpha", "2", "--yarn-beta", "16", "--yarn-mscale", "1.2", "--replace"])
    s = spec_from_args(a)
    assert s == RopeSpec("yarn", 16.0, 5e6, 4096, 2.0, 16.0, 1.2, True)
    assert RopeSpec.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert spec_from_args(p.parse_args([])) == RopeSpec()
    with pytest.raises(InputError, match="unknown rope spec key"):
        RopeSpec.from_dict({"method": "pi", "sclae": 2})
    help_text = p.format_help()
    for flag in ("--rope", "--scale", "--rope-base", "--orig-ctx", "--yarn-alpha", "--yarn-beta", "--yarn-mscale",
                 "--replace"):
        assert flag in help_text


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "rope_scaling", "describe", "--preset", "yi-6b", "--rope", "yarn",
                        "--scale", "16", "--json"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["counts"] == {"extrapolated": 13, "mixed": 14, "interpolated": 37}
    r = subprocess.run([sys.executable, "-m", "rope_scaling", "describe", "--preset", "yi-6b", "--rope", "abf"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith("error: ")

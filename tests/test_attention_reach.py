"""The context a setting serves (``rope_scaling.hf.served_context``): the frequency method's extended context, or
with an attention-level method (``--attention-extend``) its reach -- the longest context whose relative positions
stay below the context the frequencies serve. Checked against the numbers written out by hand (Self-Extend,
Jin et al. 2024 Sec 3.2: (L - W) * G + W) and against a brute force over each paper's position definition (written
here, not the code's), then through load_config, generation's labels and run.json, and the probes' records."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rope_scaling import RopeSpec
from ropescale.common.io import InputError

SE = RopeSpec(attention_extend="self_extend", grp_attn_n=4, grp_attn_w=64)


# ---------------------------------------------------------------- the references, from the papers
def se_relative(i: int, j: np.ndarray, G: int, W: int) -> np.ndarray:
    """Self-Extend's relative position of query i and keys j <= i (Jin et al. 2024, Eq. 3-4): i - j inside the
    neighbour window W, else (i // G + W - W // G) - j // G."""
    return np.where(i - j < W, i - j, (i // G + W - W // G) - j // G)


def dca_relative(i: int, j: np.ndarray, C: int, L: int) -> np.ndarray:
    """DCA's relative position (An et al. 2024, Sec 3; s = C - L): keys at j mod s; the query at i mod s in its own
    chunk, min(i mod s + s, C) over the previous chunk, min(2s - 1, C) over any earlier one."""
    s = C - L
    q = np.where(j // s == i // s, i % s, np.where(j // s == i // s - 1, min(i % s + s, C), min(2 * s - 1, C)))
    return q - j % s


def brute_reach(relative, ctx: int, limit: int) -> int:
    """The largest length T <= ``limit`` whose every query / key pair has a relative position below ``ctx`` (the
    positions a RoPE model saw: 0 .. ctx - 1), by trying every pair; ``limit`` when none exceeds it."""
    for i in range(limit):
        if relative(i, np.arange(i + 1)).max() >= ctx:
            return i  # lengths 1 .. i are fine; T = i + 1 holds the first pair past it
    return limit


def tiny_config(tmp_path, orig: int = 256):
    """A tiny Llama config (no weights: load_config reads config.json only) with a 256-token original context."""
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=2,
                vocab_size=64, intermediate_size=48, max_position_embeddings=orig).save_pretrained(tmp_path)
    return tmp_path


# ---------------------------------------------------------------- the rule
def test_self_extend_serves_its_reach(tmp_path):
    from rope_scaling.hf import served_context
    from rope_scaling.load import load_config

    mc = load_config(tiny_config(tmp_path), SE)
    assert mc.context == 832 == (256 - 64) * 4 + 64  # by hand: llama.cpp's --grp-attn rule
    assert mc.rope_context == 256 and served_context(mc.config, mc.state) == 832
    assert brute_reach(lambda i, j: se_relative(i, j, 4, 64), 256, 2000) == 832  # the paper's positions, every pair
    # over a frequency method: the relative positions must stay below ITS context (YaRN x2: 512)
    both = load_config(tmp_path, RopeSpec("yarn", 2, attention_extend="self_extend", grp_attn_n=4, grp_attn_w=64))
    assert (both.context, both.rope_context) == ((512 - 64) * 4 + 64, 512) == (1856, 512)
    assert brute_reach(lambda i, j: se_relative(i, j, 4, 64), 512, 4000) == 1856


def test_dca_is_unbounded_and_a_plain_method_unchanged(tmp_path):
    from rope_scaling.load import load_config

    tiny_config(tmp_path)
    dca = load_config(tmp_path, RopeSpec(attention_extend="dca"))
    assert dca.context is None and dca.rope_context == 256  # any length; the frequencies' context kept beside it
    yarn = load_config(tmp_path, RopeSpec("yarn", 2))
    assert (yarn.context, yarn.rope_context) == (512, 512)
    assert load_config(tmp_path).context == 256
    # DCA's default sizes (C = 3/4, L = 1/8 of 256: s = 160) keep every relative position below 256 at any length
    assert brute_reach(lambda i, j: dca_relative(i, j, 192, 32), 256, 1500) == 1500


@pytest.mark.parametrize("method,params,ctx", [("self_extend", (4, 48), 32), ("dca", (40, 4), 32),
                                               ("dca", (24, 4), 32), ("self_extend", (2, 8), 32)])
def test_max_context_equals_the_brute_force(method, params, ctx):
    """The edges too: a neighbour window wider than the context (reach = the context), a DCA chunk longer than it."""
    import math

    from ropescale.common.attention_extend import max_context, rule_of

    if method == "self_extend":
        rule = rule_of(method, group=params[0], window=params[1])
        want = brute_reach(lambda i, j: se_relative(i, j, *params), ctx, 400)
    else:
        rule = rule_of(method, chunk_size=params[0], local_size=params[1], orig_ctx=ctx)
        want = brute_reach(lambda i, j: dca_relative(i, j, *params), ctx, 400)
    got = max_context(rule, ctx)
    assert (want == 400 and math.isinf(got)) or got == want, (got, want)


@pytest.mark.parametrize("spec,want", [(RopeSpec("pi", 2), 512), (RopeSpec("ntk", 2), 512),
                                       (RopeSpec("yarn", 4), 1024), (RopeSpec("dynamic_ntk", 2), 512),
                                       (RopeSpec("llama3", 8), 2048), (RopeSpec(), 256)])
def test_describe_and_the_frequency_methods_are_unchanged(spec, want, tmp_path):
    """A frequency method serves its extended context, orig x s (by hand), the number describe prints; describe
    shows no attention line for it."""
    from transformers import AutoConfig

    from rope_scaling.describe import describe, format_table
    from rope_scaling.load import load_config

    tiny_config(tmp_path)
    mc = load_config(tmp_path, spec)
    d = describe(AutoConfig.from_pretrained(tmp_path), spec)
    assert mc.context == mc.rope_context == d["extended_context"] == want
    assert "attention_extend" not in d and "attention:" not in format_table(d)


def test_describe_still_prints_self_extends_reach_over_the_original_context(tmp_path):
    from transformers import AutoConfig

    from rope_scaling.describe import describe, format_table

    d = describe(AutoConfig.from_pretrained(tiny_config(tmp_path)), SE)
    assert d["attention_extend"]["max_context"] == 832 and "up to 832 tokens" in format_table(d)


# ---------------------------------------------------------------- generation's labels and run.json
def _data(path, chapters, sizes) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for i, n in enumerate(sizes):
            ch = chapters[i % len(chapters)]
            f.write(json.dumps({"id": f"s{i}", "context": ch["text"][:n], "summary": ch["title"]},
                               ensure_ascii=False) + "\n")
    return str(path)


def test_generation_labels_a_sample_within_self_extends_reach(make_tiny_model, chapters, tmp_path):
    """orig 64, Self-Extend G = 2, W = 16: reach (64 - 16) * 2 + 16 = 112 (by hand). A sample whose prompt + max new
    tokens lies in (64, 112] is within the extended context (neither counted over it nor warned of); without
    Self-Extend the same sample is beyond the 64-token context."""
    from ropescale.evaluation.generate import generate

    _, d = make_tiny_model("llama", orig_ctx=64)
    data = _data(tmp_path / "eval.jsonl", chapters, (10, 20, 120))
    se = RopeSpec(attention_extend="self_extend", grp_attn_n=2, grp_attn_w=16)
    logs = []
    generate(str(d), data, "ie", tmp_path / "se", rope=se, max_new_tokens=4, min_new_tokens=0, progress=False,
             log=logs.append)
    meta = json.loads((tmp_path / "se" / "run.json").read_text())
    recs = [json.loads(x) for x in (tmp_path / "se" / "predictions.jsonl").read_text().splitlines()]
    totals = [r["input_tokens"] + 4 for r in recs]
    assert any(64 < t <= 112 for t in totals), totals  # the case under test is present
    assert meta["context"] == 112 and meta["info"]["counts"]["over_context"] == sum(t > 112 for t in totals)
    assert any("extended context 112" in m for m in logs)
    warned = [m for m in logs if "longer than the model's 112-token context" in m]
    assert len(warned) == 1 and warned[0].split("warning: ")[1].startswith(f"{sum(t > 112 for t in totals)} of 3")
    generate(str(d), data, "ie", tmp_path / "plain", max_new_tokens=4, min_new_tokens=0, progress=False,
             log=lambda m: None)
    plain = json.loads((tmp_path / "plain" / "run.json").read_text())
    assert plain["context"] == 64 and plain["info"]["counts"]["over_context"] == sum(t > 64 for t in totals) > 0


def test_generation_with_dca_records_an_unbounded_context(make_tiny_model, chapters, tmp_path):
    from ropescale.evaluation.generate import generate

    _, d = make_tiny_model("llama", orig_ctx=64)
    data = _data(tmp_path / "eval.jsonl", chapters, (80, 120))
    dca = RopeSpec(attention_extend="dca", dca_chunk_size=48, dca_local_size=8)
    logs = []
    res = generate(str(d), data, "ie", tmp_path / "dca", rope=dca, max_new_tokens=4, min_new_tokens=0,
                   progress=False, log=logs.append)
    meta = json.loads((tmp_path / "dca" / "run.json").read_text())
    assert meta["context"] is None and res["over_context"] == 0 and res["done"] == 2
    assert any("extended context unbounded" in m for m in logs)
    # --truncate middle has no default limit to cut to: one line naming the flag, before any model loads
    with pytest.raises(InputError, match="pass --max-input-tokens") as e:
        generate(str(d), data, "ie", tmp_path / "cut", rope=dca, truncate="middle", max_new_tokens=4, progress=False,
                 log=lambda m: None)
    assert "\n" not in str(e.value) and not (tmp_path / "cut").exists()


# ---------------------------------------------------------------- the probes
def test_the_probes_record_the_context_the_setting_serves(make_tiny_model, tmp_path):
    from ropescale.common.settings import make
    from ropescale.probes.common import ProbeRun, ProbeSettings, load_model

    _, d = make_tiny_model("llama", orig_ctx=64)
    se = load_model(str(d), RopeSpec(attention_extend="self_extend", grp_attn_n=2, grp_attn_w=16))
    assert (se.context, se.default_length) == (112, 112)
    dca = load_model(str(d), RopeSpec(attention_extend="dca", dca_chunk_size=48, dca_local_size=8))
    assert dca.context is None and dca.default_length == 64  # a default length stays finite: the frequencies'
    run = ProbeRun("ppl", dca, make(ProbeSettings, out=str(tmp_path / "p")), [32])
    assert json.loads(json.dumps(run.rec.to_json()))["context"] is None


@pytest.mark.parametrize("flags, context", [
    (["--attention-extend", "dca", "--dca-chunk-size", "48", "--dca-local-size", "8"], None),  # any length
    (["--attention-extend", "self_extend", "--grp-attn-n", "16", "--grp-attn-w", "16"], (64 - 16) * 16 + 16),
])
def test_finetune_runs_and_records_the_context_an_attention_method_serves(
        flags, context, tmp_path, make_tiny_model, chapters, tiny_tokenizer_dir, capsys):
    import json

    from ft_helpers import packed

    from ropescale.training.cli import main

    _, model_dir = make_tiny_model(orig_ctx=64)
    data = packed(chapters, tiny_tokenizer_dir, tmp_path / "packed", 300, 480, n=4)
    out = tmp_path / "run"
    rc = main([str(a) for a in ["--model", model_dir, "--data", data, "--max-steps", "1", "--global-batch", "2",
                                "--warmup-steps", "0", "--output-dir", out, *flags]])
    err = capsys.readouterr().err
    assert rc == 0, err[-2000:]
    assert json.loads((out / "run.json").read_text())["context"] == context
    assert f"context {'unbounded' if context is None else context} tokens" in err

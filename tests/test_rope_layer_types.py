"""Issue 51.3: per-layer-type RoPE (Gemma 3: sliding-window layers with a local RoPE, full-attention layers with the
long one). A tiny Gemma-3-style model built here (two layer types): through ``rope_scaling.load`` its logits equal
transformers' own model on a config written by hand, unscaled and scaled (full_attention layers only, and every
layer type with --rope-layers all), in a forward, in the probes' scorer and in the hf backend's generation;
``describe`` shows each layer type and its pairs equal transformers' init function; ``proportional`` read and
applied."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from rope_scaling import RopeSpec
from ropescale.common.io import InputError


@pytest.fixture(autouse=True)
def _no_grad():
    """Forwards without autograd, for this file's tests only (a module-level switch would leak into other files)."""
    with torch.no_grad():
        yield


SLIDING = {"rope_type": "default", "rope_theta": 100.0}
FULL = {"rope_type": "default", "rope_theta": 1000.0}
TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def config(full=FULL, sliding=SLIDING):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            num_hidden_layers=len(TYPES), vocab_size=64, intermediate_size=48,
                            max_position_embeddings=64, sliding_window=8, layer_types=list(TYPES),
                            rope_parameters={"sliding_attention": dict(sliding), "full_attention": dict(full)},
                            initializer_range=0.2, eos_token_id=63, pad_token_id=0, bos_token_id=1)


@pytest.fixture
def gemma(tmp_path):
    from transformers import Gemma3ForCausalLM

    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config()).eval()
    model.save_pretrained(tmp_path)
    return model, tmp_path


def ours(path, spec):
    from rope_scaling.load import load_config, load_model

    mc = load_config(path, spec)
    return load_model(path, mc.config, dtype="float32", attn="sdpa", state=mc.state).eval(), mc


def theirs(model, full=FULL, sliding=SLIDING):
    """transformers' own Gemma 3 on a config written by hand, with ``model``'s weights."""
    from transformers import Gemma3ForCausalLM

    m = Gemma3ForCausalLM(config(full, sliding)).eval()
    m.load_state_dict(model.state_dict())
    return m


YARN4 = {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 64,
         "beta_fast": 32.0, "beta_slow": 1.0}
CASES = [
    (RopeSpec(), FULL, SLIDING),
    (RopeSpec("yarn", 4), YARN4, SLIDING),
    (RopeSpec("pi", 4), {"rope_type": "linear", "rope_theta": 1000.0, "factor": 4.0}, SLIDING),
    (RopeSpec("yarn", 4, rope_layers="all"), YARN4, {**YARN4, "rope_theta": 100.0}),
]


@pytest.mark.parametrize("spec,full,sliding", CASES, ids=["unscaled", "yarn-full", "pi-full", "yarn-all"])
def test_logits_equal_transformers_own_model(spec, full, sliding, gemma):
    from ropescale.probes.scorer import scored_logprobs

    model, path = gemma
    mine, mc = ours(path, spec)
    ref = theirs(model, full, sliding)
    rp = mc.config.rope_parameters
    assert rp["sliding_attention"]["rope_type"] == sliding["rope_type"]  # sliding layers left alone unless "all"
    ids = torch.randint(1, 63, (1, 100), generator=torch.Generator().manual_seed(1))  # past the 64-token context
    want = ref(ids).logits
    assert (mine(ids).logits - want).abs().max().item() <= 1e-5
    if spec.scaled:
        assert (mine(ids).logits - model(ids).logits).abs().max().item() > 1e-3  # the scaling did something
    # the probes' forward (their scorer: the decoder, then the head on the scored positions)
    lp = scored_logprobs(mine, [ids[0].tolist()], [50], 0)[0]
    want_lp = torch.log_softmax(want[0, 49:99].float(), -1).gather(-1, ids[0, 50:, None])[:, 0]
    assert (lp - want_lp).abs().max().item() <= 1e-5


@pytest.mark.parametrize("spec,full,sliding", CASES[:2], ids=["unscaled", "yarn-full"])
def test_generation_routes_to_generate_and_equals_transformers(spec, full, sliding, gemma):
    from types import SimpleNamespace

    from ropescale.evaluation.backends import BackendSettings
    from ropescale.evaluation.backends.base import Item
    from ropescale.evaluation.backends.hf import HFBackend

    model, path = gemma
    mine, mc = ours(path, spec)
    ref = theirs(model, full, sliding)
    logs = []
    be = HFBackend(path, mc.config, SimpleNamespace(pad_token_id=0, eos_token_id=63), BackendSettings(), model=mine,
                   log=logs.append)
    assert be.cache == "static" and len(logs) == 1 and "sliding-window" in logs[0]
    seqs = [torch.randint(1, 63, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (70, 40)]
    got = {}
    be.generate([Item(i, s) for i, s in enumerate(seqs)], 6, 6, lambda it, o: got.__setitem__(it.id, o))
    for i, s in enumerate(seqs):
        want = ref.generate(input_ids=torch.tensor([s]), max_new_tokens=6, min_new_tokens=6, do_sample=False,
                            eos_token_id=63, pad_token_id=0)[0, len(s):].tolist()
        assert got[i] == want


def test_describe_shows_each_layer_type_and_equals_transformers(gemma, capsys):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from rope_scaling.describe import main

    _, path = gemma
    assert main(["--config", str(path), "--rope", "yarn", "--scale", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["layer_types"]["full_attention"] == {"layers": 2, "window": None, "rope_type": "yarn",
                                                  "rope_theta": 1000.0, "factor": 4.0}
    assert d["layer_types"]["sliding_attention"]["rope_type"] == "default"
    assert d["layer_types"]["sliding_attention"]["window"] == 8 and d["rope_change"]["message"].endswith(
        "(full_attention layers only; sliding_attention keep their RoPE: --rope-layers all to scale them too)")
    inv, att = ROPE_INIT_FUNCTIONS["yarn"](config(YARN4), "cpu", layer_type="full_attention")
    assert [r["inv_freq_scaled"] for r in d["dims"]] == pytest.approx(inv.double().tolist(), rel=1e-6)
    assert d["attention_factor"] == pytest.approx(float(att), rel=1e-9)
    assert main(["--config", str(path), "--rope", "yarn", "--scale", "4"]) == 0
    table = capsys.readouterr().out
    assert "layer type full_attention (2 layers): yarn" in table
    assert "layer type sliding_attention (3 layers, window 8): default, rope_theta 100" in table


def test_proportional_is_read_and_applied(tmp_path):
    from transformers import Gemma3ForCausalLM
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from rope_scaling.describe import describe

    prop = {"rope_type": "proportional", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}
    cfg = config(prop)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path)
    mine, mc = ours(tmp_path, RopeSpec())
    assert mc.rope.method == "proportional" and mc.rope.rope_proportion == 0.5
    ids = torch.randint(1, 63, (1, 40), generator=torch.Generator().manual_seed(2))
    assert (mine(ids).logits - model(ids).logits).abs().max().item() <= 1e-5
    inv, _ = ROPE_INIT_FUNCTIONS["proportional"](copy.deepcopy(cfg), "cpu", layer_type="full_attention")
    d = describe(mc.config.to_dict())
    assert [r["inv_freq_scaled"] for r in d["dims"]] == pytest.approx(inv.double().tolist(), rel=1e-6, abs=0)
    assert [r["inv_freq_scaled"] == 0 for r in d["dims"]] == [False, False, True, True]
    assert d["counts"]["extrapolated"] == 4  # the model's own rope: nothing scaled
    with pytest.raises(InputError, match="another method on top of it is not supported"):
        ours(tmp_path, RopeSpec("yarn", 4, replace=True))


def test_refusals_in_one_line(gemma, tmp_path):
    from rope_scaling.load import load_config
    from ropescale.evaluation.backends.vllm import vllm_settings

    _, path = gemma
    with pytest.raises(InputError, match="--rope dynamic_yarn on a per-layer-type config"):
        load_config(path, RopeSpec("dynamic_yarn", 4))
    mc = load_config(path, RopeSpec("yarn", 4))
    with pytest.raises(InputError, match=r"per-layer-type rope_parameters.*--backend hf"):
        vllm_settings(mc.config, mc.rope_fields(), need=100, want=200, state=mc.state, vllm="0.11.1")
    from transformers import LlamaConfig

    flat = tmp_path / "flat"
    LlamaConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, vocab_size=64, intermediate_size=48,
                max_position_embeddings=64).save_pretrained(flat)
    with pytest.raises(InputError, match="--rope-layers all: the config has one rope for every layer") as e:
        load_config(flat, RopeSpec("yarn", 4, rope_layers="all"))
    assert "\n" not in str(e.value)

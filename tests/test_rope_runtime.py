"""The rules that follow the length, as a model runs them.

- dynamic YaRN (``rope_scaling.load.install_rope_rule`` -> ``compat.rope.install_length_rope``): the rotary module of a
  tiny model, in every forward, against the YaRN paper's formula worked here by hand (arXiv 2309.00071 Sec 3.2-3.4;
  the YaRN repo's ``LlamaDynamicYaRNScaledRotaryEmbedding``: s = L / L_orig past the original context, ramp ends
  floor(i(beta)), ceil(i(alpha)) with i(r) = d ln(L_orig / (2 pi r)) / (2 ln b), attention 0.1 ln s + 1) at six
  lengths, and the whole model's logits against transformers' static ``yarn`` at factor L / L_orig;
- the slot decoder and padded ``generate`` with dynamic YaRN and with LongRoPE, per sample, against batch-1
  references: for LongRoPE transformers' own ``longrope`` module given one factor set for both lists (so its
  per-forward switch cannot matter), the set this repo picks per sample (long when prompt + max new tokens >
  the original context).
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
from test_generate import varied

from rope_scaling import RopeSpec, apply_rope
from rope_scaling.spec import LongRopeFactors

ORIG, D, BASE = 64, 16, 10000.0  # the tiny test models: head_dim 16 (8 rotary pairs), base 1e4


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Tiny forwards on one thread (conftest.one_thread)."""


def yarn_by_hand(L: int, s_max: float = 8.0) -> tuple[list[float], float]:
    """Dynamic YaRN's inv_freq and attention factor at length L, from the paper's formulas (not this repo's code)."""
    theta = [BASE ** (-2 * i / D) for i in range(D // 2)]
    s = L / ORIG
    if s <= 1:
        return theta, 1.0

    def i_of(r):  # the pair index whose wavelength turns r times over the original context
        return D * math.log(ORIG / (2 * math.pi * r)) / (2 * math.log(BASE))

    low, high = max(math.floor(i_of(32)), 0), min(math.ceil(i_of(1)), D - 1)
    out = []
    for i, t in enumerate(theta):
        g = min(max((i - low) / (high - low), 0.0), 1.0)  # 1: interpolate (/ s), 0: keep
        out.append(t / s * g + t * (1 - g))
    return out, 0.1 * math.log(s) + 1


def varied_model(make_tiny_model, seed: int):
    """A tiny Qwen2 model (orig 64) whose matrices are redrawn so that greedy decoding varies
    (tests/test_generate.varied), saved; returns its directory."""
    return varied(make_tiny_model, "qwen2", seed, orig_ctx=ORIG)[1]


def load(d, spec):
    from rope_scaling.load import load_config, load_model

    cfg = load_config(d, spec)
    return load_model(d, cfg.config, dtype=torch.float32, attn="sdpa").eval()


def plain(d, cfg):
    """The model as plain transformers loads it with ``cfg`` (no rule of this repo)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(d), config=cfg, dtype=torch.float32,
                                                attn_implementation="sdpa").eval()


# ---------------------------------------------------------------- dynamic YaRN through the runtime hook
def test_dynamic_yarn_hook_equals_the_paper_formula_in_every_forward(make_tiny_model):
    from transformers import AutoConfig

    d = varied_model(make_tiny_model, 11)
    model = load(d, RopeSpec("dynamic_yarn", 8))
    rot = model.model.rotary_emb
    x = torch.zeros(1, 1, 64)
    # in any order (no state carried from a longer forward to a shorter one), below, at and past orig x s
    for L in (512, 40, 100, 64, 256, 700):
        inv, att = yarn_by_hand(L)
        pos = torch.arange(L).unsqueeze(0)
        with torch.no_grad():
            cos, sin = rot(x, pos)
        ang = torch.tensor(inv, dtype=torch.float64)[None, :] * torch.arange(L, dtype=torch.float64)[:, None]
        ang = torch.cat([ang, ang], dim=-1)
        assert torch.allclose(cos[0].double(), ang.cos() * att, atol=2e-5), L
        assert torch.allclose(sin[0].double(), ang.sin() * att, atol=2e-5), L
    # the whole model: YaRN at s = L / orig is transformers' static yarn at that factor (plain RoPE up to orig)
    ids = torch.randint(1, 500, (1, 700), generator=torch.Generator().manual_seed(0))
    for L in (50, 100, 300):
        cfg = AutoConfig.from_pretrained(str(d))
        if L > ORIG:
            apply_rope(cfg, RopeSpec("yarn", L / ORIG))
        with torch.no_grad():
            want = plain(d, cfg)(input_ids=ids[:, :L]).logits
            got = model(input_ids=ids[:, :L]).logits
        assert torch.allclose(got, want, atol=1e-4), L


def test_dynamic_yarn_written_config_is_static_yarn_for_plain_transformers(make_tiny_model):
    """What a merged dynamic_yarn model gives plain transformers: static YaRN x s at every length (the entries
    say yarn, factor s), equal to this repo's rule at orig x s only."""
    from rope_scaling.load import load_config

    d = varied_model(make_tiny_model, 12)
    cfg = load_config(d, RopeSpec("dynamic_yarn", 4)).config
    assert cfg.rope_parameters["rope_type"] == "yarn" and cfg.rope_parameters["factor"] == 4
    ours, theirs = load(d, RopeSpec("dynamic_yarn", 4)), plain(d, copy.deepcopy(cfg))
    ids = torch.randint(1, 500, (1, 256), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        at = (ours(input_ids=ids).logits - theirs(input_ids=ids).logits).abs().max()  # L = 64 x 4
        short = ids[:, :100]
        below = (ours(input_ids=short).logits - theirs(input_ids=short).logits).abs().max()
    assert at < 1e-3 and below > 0.1, (at, below)  # float32 rounding of the frequencies vs another rope


# ---------------------------------------------------------------- decoding, per sample
def prompts(tiny_tokenizer, chapters, lengths):
    seqs = []
    for i, n in enumerate(lengths):
        ids = tiny_tokenizer(chapters[i]["text"] * 4)["input_ids"][:n]
        assert len(ids) == n
        seqs.append(ids)
    return seqs


def greedy(model, s, max_new, eos, pad):
    o = model.generate(input_ids=torch.tensor([s]), attention_mask=torch.ones(1, len(s), dtype=torch.long),
                       do_sample=False, max_new_tokens=max_new, min_new_tokens=max_new, eos_token_id=eos,
                       pad_token_id=pad)
    return o[0, len(s):].tolist()


def decode_all(d, model, tokenizer, seqs, max_new, eos, cache, slots):
    from ropescale.evaluation.backends import BackendSettings, HFBackend, Item

    per = max(map(len, seqs)) + 2 * max_new
    be = HFBackend(d, model.config, tokenizer, BackendSettings(batch_tokens=slots * per, max_batch=slots, cache=cache),
                   model=model)
    assert be.cache == cache
    be.eos = [eos]
    got = {}
    be.generate([Item(i, s) for i, s in enumerate(seqs)], max_new, max_new, lambda it, o: got.__setitem__(it.id, o))
    return [got[i] for i in range(len(seqs))]


# prompt lengths around the original context (64) with 12 new tokens: within it all along, crossing it while
# decoding (prompt <= 64 < prompt + 12), past it from the start
LENGTHS = (30, 58, 64, 70, 120)
MAX_NEW = 12


@pytest.mark.parametrize("cache,slots", [("slots", 3), ("static", 4)])
def test_dynamic_yarn_decodes_each_sample_as_batch1_generate(make_tiny_model, tiny_tokenizer, chapters, cache,
                                                             slots):
    d = varied_model(make_tiny_model, 13)
    model = load(d, RopeSpec("dynamic_yarn", 4))
    seqs = prompts(tiny_tokenizer, chapters, LENGTHS)
    eos, pad = len(tiny_tokenizer) - 1, tiny_tokenizer.pad_token_id
    ref = [greedy(model, s, MAX_NEW, eos, pad) for s in seqs]  # each forward at its own length (the hook)
    got = decode_all(d, model, tiny_tokenizer, seqs, MAX_NEW, eos, cache, slots)
    if cache == "slots":
        assert got == ref
    else:  # a padded batch shares one length per step (the longest row's), as with dynamic NTK: batch 1 equal
        assert decode_all(d, model, tiny_tokenizer, seqs, MAX_NEW, eos, cache, 1) == ref
    static = plain(d, copy.deepcopy(model.config))  # the teeth: static YaRN x4 decodes the short ones otherwise
    assert [greedy(static, s, MAX_NEW, eos, pad) for s in seqs[:2]] != ref[:2]


SHORT = (1.0, 1.02, 0.97, 1.05, 1.0, 1.08, 0.99, 1.03)
LONG = (1.0, 1.3, 1.9, 2.8, 3.6, 4.4, 5.2, 6.0)


@pytest.mark.parametrize("cache,slots", [("slots", 3), ("slots", 1), ("static", 4), ("dynamic", 2)])
def test_longrope_one_factor_set_per_sample_from_its_prefill(make_tiny_model, tiny_tokenizer, chapters, cache,
                                                             slots):
    d = varied_model(make_tiny_model, 14)
    model = load(d, RopeSpec("longrope", 4, longrope_factors=LongRopeFactors(SHORT, LONG)))
    assert model.model.rotary_emb.rope_type == "longrope"  # transformers' own module

    def fixed(f):  # transformers' longrope with one set for both lists: nothing to switch
        return load(d, RopeSpec("longrope", 4, longrope_factors=LongRopeFactors(f, f)))

    short_model, long_model = fixed(SHORT), fixed(LONG)
    seqs = prompts(tiny_tokenizer, chapters, LENGTHS)
    eos, pad = len(tiny_tokenizer) - 1, tiny_tokenizer.pad_token_id
    ref = [greedy(long_model if len(s) + MAX_NEW > ORIG else short_model, s, MAX_NEW, eos, pad) for s in seqs]
    assert decode_all(d, model, tiny_tokenizer, seqs, MAX_NEW, eos, cache, slots) == ref
    # the teeth: a crossing sample decodes otherwise with the short set, and transformers' per-forward switch
    # (short keys in the cache, long queries) is neither
    crossing = seqs[1]
    assert ref[1] != greedy(short_model, crossing, MAX_NEW, eos, pad)
    assert ref[1] != greedy(model, crossing, MAX_NEW, eos, pad)

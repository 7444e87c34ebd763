"""Issue 51.2: Self-Extend and DCA as training-free attention-level methods, against an explicit reference written
here from each paper's position-matrix definition: every layer's attention recomputed as the full matrix (q and k
rotated at each pair's own positions, one softmax over all keys), the model's logits compared in prefill and in
cached decoding (max difference <= 1e-5); the position rules checked against the authors' code's own construction
(LongLM's neighbour mask and group positions; ChunkLlama's q / qc / k position tables)."""
from __future__ import annotations

import pytest
import torch

from rope_scaling import RopeSpec
from ropescale.common.io import InputError


@pytest.fixture(autouse=True)
def _no_grad():
    """Forwards without autograd, for this file's tests only (a module-level switch would leak into other files)."""
    with torch.no_grad():
        yield


# ---------------------------------------------------------------- the references, from the papers
def se_positions(i: int, j: int, G: int, W: int) -> tuple[float, float]:
    """Self-Extend (Jin et al. 2024, Eq. 3-4): distance i - j < W keeps (i, j); else the grouped positions
    (i // G + W - W // G, j // G), so the grouped relative position continues the neighbour window."""
    if i - j < W:
        return i, j
    return i // G + W - W // G, j // G


def dca_positions(i: int, j: int, C: int, L: int) -> tuple[float, float]:
    """DCA (An et al. 2024, Sec 3; chunk length s = C - L): keys at j mod s; the query at i mod s in its own chunk,
    min(i mod s + s, C) over the previous chunk, and min(2s - 1, C) over any earlier one."""
    s = C - L
    if j // s == i // s:
        q = i % s
    elif j // s == i // s - 1:
        q = min(i % s + s, C)
    else:
        q = min(2 * s - 1, C)
    return q, j % s


def rope(x, pos: float, inv_freq):
    """x (h, d) rotated at position ``pos`` (RoFormer; transformers' rotate_half layout)."""
    ang = torch.tensor([pos * float(f) for f in inv_freq], dtype=torch.float64)
    cos, sin = torch.cat([ang, ang]).cos().to(x.dtype), torch.cat([ang, ang]).sin().to(x.dtype)
    half = torch.cat([-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]], -1)
    return x * cos + half * sin


def reference_attention(attn, hidden, rule, inv_freq):
    """A Llama attention layer written out: q, k, v projections, then for every query i and key j <= i the logit of
    q_i and k_j rotated at the rule's (p_q, p_k), one softmax over j, the weighted values, o_proj."""
    n = hidden.shape[1]
    hd = attn.head_dim
    q = attn.q_proj(hidden).view(n, -1, hd)
    k = attn.k_proj(hidden).view(n, -1, hd)
    v = attn.v_proj(hidden).view(n, -1, hd)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = torch.zeros_like(q)
    qs, ks = {}, {}  # each token rotated once per position it is given
    for i in range(n):
        logits = torch.empty(q.shape[1], i + 1)
        for j in range(i + 1):
            pq, pk = rule(i, j)
            if (i, pq) not in qs:
                qs[i, pq] = rope(q[i], pq, inv_freq)
            if (j, pk) not in ks:
                ks[j, pk] = rope(k[j], pk, inv_freq)
            logits[:, j] = (qs[i, pq] * ks[j, pk]).sum(-1) * attn.scaling
        out[i] = torch.einsum("hj,jhd->hd", logits.softmax(-1), v[:i + 1])
    return attn.o_proj(out.reshape(1, n, -1))


def reference_logits(model, ids, rule):
    """The whole model with every attention layer replaced by :func:`reference_attention` (the same weights)."""
    inner = model.model
    inv = inner.rotary_emb.inv_freq.tolist()
    h = inner.embed_tokens(ids)
    for layer in inner.layers:
        h = h + reference_attention(layer.self_attn, layer.input_layernorm(h), rule, inv)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(inner.norm(h))


# ---------------------------------------------------------------- a tiny Llama (GQA, two layers)
def tiny(tmp_path, **rope):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=2,
                      vocab_size=64, intermediate_size=48, max_position_embeddings=32, initializer_range=0.2,
                      rope_parameters={"rope_type": "default", "rope_theta": 100.0, **rope})
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path)
    return model


def loaded(tmp_path, spec):
    from rope_scaling.load import load_config, load_model

    mc = load_config(tmp_path, spec)
    return load_model(tmp_path, mc.config, dtype="float32", attn="sdpa", state=mc.state).eval(), mc


CASES = [
    (RopeSpec(attention_extend="self_extend", grp_attn_n=4, grp_attn_w=8), lambda i, j: se_positions(i, j, 4, 8)),
    (RopeSpec(attention_extend="self_extend", grp_attn_n=3, grp_attn_w=6), lambda i, j: se_positions(i, j, 3, 6)),
    (RopeSpec(attention_extend="dca", dca_chunk_size=12, dca_local_size=4), lambda i, j: dca_positions(i, j, 12, 4)),
    (RopeSpec(attention_extend="dca"), lambda i, j: dca_positions(i, j, 24, 4)),  # defaults: 3/4 and 1/8 of 32
]


@pytest.mark.parametrize("spec,rule", CASES, ids=["se-4-8", "se-3-6", "dca-12-4", "dca-default"])
def test_prefill_and_cached_decoding_equal_the_full_matrix_reference(spec, rule, tmp_path):
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(1))  # past the 32-token context
    plain = tiny(tmp_path)
    model, mc = loaded(tmp_path, spec)
    assert model.config._attn_implementation == "ropescale_extend" and mc.rope.attention_extend == spec.attention_extend
    want = reference_logits(plain, ids, rule)[0]
    got = model(ids).logits[0]
    assert (got - want).abs().max().item() <= 1e-5
    assert (got - plain(ids).logits[0]).abs().max().item() > 1e-3  # the reference is not plain attention
    # cached decoding: a 25-token prefill, then one token a step through the cache (dynamic), each step's logits
    out = model(ids[:, :25], use_cache=True)
    cache, steps = out.past_key_values, []
    for t in range(25, 40):
        o = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        cache = o.past_key_values
        steps.append(o.logits[0, -1])
    assert (torch.stack(steps) - want[25:]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("spec,rule", [CASES[0], CASES[2]], ids=["se-4-8", "dca-12-4"])
def test_query_blocks_over_their_key_spans_equal_the_reference(spec, rule, tmp_path, monkeypatch):
    """Long inputs run a pass by blocks of query rows, each over the keys its rows see: blocks of 7 rows (spans cut
    by the causal edge, Self-Extend's band and DCA's chunks; a block with no key in a pass) give the reference."""
    from ropescale.common import attention_extend

    monkeypatch.setattr(attention_extend, "BLOCK", 7)
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(6))
    plain = tiny(tmp_path)
    model, _ = loaded(tmp_path, spec)
    assert (model(ids).logits[0] - reference_logits(plain, ids, rule)[0]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("spec,rule", [CASES[0], CASES[2]], ids=["se-4-8", "dca-12-4"])
def test_static_cache_and_chunked_prefill_equal_the_reference(spec, rule, tmp_path):
    """The cache the hf backend decodes with (a static one: its unfilled slots are masked keys) and a prefill in
    chunks through it: every position's logits equal the full-matrix reference (<= 1e-5)."""
    from transformers import StaticCache

    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(5))
    plain = tiny(tmp_path)
    model, _ = loaded(tmp_path, spec)
    want = reference_logits(plain, ids, rule)[0]
    cache, got = StaticCache(config=model.config, max_cache_len=48), []
    for a, b in ((0, 17), (17, 30), *((t, t + 1) for t in range(30, 40))):  # two chunks, then one token a step
        o = model(ids[:, a:b], past_key_values=cache, use_cache=True, cache_position=torch.arange(a, b))
        got.append(o.logits[0])
    assert (torch.cat(got) - want).abs().max().item() <= 1e-5


def test_left_padded_batches_equal_each_row_alone(tmp_path):
    """Key positions come from the mask: a left-padded row equals the same row alone (transformers' generate)."""
    tiny(tmp_path)
    model, _ = loaded(tmp_path, CASES[0][0])
    a = torch.randint(0, 64, (1, 30), generator=torch.Generator().manual_seed(2))
    b = a[:, 10:]
    ids = torch.cat([a, torch.cat([torch.zeros(1, 10, dtype=torch.long), b], 1)])
    mask = torch.ones_like(ids)
    mask[1, :10] = 0
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    for r, row in ((0, a), (1, b)):
        alone = model.generate(input_ids=row, max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert out[r, -6:].tolist() == alone[0, -6:].tolist()


# ---------------------------------------------------------------- the authors' code's position rules
def test_self_extend_positions_are_the_authors_construction():
    """datamllab/LongLM self_extend_patch/Llama.py: group query position i // G + W - W / G, key j // G, and the
    neighbour mask tril(ones) minus tril(ones(n - W)) shifted W rows down (i - j < W)."""
    G, W, n = 4, 8, 30
    nb = torch.tril(torch.ones(n, n))
    nb[W:, :-W] -= torch.tril(torch.ones(n - W, n - W))
    for i in range(n):
        for j in range(i + 1):
            pq, pk = se_positions(i, j, G, W)
            if nb[i, j]:
                assert (pq, pk) == (i, j)
            else:
                assert (pq, pk) == (i // G + W - W / G, j // G)
    # llama.cpp's --grp-attn-w must be a multiple of --grp-attn-n, and the paper's context bound
    with pytest.raises(InputError, match="multiple of --grp-attn-n"):
        RopeSpec(attention_extend="self_extend", grp_attn_n=3, grp_attn_w=8)
    from ropescale.common.attention_extend import max_context, rule_of

    assert max_context(rule_of("self_extend", group=G, window=W), 32) == (32 - W) * G + W


def test_dca_positions_are_the_authors_tables():
    """HKUNLP/ChunkLlama (and vLLM's DualChunkRotaryEmbedding): q_t = arange(s), qc_t = (arange(s) + s).clamp(max=C),
    k_t = arange % s; intra uses q_t[i % s], successive qc_t[i % s], inter qc_t[s - 1]."""
    C, L = 12, 4
    s = C - L
    q_t = list(range(s))
    qc_t = [min(x + s, C) for x in range(s)]
    for i in range(40):
        for j in range(i + 1):
            ci, cj = i // s, j // s
            want_q = q_t[i % s] if ci == cj else qc_t[i % s] if cj == ci - 1 else qc_t[s - 1]
            assert dca_positions(i, j, C, L) == (want_q, j % s)


def test_settings_are_checked_and_recorded(tmp_path):
    from rope_scaling.describe import describe

    spec = RopeSpec("yarn", 2, attention_extend="dca", dca_chunk_size=24, dca_local_size=4)
    assert spec.label() == "yarn x2 +dca C=24 L=4"
    assert RopeSpec.from_dict(spec.to_dict()) == spec  # the run record holds it with the RoPE spec
    assert RopeSpec(attention_extend="self_extend", grp_attn_n=4, grp_attn_w=8).label() == "self_extend G=4 W=8"
    with pytest.raises(InputError, match="--dca-chunk-size only applies to --attention-extend dca"):
        RopeSpec(attention_extend="self_extend", grp_attn_n=4, grp_attn_w=8, dca_chunk_size=8)
    with pytest.raises(InputError, match="needs --grp-attn-n"):
        RopeSpec(attention_extend="self_extend")
    # nothing of it is written into the config: it is the loaded model's
    tiny(tmp_path)
    model, mc = loaded(tmp_path, spec)
    assert "dual_chunk_attention_config" not in mc.config.to_dict() and "ropescale_rope" in mc.config.to_dict()
    assert "attention_extend" not in mc.config.to_dict()["ropescale_rope"]["spec"] or \
        mc.config.to_dict()["ropescale_rope"]["spec"]["attention_extend"] == "none"
    assert mc.rope.attention_fields() == spec.attention_fields() and mc.rope.method == "yarn"
    d = describe(mc.config.to_dict(), spec)
    assert d["attention_extend"]["method"] == "dca" and d["attention_extend"]["chunk_size"] == 24


def test_vllm_refuses_self_extend_and_dca_without_support(tmp_path):
    from rope_scaling.load import load_config
    from ropescale.evaluation.backends.vllm import vllm_settings

    tiny(tmp_path)
    mc = load_config(tmp_path, RopeSpec(attention_extend="self_extend", grp_attn_n=4, grp_attn_w=8))
    with pytest.raises(InputError, match=r"Self-Extend.*--backend hf") as e:
        vllm_settings(mc.config, mc.rope_fields(), need=40, want=64, state=mc.state, vllm="0.11.1")
    assert "\n" not in str(e.value)
    mc = load_config(tmp_path, RopeSpec(attention_extend="dca", dca_chunk_size=24, dca_local_size=4))
    with pytest.raises(InputError, match=r"dual_chunk_attention_config.*--backend hf"):
        vllm_settings(mc.config, mc.rope_fields(), need=40, want=64, state=mc.state, vllm="0.11.1", dca=False)
    ov, _ = vllm_settings(mc.config, mc.rope_fields(), need=40, want=64, state=mc.state, vllm="0.11.1", dca=True)
    assert ov["dual_chunk_attention_config"] == {"chunk_size": 24, "local_size": 4,
                                                 "original_max_position_embeddings": 32}


def test_the_hf_backend_says_it_uses_generate(tmp_path):
    from rope_scaling.load import load_config
    from ropescale.evaluation.engine import supported

    tiny(tmp_path)
    model, _ = loaded(tmp_path, CASES[2][0])
    why = supported(model)
    assert why and "dca" in why and "\n" not in why
    assert load_config(tmp_path).rope.attention_extend == "none"


@pytest.mark.parametrize("cache", ["slots", "static"])
def test_the_hf_backend_generates_with_a_cache_as_plain_generate(cache, tmp_path):
    """--cache slots cannot run it: the backend says so in one line and runs transformers generate with a static
    cache; its tokens equal batch-1 generate with a dynamic cache (key positions from the mask either way)."""
    from types import SimpleNamespace

    from ropescale.evaluation.backends import BackendSettings
    from ropescale.evaluation.backends.base import Item
    from ropescale.evaluation.backends.hf import HFBackend

    tiny(tmp_path)
    model, mc = loaded(tmp_path, CASES[0][0])
    logs = []
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=63)
    be = HFBackend(tmp_path, mc.config, tok, BackendSettings(cache=cache), model=model, log=logs.append)
    assert be.cache == "static"
    if cache == "slots":
        assert len(logs) == 1 and "--attention-extend self_extend" in logs[0] and "\n" not in logs[0]
    seqs = [torch.randint(1, 63, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (30, 21, 12)]
    got = {}
    be.eos = [63]
    be.generate([Item(i, s) for i, s in enumerate(seqs)], 8, 8, lambda it, o: got.__setitem__(it.id, o))
    for i, s in enumerate(seqs):
        want = model.generate(input_ids=torch.tensor([s]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                              eos_token_id=63, pad_token_id=0)[0, len(s):].tolist()
        assert got[i] == want


def test_fused_kernel_and_written_out_math_agree_with_empty_rows():
    from ropescale.common.attention_extend import attention_with_lse, attention_with_lse_math

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, n, 8, generator=g) for n in (5, 7, 7))
    keys = torch.rand(2, 1, 5, 7, generator=g) > 0.5
    keys[0, 0, 1] = False  # a query with no key in this pass
    o1, l1 = attention_with_lse(q, k, v, keys, 0.3)
    o2, l2 = attention_with_lse_math(q, k, v, keys, 0.3)
    assert (o1 - o2).abs().max() <= 1e-5 and torch.equal(torch.isinf(l1), torch.isinf(l2))
    assert (l1 - l2)[~torch.isinf(l2)].abs().max() <= 1e-5 and bool(torch.isinf(l1[0, :, 1]).all())


def test_the_probes_load_it_and_record_it():
    """The probes' loader (``ropescale.probes.common.load_model``, the committed tiny default) runs the method in its
    model's forward and records it with the RoPE spec (what run.json's ``rope`` holds)."""
    from ropescale.probes.common import load_model

    lo = load_model("tiny", RopeSpec(attention_extend="dca"))
    assert lo.model.config._attn_implementation == "ropescale_extend"
    assert (lo.rope["attention_extend"], lo.rope["dca_chunk_size"]) == ("dca", None)
    assert RopeSpec.from_record(lo.rope).label() == "dca"
    # within one chunk (s = C - L = 384 - 64 = 320 tokens of the 512-token default) DCA is plain attention; past it not
    short, long = (torch.randint(1, 100, (1, n), generator=torch.Generator().manual_seed(4)) for n in (300, 400))
    got = [lo.model(x).logits for x in (short, long)]
    lo.model.set_attn_implementation("sdpa")  # the same weights under transformers' own SDPA
    assert (got[0] - lo.model(short).logits).abs().max().item() <= 1e-4
    assert (got[1] - lo.model(long).logits).abs().max().item() > 1e-3

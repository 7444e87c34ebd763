"""ropescale.training.doc_mask: a document-masked packed forward of a tiny Qwen2 equals the pairs' separate forwards
(logits, per-pair loss, gradients; fp32, 1e-5) under SDPA, eager and the mask-free varlen SDPA; FlashAttention's varlen
arguments against transformers' own derivation; and one test per transformers internal relied on
(ropescale.common.compat, document masking)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ropescale.common import compat as shims
from ropescale.training.doc_mask import (
    VARLEN_SDPA,
    decoder_inputs,
    document_mask,
    segment_runs,
    use_varlen_sdpa,
    varlen_kwargs,
    varlen_sdpa_attention,
)
from ropescale.training.loss import head_loss_sum
from ropescale.training.positions import PAD_SEGMENT, Policy, sample_positions

ATOL = 1e-5
LENGTHS = (7, 12, 5)  # three pairs packed into one 24-token sample
VOCAB = 300


@pytest.fixture(scope="module")
def model(one_thread):
    from ropescale.tiny.build import random_model, tiny_config

    cfg = tiny_config(VOCAB, "qwen2", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=128, orig_ctx=64, eos_token_id=0)
    m = random_model(cfg, seed=0)  # fp32, eval, sdpa
    yield m
    m.set_attn_implementation("sdpa")


@pytest.fixture(scope="module")
def pairs():
    g = torch.Generator().manual_seed(0)
    out = []
    for n in LENGTHS:
        ids = torch.randint(1, VOCAB, (n,), generator=g)
        labels = ids.clone()
        labels[: n // 2] = -100  # a prompt without loss, a summary with it
        out.append((ids, labels))
    return out


def _packed(pairs):
    starts = [0]
    for ids, _ in pairs[:-1]:
        starts.append(starts[-1] + len(ids))
    return torch.cat([p[0] for p in pairs])[None], torch.cat([p[1] for p in pairs])[None], starts


def _loss(logits, labels):
    """Mean next-token CE over labelled targets (the causal-LM loss, computed here independently)."""
    return F.cross_entropy(logits[0, :-1].float(), labels[0, 1:], ignore_index=-100)


def _separate(model, pairs, offsets):
    """Each pair alone, its position ids starting at ``offsets[k]``: (logits, loss) per pair."""
    out = []
    for (ids, labels), off in zip(pairs, offsets):
        pos = torch.arange(len(ids))[None] + off
        logits = model(input_ids=ids[None], position_ids=pos, attention_mask=torch.ones_like(ids)[None]).logits
        out.append((logits, _loss(logits, labels[None])))
    return out


def _packed_forward(model, pairs, policy, attn):
    ids, labels, starts = _packed(pairs)
    pos, seg = sample_positions(policy, ids.shape[1], starts)
    kw = decoder_inputs(torch.from_numpy(pos), torch.from_numpy(seg).long(), attn=attn)
    return model(input_ids=ids, use_cache=False, **kw).logits, labels, starts


@pytest.mark.parametrize("attn", ["sdpa", "eager", VARLEN_SDPA])
@pytest.mark.parametrize("positions", ["reset", "continuous"])
def test_document_masked_pack_equals_separate_forwards(model, pairs, attn, positions):
    """reset: each pair as if alone from position 0; continuous: each pair alone given the same offset ids."""
    if attn == VARLEN_SDPA:
        use_varlen_sdpa(model)
    else:
        model.set_attn_implementation(attn)
    with torch.no_grad():
        logits, labels, starts = _packed_forward(model, pairs, Policy(positions, "document"), attn)
        model.set_attn_implementation("sdpa")  # the reference: plain SDPA, one pair at a time
        ref = _separate(model, pairs, [0] * len(pairs) if positions == "reset" else starts)
    for (ref_logits, ref_loss), a, (ids, lab) in zip(ref, starts, pairs):
        part = logits[:, a:a + len(ids)]
        torch.testing.assert_close(part, ref_logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(_loss(part, lab[None]), ref_loss, atol=ATOL, rtol=0)


def test_without_the_document_mask_later_pairs_differ(model, pairs):
    """The check can fail: plain causal attention over the pack lets pairs 2 and 3 see the earlier pairs."""
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        logits, _, starts = _packed_forward(model, pairs, Policy("continuous", "causal"), "sdpa")
        ref = _separate(model, pairs, starts)
    torch.testing.assert_close(logits[:, :LENGTHS[0]], ref[0][0], atol=ATOL, rtol=0)  # the first pair is alone anyway
    assert (logits[:, starts[1]:starts[1] + LENGTHS[1]] - ref[1][0]).abs().max() > 1e-3


def test_label_only_loss_and_gradients_under_checkpointing(model, pairs):
    """The label-only head (ropescale.training.loss) on the packed, document-masked sample: its CE sum is the sum of
    the pairs' separate CE sums, and so are the gradients, with gradient checkpointing recomputing the layers."""
    model.set_attn_implementation("sdpa")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        ids, labels, starts = _packed(pairs)
        pos, seg = sample_positions(Policy("reset", "document"), ids.shape[1], starts)
        kw = decoder_inputs(torch.from_numpy(pos), torch.from_numpy(seg).long(), attn="sdpa")
        hidden = model.model(input_ids=ids, **kw).last_hidden_state
        total, n = head_loss_sum(model.get_output_embeddings(), hidden, labels)
        got = torch.autograd.grad(total, params)
        ref_total, ref_n, ref_grads = 0.0, 0, [torch.zeros_like(p) for p in params]
        for p_ids, p_lab in pairs:
            h = model.model(input_ids=p_ids[None], attention_mask=torch.ones_like(p_ids)[None]).last_hidden_state
            s, k = head_loss_sum(model.get_output_embeddings(), h, p_lab[None])
            for acc, g in zip(ref_grads, torch.autograd.grad(s, params)):
                acc += g
            ref_total, ref_n = ref_total + s.detach(), ref_n + k
    finally:
        model.gradient_checkpointing_disable()
        model.eval()
    assert n == ref_n == sum(int((lab[1:] != -100).sum()) for _, lab in pairs)
    torch.testing.assert_close(total.detach(), ref_total, atol=ATOL, rtol=0)
    for g, r in zip(got, ref_grads):
        torch.testing.assert_close(g, r, atol=ATOL, rtol=0)


def test_padded_batch_of_two_samples(model, pairs):
    """Two rows (the pack, and pair 2 alone right-padded), document attention: every real token's logits are the
    separate forwards', under the 4D mask and the varlen SDPA alike."""
    ids, _, starts = _packed(pairs)
    t = ids.shape[1]
    pos0, seg0 = sample_positions(Policy("reset", "document"), t, starts)
    n1 = LENGTHS[1]
    row1 = torch.full((t,), 0)
    row1[:n1] = pairs[1][0]
    pos = torch.stack([torch.from_numpy(pos0), torch.cat([torch.arange(n1), torch.zeros(t - n1, dtype=torch.long)])])
    seg = torch.stack([torch.from_numpy(seg0).long(), torch.zeros(t, dtype=torch.long)])
    pad = torch.ones(2, t, dtype=torch.long)
    pad[1, n1:] = 0
    batch = torch.stack([ids[0], row1])
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        ref = _separate(model, pairs, [0, 0, 0])
        outs = [model(input_ids=batch, **decoder_inputs(pos, seg, attn="sdpa", padding_mask=pad)).logits]
        use_varlen_sdpa(model)
        outs.append(model(input_ids=batch, **decoder_inputs(pos, seg, attn=VARLEN_SDPA, padding_mask=pad)).logits)
        model.set_attn_implementation("sdpa")
    for logits in outs:
        assert torch.isfinite(logits).all()
        for (ref_logits, _), a, n in zip(ref, starts, LENGTHS):
            torch.testing.assert_close(logits[:1, a:a + n], ref_logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(logits[1:, :n1], ref[1][0], atol=ATOL, rtol=0)


def test_pose_positions_under_causal_attention_keep_one_segment(model):
    """PoSE ids skip; without a mask (and without a KV cache, as in training) transformers reads the skips as
    packed sequences, each chunk blind to the one before (the hazard the explicit 2D mask of decoder_inputs
    removes). With it, the forward equals one with a hand-built causal 4D mask."""
    t = 20
    pos = torch.from_numpy(sample_positions(Policy(pose_target=60), t, seed=0, index=3)[0])[None]
    assert shims.implied_blocks(pos) is not None  # the skip would start a new block
    ids = torch.randint(1, VOCAB, (1, t), generator=torch.Generator().manual_seed(1))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        hand = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
        ref = model(input_ids=ids, position_ids=pos, attention_mask=hand).logits
        model.set_attn_implementation("sdpa")
        got = model(input_ids=ids, use_cache=False, **decoder_inputs(pos, None, attn="sdpa")).logits
        # no mask and no cache (training): transformers' heuristic applies
        cut = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    assert (cut - ref).abs().max() > 1e-3


# ---------------------------------------------------------------- the pieces, by hand
def test_document_mask_by_hand():
    seg = torch.tensor([[0, 0, 1, PAD_SEGMENT]])
    want = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(document_mask(seg)[0, 0], want)
    add = document_mask(seg, dtype=torch.float32)[0, 0]
    assert torch.equal(add == 0, want) and (add[~want] == torch.finfo(torch.float32).min).all()


def test_varlen_kwargs_by_hand():
    seg = torch.tensor([[0, 0, 0, 1, 1, PAD_SEGMENT, PAD_SEGMENT], [0, 1, 1, 1, 2, 2, 2]])
    assert segment_runs(seg).tolist() == [3, 2, 2, 1, 3, 3]
    kw = varlen_kwargs(seg)
    assert kw["cu_seq_lens_q"].tolist() == [0, 3, 5, 7, 8, 11, 14] and kw["cu_seq_lens_q"].dtype == torch.int32
    assert kw["cu_seq_lens_k"] is kw["cu_seq_lens_q"] and kw["max_length_q"] == kw["max_length_k"] == 3
    empty = varlen_kwargs(torch.zeros(1, 0, dtype=torch.long))
    assert empty["cu_seq_lens_q"].tolist() == [0] and empty["max_length_q"] == 0


def test_varlen_kwargs_match_transformers_from_reset_positions():
    """transformers derives the same arguments from position ids that restart at 0 (its packed path, batch 1)."""
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    starts = [0, 5, 9, 17]
    pos, seg = sample_positions(Policy("reset", "document"), 20, starts)
    (cu_q, cu_k), (mq, mk) = prepare_fa_kwargs_from_position_ids(torch.from_numpy(pos)[None])
    kw = varlen_kwargs(torch.from_numpy(seg).long()[None])
    assert torch.equal(kw["cu_seq_lens_q"], cu_q) and torch.equal(kw["cu_seq_lens_k"], cu_k)
    assert kw["max_length_q"] == int(mq) == int(mk)


def test_decoder_inputs_per_attention():
    pos = torch.arange(6)[None]
    seg = torch.tensor([[0, 0, 1, 1, 1, 2]])
    sd = decoder_inputs(pos, seg, attn="sdpa")
    assert sd["attention_mask"].shape == (1, 1, 6, 6) and sd["attention_mask"].dtype == torch.bool
    assert decoder_inputs(pos, seg, attn="eager", dtype=torch.bfloat16)["attention_mask"].dtype == torch.bfloat16
    fa = decoder_inputs(pos, seg, attn="flash_attention_2")
    assert fa["attention_mask"] is None and fa["cu_seq_lens_q"].tolist() == [0, 2, 5, 6]
    causal = decoder_inputs(pos, None, attn="flash_attention_2")  # one segment per row
    assert causal["cu_seq_lens_q"].tolist() == [0, 6]
    plain = decoder_inputs(pos, None, attn="sdpa")
    assert plain["attention_mask"].tolist() == [[1] * 6]  # explicit: no packed-sequence heuristic
    with pytest.raises(ValueError, match="document masking supports"):
        decoder_inputs(pos, seg, attn="flex_attention")


def test_varlen_sdpa_without_varlen_arguments_is_plain_sdpa(model):
    attn = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 4, 5, 16, generator=g), torch.randn(1, 2, 5, 16, generator=g), torch.randn(1, 2, 5, 16,
                                                                                                     generator=g)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    ref, _ = sdpa_attention_forward(attn, q, k, v, None, scaling=0.25)
    got, _ = varlen_sdpa_attention(attn, q, k, v, None, scaling=0.25)
    torch.testing.assert_close(got, ref, atol=0, rtol=0)
    with pytest.raises(ValueError, match="ends at 4"):
        varlen_sdpa_attention(attn, q, k, v, None, cu_seq_lens_q=torch.tensor([0, 4], dtype=torch.int32))


# ---------------------------------------------------------------- one test per transformers internal relied on
def test_shim_custom_4d_mask_passes_through():
    assert shims.custom_mask_passes_through(), "transformers changed _preprocess_mask_arguments: a 4D mask is no " \
                                                "longer returned as is (see compat.custom_mask_passes_through)"


def test_shim_packed_sequence_heuristic():
    assert shims.implied_blocks(torch.arange(6)[None]) is None
    assert shims.implied_blocks(torch.tensor([[0, 1, 2, 7, 8, 9]])).tolist() == [[0, 0, 0, 1, 1, 1]]


def test_shim_flash_varlen_kwargs_and_mask_formats():
    assert shims.varlen_kwargs_accepted()
    assert [shims.mask_format(a) for a in ("sdpa", "eager", "flash_attention_2")] == ["bool", "additive", "varlen"]
    with pytest.raises(ValueError):
        shims.mask_format("flex_attention")

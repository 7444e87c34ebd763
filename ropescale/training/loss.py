"""The LM loss on labelled tokens only, with the LM head applied only where there is a label.

A 32K-token sample with a 150K vocabulary would need 32K x 150K fp32 logits (19 GB, twice with their gradient)
if the head ran everywhere; the summaries (the only positions with a label) are a few percent of a packed
sample. So: run the decoder (``causal_lm.model``) for the final hidden states, gather the positions whose
*shifted* label is not -100, apply the head there only, in chunks of ``chunk`` positions whose logits are
recomputed in backward (at most one chunk of logits is alive), and sum the cross-entropy.

Same value as the usual causal-LM loss (``mean over t with labels[t+1] != -100 of -log p(labels[t+1] | x<=t)``),
e.g. transformers' ``ForCausalLMLoss``.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ropescale.common.compat import is_zero3_param

from .model import causal_lm_of

IGNORE_INDEX = -100


def decoder_of(causal_lm):
    """The decoder stack that returns the final hidden states (``causal_lm.model`` for Llama/Qwen2/Mistral)."""
    dec = getattr(causal_lm, getattr(causal_lm, "base_model_prefix", "model"), None)
    if dec is None or dec is causal_lm:
        dec = causal_lm.get_decoder()
    return dec


def _head_ce(head, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(h).float(), t, reduction="sum")


def head_loss_sum(head, hidden: torch.Tensor, labels: torch.Tensor, chunk: int = 4096,
                  shifted: bool = False, zero3_chunks: bool = False) -> tuple[torch.Tensor, int]:
    """(sum of next-token CE over positions whose shifted label != -100, their count): the head sees only those
    positions. ``hidden``: (B, T, H) final hidden states; ``labels``: (B, T), the tokens (position t is scored on
    ``labels[t+1]``), or with ``shifted`` the targets themselves (position t on ``labels[t]``: a sequence-parallel
    shard, whose last target sits on the next rank). ``zero3_chunks``: chunk under ZeRO-3 too (one process: no
    other rank whose call count must match)."""
    tgt = labels if shifted else labels[:, 1:]
    mask = tgt != IGNORE_INDEX
    h = (hidden if shifted else hidden[:, :-1])[mask]  # (N, H)
    t = tgt[mask]
    n = int(t.numel())
    if n == 0:  # still run the head once (weight 0): every rank calls it the same number of times (ZeRO-3)
        return _head_ce(head, hidden[:, :1].reshape(-1, hidden.size(-1)), tgt[:, :1].reshape(-1).clamp(min=0)) * 0.0, 0
    zero3 = any(is_zero3_param(p) for p in head.parameters())
    if n <= chunk or not torch.is_grad_enabled() or (zero3 and not zero3_chunks):
        # under ZeRO-3 each head call gathers its weight collectively, so across processes the call count must not
        # depend on n
        return _head_ce(head, h, t), n
    total = None
    for s in range(0, n, chunk):
        part = checkpoint(_head_ce, head, h[s:s + chunk], t[s:s + chunk], use_reentrant=False)
        total = part if total is None else total + part
    return total, n


def decoder_kwargs(lm, input_ids, attention_mask=None, position_ids=None, segment_ids=None) -> dict:
    """The decoder's inputs beyond ``input_ids``: as given without explicit positions or segments; with them
    (``ropescale.training.data``: reset / PoSE position ids, document segments), ``doc_mask.decoder_inputs`` for the
    model's attention implementation (a block-diagonal mask for SDPA / eager, varlen arguments for FlashAttention,
    an explicit 2D mask under causal attention so transformers does not read PoSE's skips as packed sequences)."""
    if position_ids is None and segment_ids is None:
        return {"attention_mask": attention_mask}
    from .doc_mask import decoder_inputs

    if position_ids is None:
        position_ids = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
    return decoder_inputs(position_ids, segment_ids, attn=lm.config._attn_implementation, dtype=lm.dtype,
                          padding_mask=attention_mask)


def label_only_forward(self, input_ids=None, labels=None, attention_mask=None, position_ids=None, shift_labels=None,
                       max_position=None, segment_ids=None, **more):
    """forward() installed on the trained (PEFT) model: decoder -> gathered hidden states -> head -> CE sum.
    Returns {"loss_sum", "n_tokens"}. Runs inside the root module's call, so hooks on the root (DeepSpeed ZeRO-3
    parameter fetching) fire as for a normal forward. With ``shift_labels`` the batch is one rank's shard of a
    sequence-parallel batch (``sequence_parallel.shard_batch``): global positions, targets shifted before the
    split, pads only at the end (unseen under causal attention: no mask), RoPE lengths of the whole sample.
    ``position_ids`` / ``segment_ids`` of a positions policy: :func:`decoder_kwargs`."""
    lm = causal_lm_of(self)
    if shift_labels is None:
        out = decoder_of(lm)(input_ids=input_ids, use_cache=False,
                             **decoder_kwargs(lm, input_ids, attention_mask, position_ids, segment_ids))
    else:
        from .sequence_parallel import VARLEN_KEYS, global_rope_length

        varlen = {k: more[k] for k in VARLEN_KEYS if more.get(k) is not None}  # document attention's segments
        with global_rope_length(lm, max_position):
            out = decoder_of(lm)(input_ids=input_ids, position_ids=position_ids, use_cache=False, **varlen)
        labels = shift_labels
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    loss_sum, n = head_loss_sum(lm.get_output_embeddings(), hidden, labels, chunk=getattr(self, "_head_chunk", 4096),
                                shifted=shift_labels is not None,
                                zero3_chunks=getattr(self, "_head_chunk_zero3", False))
    return {"loss_sum": loss_sum, "n_tokens": torch.tensor(n, device=loss_sum.device)}


def install_label_only_forward(model, chunk: int = 4096, zero3_chunks: bool = False):
    """Make ``model(input_ids=, labels=, attention_mask=)`` return the label-only loss sum (see module doc).
    The model object stays what it is (a PeftModel stays a PeftModel for saving / loading). ``zero3_chunks``: the
    head in chunks under ZeRO-3 too (one process only; :func:`head_loss_sum`)."""
    model._head_chunk = int(chunk)
    model._head_chunk_zero3 = bool(zero3_chunks)
    model.forward = types.MethodType(label_only_forward, model)
    return model


def label_only_loss(model, input_ids, labels, attention_mask=None, chunk: int = 4096) -> torch.Tensor:
    """Mean label-only loss of a (PEFT-wrapped or plain) causal LM without installing anything."""
    lm = causal_lm_of(model)
    out = decoder_of(lm)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    s, n = head_loss_sum(lm.get_output_embeddings(), out.last_hidden_state, labels, chunk=chunk)
    return s / max(n, 1)

"""Document masking on the model side: from a batch's segment ids (``ropescale.training.positions``: segment k =
pair k of a packed sample, :data:`~ropescale.training.positions.PAD_SEGMENT` on padding) to what the decoder's
attention takes.

- SDPA / eager attention: a 4D mask (B, 1, T, T) that lets token q attend to token k when both are in the same
  segment and k <= q -- a block-diagonal causal mask (:func:`document_mask`); transformers passes a prepared 4D mask
  to every layer unchanged. Bool for SDPA (True = attend), additive for eager. It holds B x T x T elements (1 GiB of
  bool at T = 32K), so it suits samples up to some tens of thousands of tokens; beyond, FlashAttention's varlen path
  below needs no mask at all.
- FlashAttention-2: no mask; the varlen arguments ``cu_seq_lens_q/k`` (the cumulative lengths of the segments, over
  the B x T tokens flattened row after row) and ``max_length_q/k`` (the longest segment), derived the way
  transformers' ``prepare_fa_kwargs_from_position_ids`` derives them from position ids that restart at 0, but from
  the segment ids, so continuous positions and PoSE positions can be masked per document too (:func:`varlen_kwargs`).
  Pure torch: computed and tested on CPU; flash-attn is never imported here.
- SDPA without a mask (:data:`VARLEN_SDPA`, :func:`use_varlen_sdpa`): an attention function registered with
  transformers that takes the same varlen arguments and runs transformers' own SDPA causally inside each segment, so
  document masking costs no T x T mask. It is also what DeepSpeed's Ulysses sequence parallelism can run: its wrapper
  drops every 4D mask but passes the keyword arguments through to the core attention, which then sees the whole
  sequence and the sample-wide varlen arguments.
- :func:`decoder_inputs`: the keyword arguments for the decoder's forward (``position_ids`` and either
  ``attention_mask`` or the varlen arguments) for a batch under causal or document attention. Under causal attention
  it always passes an explicit 2D mask: without one, transformers reads position ids that skip (PoSE) as packed
  sequences and would cut each sample into chunks that cannot attend to each other.

Which transformers internals this relies on: ``ropescale.common.compat`` (document masking).
"""
from __future__ import annotations

import torch

from ropescale.common import compat

from ..common import compat as _compat_positions
from .positions import PAD_SEGMENT

VARLEN_SDPA = "ropescale_sdpa_varlen"  # the registered name of varlen_sdpa_attention


def mask_format(attn: str) -> str:
    """How attention ``attn`` takes a document mask: ``bool`` / ``additive`` (a 4D mask) or ``varlen`` (FlashAttention
    and :data:`VARLEN_SDPA`: the varlen arguments, no mask)."""
    return "varlen" if attn == VARLEN_SDPA else _compat_positions.mask_format(attn)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(0) if t.dim() == 1 else t


def document_mask(segment_ids: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The block-diagonal causal mask (B, 1, T, T) of ``segment_ids`` (B, T): q may attend to k iff
    ``segment_ids[q] == segment_ids[k]`` and k <= q (padding, one segment of its own, attends only to padding, so
    no row is empty). ``dtype`` None: bool (True = attend, for SDPA); a float dtype: additive (0 where allowed, the
    dtype's minimum elsewhere, for eager attention)."""
    seg = _rows(segment_ids)
    t = seg.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=seg.device).tril()
    allowed = (seg[:, :, None] == seg[:, None, :]) & causal
    allowed = allowed[:, None]
    if dtype is None:
        return allowed
    out = torch.zeros(allowed.shape, dtype=dtype, device=seg.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)


def segment_runs(segment_ids: torch.Tensor) -> torch.Tensor:
    """The lengths (int64) of the runs of equal segment ids, row after row over the flattened (B, T) tokens (a run
    never crosses a row: padding at the end of a row is a run of its own)."""
    seg = _rows(segment_ids)
    b, t = seg.shape
    if b * t == 0:
        return torch.zeros(0, dtype=torch.long, device=seg.device)
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    idx = torch.nonzero(starts.reshape(-1), as_tuple=False).view(-1)
    ends = torch.cat([idx[1:], idx.new_tensor([b * t])])
    return ends - idx


def varlen_kwargs(segment_ids: torch.Tensor) -> dict:
    """FlashAttention-2 varlen arguments of ``segment_ids`` (B, T): ``cu_seq_lens_q`` = ``cu_seq_lens_k`` (int32,
    0, then the cumulative run lengths of :func:`segment_runs`, ending at B x T) and ``max_length_q`` =
    ``max_length_k`` (the longest run, a Python int). Passed to the decoder with ``attention_mask=None``, transformers
    flattens the batch into B x T tokens and runs ``flash_attn_varlen_func`` causally inside each run."""
    runs = segment_runs(segment_ids)
    cu = torch.zeros(runs.numel() + 1, dtype=torch.int32, device=runs.device)
    cu[1:] = torch.cumsum(runs, 0).to(torch.int32)
    longest = int(runs.max()) if runs.numel() else 0
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def with_padding(segment_ids: torch.Tensor | None, padding_mask: torch.Tensor | None, like: torch.Tensor
                 ) -> torch.Tensor:
    """Segment ids (B, T) with :data:`PAD_SEGMENT` wherever ``padding_mask`` is 0; ``segment_ids`` None means one
    causal segment per row (all 0)."""
    seg = torch.zeros_like(_rows(like)) if segment_ids is None else _rows(segment_ids).clone()
    if padding_mask is not None:
        seg = seg.masked_fill(_rows(padding_mask) == 0, PAD_SEGMENT)
    return seg


def decoder_inputs(position_ids: torch.Tensor, segment_ids: torch.Tensor | None = None, *, attn: str,
                   dtype: torch.dtype = torch.float32, padding_mask: torch.Tensor | None = None) -> dict:
    """Keyword arguments for the decoder's forward: ``position_ids`` plus

    - causal attention (``segment_ids`` None): ``attention_mask`` = ``padding_mask`` or all ones (2D), under SDPA /
      eager; under FlashAttention the varlen arguments of one segment per row (padding its own);
    - document attention: :func:`document_mask` (bool for SDPA, additive in ``dtype`` for eager), or under
      FlashAttention :func:`varlen_kwargs` with ``attention_mask=None``.

    ``attn``: the model's attention implementation (sdpa, eager, flash_attention_2)."""
    pos = _rows(position_ids)
    fmt = mask_format(attn)
    if fmt == "varlen":
        return {"position_ids": pos, "attention_mask": None, **varlen_kwargs(with_padding(segment_ids, padding_mask,
                                                                                          pos))}
    if segment_ids is None:
        mask = torch.ones_like(pos) if padding_mask is None else _rows(padding_mask)
        return {"position_ids": pos, "attention_mask": mask}
    seg = with_padding(segment_ids, padding_mask, pos)
    return {"position_ids": pos, "attention_mask": document_mask(seg, dtype=None if fmt == "bool" else dtype)}


def varlen_sdpa_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                          dropout: float = 0.0, scaling: float | None = None, cu_seq_lens_q=None, cu_seq_lens_k=None,
                          max_length_q=None, max_length_k=None, **kwargs):
    """An attention function (transformers' signature: query/key/value (B, heads, T, D) -> ((B, T, heads, D), None))
    that runs transformers' SDPA causally inside each run of ``cu_seq_lens_q`` over the B x T tokens flattened row
    after row (:func:`varlen_kwargs`): block-diagonal causal attention without a mask. Without varlen arguments it is
    plain SDPA with ``attention_mask``."""
    sdpa = compat.sdpa_attention()
    kwargs.pop("is_causal", None)
    if cu_seq_lens_q is None:
        return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    b, h, t, _ = query.shape

    def flat(x):  # (B, heads, T, D) -> (1, heads, B*T, D)
        return x.transpose(0, 1).reshape(1, x.shape[1], b * t, x.shape[-1])

    q, k, v = flat(query), flat(key), flat(value)
    cu = [int(x) for x in cu_seq_lens_q.tolist()]
    if cu[-1] != b * t:
        raise ValueError(f"cu_seq_lens_q ends at {cu[-1]}, not at the batch's {b} x {t} tokens")
    outs = [sdpa(module, q[:, :, a:e], k[:, :, a:e], v[:, :, a:e], None, dropout=dropout, scaling=scaling,
                 is_causal=True, **kwargs)[0] for a, e in zip(cu[:-1], cu[1:])]
    return torch.cat(outs, dim=1).reshape(b, t, h, -1), None


def use_varlen_sdpa(model) -> str:
    """Register :func:`varlen_sdpa_attention` as :data:`VARLEN_SDPA` and make ``model`` (a transformers model) run
    it; from then on its decoder builds no mask and takes the varlen arguments of :func:`decoder_inputs`. Returns
    the name."""
    compat.register_attention(VARLEN_SDPA, varlen_sdpa_attention)
    model.set_attn_implementation(VARLEN_SDPA)
    return VARLEN_SDPA

"""Reliance on transformers internals for document masking and explicit position ids (written against transformers
5.24.0; to move into ``ropescale/common/compat.py``, the one home of such shims, with tests/test_doc_mask.py's shim
tests). What is relied on, and where it lives in transformers:

- ``masking_utils._preprocess_mask_arguments``: a 4D ``attention_mask`` tensor is "already prepared, or custom" and
  is returned as is, so the decoders of Llama / Qwen2 / Mistral (``create_causal_mask``) hand a block-diagonal mask
  built here to every layer unchanged: :func:`custom_mask_passes_through`.
- ``masking_utils.find_packed_sequence_indices``: with ``attention_mask=None`` and no cache, consecutive position ids
  whose step is not 1 start a new attention block (a packed-sequence heuristic). PoSE's skips would silently cut a
  sample into chunks that cannot attend to each other; an explicit 2D ``attention_mask`` (all ones) turns the
  heuristic off: :func:`implied_blocks` (what the heuristic would make of position ids).
- ``integrations.sdpa_attention.sdpa_attention_forward`` passes the mask to torch SDPA, where a bool mask means True =
  attend; eager attention (``eager_attention_forward`` of each model) adds the mask to the scores, so it takes an
  additive float mask: :func:`mask_format`.
- ``modeling_flash_attention_utils._flash_attention_forward`` takes the ``FlashAttentionKwargs`` ``cu_seq_lens_q``,
  ``cu_seq_lens_k``, ``max_length_q``, ``max_length_k`` (passed through the model's ``forward(**kwargs)`` to each
  attention layer); with ``attention_mask=None`` it flattens (B, T) into B*T tokens and calls
  ``flash_attn_varlen_func`` with them: :data:`VARLEN_KWARGS`, :func:`varlen_kwargs_accepted`.
"""
from __future__ import annotations

import inspect

# how each attention implementation takes a document mask (see module doc)
MASK_FORMATS = {"sdpa": "bool", "eager": "additive", "flash_attention_2": "varlen", "flash_attention_3": "varlen"}
VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def mask_format(attn_implementation: str) -> str:
    """``bool`` (SDPA: a 4D mask, True = attend), ``additive`` (eager: a 4D float mask, 0 or the dtype's minimum) or
    ``varlen`` (FlashAttention: :data:`VARLEN_KWARGS`, no mask); ValueError for another implementation."""
    try:
        return MASK_FORMATS[attn_implementation]
    except KeyError:
        raise ValueError(f"document masking supports attention {', '.join(MASK_FORMATS)}, not "
                         f"{attn_implementation!r}") from None


def custom_mask_passes_through() -> bool:
    """Whether transformers' mask preparation returns a 4D mask tensor unchanged (``_preprocess_mask_arguments``'
    early exit), the way a custom block-diagonal mask reaches the attention layers."""
    import torch
    from transformers import masking_utils

    mask = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    out = masking_utils._preprocess_mask_arguments(None, None, mask, None, None, None)
    return bool(out[0]) and out[1] is mask


def implied_blocks(position_ids):
    """What transformers' packed-sequence heuristic makes of ``position_ids`` (B, T) when no attention mask is given:
    a block index per token (a new block wherever the step is not 1), or None when every row is one block."""
    from transformers import masking_utils

    return masking_utils.find_packed_sequence_indices(position_ids)


def varlen_kwargs_accepted() -> bool:
    """Whether transformers' FlashAttention entry point takes :data:`VARLEN_KWARGS`."""
    from transformers import modeling_flash_attention_utils as fa

    params = inspect.signature(fa._flash_attention_forward).parameters
    return all(k in params for k in VARLEN_KWARGS)

"""Training-free attention-level context extension: Self-Extend and Dual Chunk Attention, over SDPA.

Both keep the model's RoPE frequencies and change which *positions* a query and a key are rotated to, per pair of
tokens: the attention of query i over keys j is split into passes, each with its own query / key positions and its
own set of keys, and the passes are merged by their log-sum-exp (one softmax over all keys, as FlashAttention's
split-KV merge and both authors' flash code do; each pass by blocks of query rows over the span of keys they see):

- ``self_extend`` (Jin et al. 2024, "LLM Maybe LongLM", arXiv 2401.01325, Eq. 3-4; datamllab/LongLM
  ``self_extend_patch/Llama.py``; llama.cpp ``--grp-attn-n G --grp-attn-w W``): neighbour pass for i - j < W with
  the true positions (i, j); grouped pass for i - j >= W with positions (i // G + W - W / G, j // G): relative
  distance i//G - j//G + W - W/G. W must be a multiple of G (llama.cpp's rule; the authors' float W/G is then exact).
- ``dca`` (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models", arXiv 2402.17463, Sec 3;
  HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``; vLLM ``DualChunkRotaryEmbedding``, Qwen2.5-1M's
  ``dual_chunk_attention_config``): chunk length s = chunk_size - local_size, keys at j mod s; intra-chunk pass
  (same chunk, j <= i) with query i mod s; successive-chunk pass (the chunk before) with query
  min(i mod s + s, chunk_size); inter-chunk pass (any earlier chunk) with query min(2s - 1, chunk_size).

How: q and k arrive rotated at their true positions (transformers' attention module applies RoPE before the
attention function); a rotation composes, so a pass rotates q by (p_q - i) and k by (p_k - j) (the angle difference in
float64), with the rotary module's current ``inv_freq`` (its attention factor stays in q and k). Key positions come
from the attention mask (the last query sees every real key before it: cumulative count), so left padding, a static
cache and a dynamic cache all work, in prefill and in each decode step. Installed at model load
(:func:`install`, from ``rope_scaling.load.load_model``) as a transformers attention implementation
(``AttentionInterface`` / ``AttentionMaskInterface``, the mask always materialised), so every forward uses it: the
probes', generation's (the slot decoder needs plain sdpa: the hf backend then runs transformers ``generate`` with a
cache, saying so in one line). torch and transformers are imported lazily.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ropescale.common.io import InputError

NAME = "ropescale_extend"  # the attention implementation registered with transformers
METHODS = ("none", "self_extend", "dca")


# ---------------------------------------------------------------- the settings each method needs (plain checks)
def check(method: str, group: int | None, window: int | None, chunk_size: int | None,
          local_size: int | None) -> None:
    """InputError when the attention-extension settings do not make a method (one line naming the flag)."""
    if method not in METHODS:
        raise InputError(f"unknown attention extension {method!r} (choose from {', '.join(METHODS)})")
    own = {"self_extend": (("--grp-attn-n", group), ("--grp-attn-w", window)),
           "dca": (("--dca-chunk-size", chunk_size), ("--dca-local-size", local_size))}
    for m, flags in own.items():
        for flag, v in flags:
            if v is not None and method != m:
                raise InputError(f"{flag} only applies to --attention-extend {m}, not {method}")
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InputError(f"{flag} must be a positive integer, got {v!r}")
    if method == "self_extend":
        if group is None or window is None:
            raise InputError("--attention-extend self_extend needs --grp-attn-n G (group size) and --grp-attn-w W "
                             "(neighbour window), as llama.cpp names them")
        if window % group:
            raise InputError(f"--grp-attn-w {window} must be a multiple of --grp-attn-n {group} (llama.cpp's rule)")
    if method == "dca" and chunk_size is not None and local_size is not None and local_size >= chunk_size:
        raise InputError(f"--dca-local-size {local_size} must be below --dca-chunk-size {chunk_size}")


def dca_sizes(chunk_size: int | None, local_size: int | None, orig_ctx: int) -> tuple[int, int]:
    """DCA's (chunk_size, local_size), defaults from the original context L as the authors' code sets them
    (``replace_with_chunkllama``: chunk_size = 3L/4, local_size = L/8)."""
    c = chunk_size if chunk_size is not None else orig_ctx * 3 // 4
    w = local_size if local_size is not None else orig_ctx // 8
    if not 1 <= w < c:
        raise InputError(f"DCA needs 1 <= local size ({w}) < chunk size ({c})")
    return c, w


# ---------------------------------------------------------------- the passes: (query positions, key positions, keys)
@dataclass(frozen=True)
class Rule:
    """One method with its settings: ``passes(i, j)`` for query positions i (b, q, 1) and key positions j (b, 1, kv)
    (int64 tensors, j < 0 for a padded key) -> [(q_pos (b, q, 1) float64, k_pos (b, 1, kv) float64, keys (b, q, kv)
    bool)], the key sets disjoint and covering the causal keys j <= i."""

    method: str
    params: dict
    passes: Callable


def self_extend_passes(group: int, window: int):
    """Self-Extend's two passes -- Jin et al. 2024 (arXiv 2401.01325) Eq. 3-4, datamllab/LongLM
    ``self_extend_forward``: neighbour (i - j < W: positions i, j), grouped (i - j >= W: i//G + W - W/G, j//G)."""
    def passes(i, j):
        d, real = i - j, j >= 0
        near = real & (d >= 0) & (d < window)
        far = real & (d >= window)
        shift = window - window // group
        return [(i.double(), j.double(), near), ((i // group + shift).double(), (j // group).double(), far)]
    return passes


def dca_passes(chunk_size: int, local_size: int):
    """DCA's three passes -- An et al. 2024 (arXiv 2402.17463) Sec 3, HKUNLP/ChunkLlama and vLLM's
    ``DualChunkRotaryEmbedding``: s = chunk_size - local_size, keys at j mod s; intra (same chunk) query i mod s,
    successive (previous chunk) min(i mod s + s, chunk_size), inter (earlier chunks) min(2s - 1, chunk_size)."""
    s = chunk_size - local_size

    def passes(i, j):
        ci, cj, real = i // s, j // s, j >= 0
        kp = (j % s).double()
        qi = (i % s).double()
        intra = real & (cj == ci) & (j <= i)
        succ = real & (cj == ci - 1)
        inter = real & (cj <= ci - 2)
        q_succ = (i % s + s).clamp(max=chunk_size).double()
        q_inter = (i * 0 + min(2 * s - 1, chunk_size)).double()
        return [(qi, kp, intra), (q_succ, kp, succ), (q_inter, kp, inter)]
    return passes


def rule_of(method: str, *, group=None, window=None, chunk_size=None, local_size=None, orig_ctx=None) -> Rule | None:
    """The :class:`Rule` of a method's settings (None for none); DCA's sizes default from ``orig_ctx``."""
    check(method, group, window, chunk_size, local_size)
    if method == "self_extend":
        return Rule(method, {"group": group, "window": window}, self_extend_passes(group, window))
    if method == "dca":
        c, w = dca_sizes(chunk_size, local_size, int(orig_ctx or 0) or (chunk_size or 0) * 4 // 3)
        return Rule(method, {"chunk_size": c, "local_size": w}, dca_passes(c, w))
    return None


def spec_rule(spec, orig_ctx: int) -> Rule | None:
    """The :class:`Rule` of a RoPE spec's attention fields (``attention_extend``, ``grp_attn_n`` / ``grp_attn_w``,
    ``dca_chunk_size`` / ``dca_local_size``; DCA's sizes default from ``orig_ctx``); None without a method."""
    return rule_of(spec.attention_extend, group=spec.grp_attn_n, window=spec.grp_attn_w,
                   chunk_size=spec.dca_chunk_size, local_size=spec.dca_local_size, orig_ctx=orig_ctx)


def max_context(rule: Rule, orig_ctx: int) -> float:
    """The longest context whose largest relative position (p_q - p_k over the passes) stays below ``orig_ctx``
    (the context the frequencies serve: the original one for plain RoPE), inf when none exceeds it. Self-Extend:
    its largest relative position at length T >= W is (T - 1) // G + W - W / G, below L up to (L - W) * G + W (Jin et
    al. 2024, Sec 3.2; llama.cpp's --grp-attn rule), and T - 1 (the neighbour window) when W >= L. DCA: at length T
    it is min(T - 1, 2s - 1, C) (s = C - L_local; the successive pass's min(i mod s + s, C) at the chunk's first
    key), so unbounded when min(2s - 1, C) < L, else L (An et al. 2024, Sec 3)."""
    if rule.method == "self_extend":
        g, w = rule.params["group"], rule.params["window"]
        return max(orig_ctx, (orig_ctx - w) * g + w)
    c = rule.params["chunk_size"]
    s = c - rule.params["local_size"]
    return math.inf if min(2 * s - 1, c) < orig_ctx else orig_ctx


# ---------------------------------------------------------------- the attention function
def rotate(x, delta, inv_freq):
    """``x`` (b, h, n, d) rotated further by angle ``delta`` (b, n) x inv_freq on its first 2 * len(inv_freq)
    channels, in transformers' rotate_half layout (Llama / Qwen / Mistral / Gemma) -- RoFormer Eq. 34."""
    import torch

    r = inv_freq.shape[0] * 2
    ang = delta[:, None, :, None] * inv_freq.double()[None, None, None, :]
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    xr = x if r == x.shape[-1] else x[..., :r]
    out = xr * cos + torch.cat([-xr[..., r // 2:], xr[..., :r // 2]], -1) * sin
    return out if r == x.shape[-1] else torch.cat([out, x[..., r:]], -1)


def attention_with_lse(q, k, v, keys, scale: float):
    """(softmax(q k^T * scale over ``keys``) v, log-sum-exp) for q (b, h, n, d), keys (b, 1|h, n, m) bool; rows with
    no key give output 0 and lse -inf. SDPA's fused kernel where torch returns the log-sum-exp (its CPU flash kernel,
    ``aten._scaled_dot_product_flash_attention_for_cpu``, torch 2.1+; CUDA: the memory-efficient kernel, once it has
    matched the written-out math on a small case), else :func:`attention_with_lse_math`."""
    import torch

    bias = torch.zeros(keys.shape, dtype=q.dtype, device=q.device).masked_fill(~keys, float("-inf"))
    bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    try:
        if q.device.type == "cpu":
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False,
                                                                                  attn_mask=bias, scale=scale)
        elif q.device.type == "cuda" and _cuda_kernel_agrees(q.device, q.dtype):
            out, lse = _cuda_efficient(q, k, v, bias, scale)
        else:
            return attention_with_lse_math(q, k, v, keys, scale)
    except (RuntimeError, AttributeError, TypeError):  # a kernel this build lacks, or one that refuses the shapes
        return attention_with_lse_math(q, k, v, keys, scale)
    some = keys.any(-1).expand(lse.shape)
    return out.nan_to_num(0.0).masked_fill(~some[..., None], 0.0), lse.float().masked_fill(~some, float("-inf"))


def _cuda_efficient(q, k, v, bias, scale: float):
    """(output, log-sum-exp) from CUDA's memory-efficient SDPA kernel (its lse padded to a multiple of 32 rows in
    some releases: cut to the queries)."""
    import torch

    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias.contiguous(), True, 0.0, False,
                                                                      scale=scale)[:2]
    return out, lse[..., :q.shape[2]]


_CUDA_CHECKED: dict = {}  # (device, dtype) -> whether the fused kernel matched the written-out math once


def _cuda_kernel_agrees(device, dtype) -> bool:
    """Whether CUDA's fused kernel gives :func:`attention_with_lse_math`'s output and log-sum-exp on a small random
    case with an empty row (checked once per device and dtype; a kernel that fails or disagrees is not used)."""
    import torch

    key = (str(device), dtype)
    if key not in _CUDA_CHECKED:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v = (torch.randn(1, 2, n, 64, generator=g).to(device, dtype) for n in (40, 72, 72))
        keys = (torch.rand(1, 1, 40, 72, generator=g) > 0.5).to(device)
        keys[..., 3, :] = False
        bias = torch.zeros(keys.shape, dtype=dtype, device=device).masked_fill(~keys, float("-inf"))
        bias = bias.expand(1, 2, 40, 72)
        try:
            out, lse = _cuda_efficient(q, k, v, bias, 0.125)
            o2, l2 = attention_with_lse_math(q, k, v, keys, 0.125)
            fin = torch.isfinite(l2)
            tol = 1e-3 if dtype == torch.float32 else 3e-2
            ok = bool((out.nan_to_num()[fin] - o2[fin]).abs().max() <= tol and (lse.float()[fin] - l2[fin]).abs().max()
                      <= tol)
        except (RuntimeError, TypeError):
            ok = False
        _CUDA_CHECKED[key] = ok
    return _CUDA_CHECKED[key]


BLOCK = 2048  # query rows a block: each block attends to the span of keys its rows see in the pass


def blocked(q, k, v, keys, scale: float):
    """:func:`attention_with_lse` by blocks of :data:`BLOCK` query rows, each over the span of keys [first, last]
    that its rows see in this pass (the same numbers: a key outside the span is masked for every row of the block),
    so a pass skips what its key set leaves out (the causal upper triangle, Self-Extend's band, DCA's chunks)."""
    import torch

    outs, lses = [], []
    for s in range(0, q.shape[2], BLOCK):
        ks = keys[:, :, s:s + BLOCK]
        cols = ks.any(0).any(0).any(0).nonzero()
        if not len(cols):  # no key for any row of the block: output 0, log-sum-exp -inf
            n = ks.shape[2]
            outs.append(q.new_zeros(q.shape[0], q.shape[1], n, v.shape[-1]))
            lses.append(torch.full((q.shape[0], q.shape[1], n), float("-inf"), device=q.device))
            continue
        lo, hi = int(cols[0]), int(cols[-1]) + 1
        o, lse = attention_with_lse(q[:, :, s:s + BLOCK], k[:, :, lo:hi], v[:, :, lo:hi], ks[..., lo:hi], scale)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, 2), torch.cat(lses, 2)


def attention_with_lse_math(q, k, v, keys, scale: float):
    """:func:`attention_with_lse` written out (SDPA's math): queries in blocks of 1024 rows, so memory stays
    O(1024 x m) a head."""
    import torch

    outs, lses = [], []
    for s in range(0, q.shape[2], 1024):
        qs, ks = q[:, :, s:s + 1024], keys[:, :, s:s + 1024]
        logits = torch.matmul(qs, k.transpose(-1, -2)).float() * scale
        logits = logits.masked_fill(~ks, float("-inf"))
        lse = torch.logsumexp(logits, -1)
        p = torch.exp(logits - lse.clamp(min=-1e30)[..., None]).nan_to_num(0.0)
        outs.append(torch.matmul(p.to(v.dtype), v))
        lses.append(lse)
    return torch.cat(outs, 2), torch.cat(lses, 2)


def merge(parts):
    """Passes (out_p, lse_p) merged into one softmax over all their keys: sum_p exp(lse_p - lse) out_p."""
    import torch

    lse = torch.logsumexp(torch.stack([p[1] for p in parts]), 0)
    out = 0
    for o, s in parts:
        out = out + torch.exp(s - lse.clamp(min=-1e30)).nan_to_num(0.0)[..., None].to(o.dtype) * o
    return out


def positions(query, key, mask, position_ids):
    """(query positions (b, q), key positions (b, kv), the mask as bool (b, 1|h, q, kv) or None): the keys' positions
    are their count among the keys the last query sees, minus one (that query sees every real key before it), -1 for
    the others; without a mask, 0..kv-1."""
    import torch

    b, q_len, kv_len = query.shape[0], query.shape[2], key.shape[2]
    if mask is not None and mask.dtype != torch.bool:
        mask = mask > torch.finfo(mask.dtype).min / 2  # an additive mask: 0 where attended, min / -inf elsewhere
    if mask is not None:
        seen = mask[:, 0, -1, :kv_len].expand(b, kv_len)
        kpos = torch.where(seen, seen.long().cumsum(-1) - 1, torch.full_like(seen, -1, dtype=torch.long))
    else:
        kpos = torch.arange(kv_len, device=key.device).expand(b, kv_len)
    if position_ids is not None:
        qpos = position_ids.to(key.device).long().expand(b, q_len)
    else:
        qpos = torch.arange(kv_len - q_len, kv_len, device=key.device).expand(b, q_len)
    return qpos, kpos, mask


def extended_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature (``AttentionInterface``): the passes of the module's rule, each
    with its re-rotated q / k, merged by log-sum-exp; returns (output (b, q, h, d), None)."""
    import torch

    st = getattr(module, "_ropescale_extend", None)
    if st is None:  # a layer the rule leaves alone (sliding-window layers): transformers' own SDPA
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    rep = query.shape[1] // key.shape[1]  # grouped-query attention: every query head sees its key head
    if rep > 1:
        value = value.repeat_interleave(rep, 1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    qpos, kpos, mask = positions(query, key, attention_mask, kwargs.get("position_ids"))
    inv = st.inv_freq().to(query.device)
    parts, rotated = [], {}

    def moved(x, which, delta):
        """``x`` rotated by ``delta`` (skipped when it is 0 everywhere; the same shift twice rotated once)."""
        for (w, d), y in rotated.items():
            if w == which and d.shape == delta.shape and torch.equal(d, delta):
                return y
        y = x if not bool(delta.any()) else rotate(x, delta, inv)  # keys rotated on their own heads, then repeated
        y = y.repeat_interleave(rep, 1) if which == "k" and rep > 1 else y
        rotated[(which, delta)] = y
        return y

    for pq, pk, keys in st.rule.passes(qpos[:, :, None], kpos[:, None, :]):
        keys = keys[:, None]
        if mask is not None:
            keys = keys & mask[..., :key.shape[2]]
        if not bool(keys.any()):
            continue
        dq = (pq - qpos[:, :, None].double()).expand(-1, -1, 1)[..., 0]  # (b, q): one shift per query
        dk = (pk - kpos[:, None, :].double()).expand(-1, 1, -1)[:, 0]  # (b, kv): one shift per key
        parts.append(blocked(moved(query, "q", dq), moved(key, "k", dk), value, keys, scale))
    if not parts:
        out = torch.zeros_like(query)
    else:
        out = merge(parts)
    return out.transpose(1, 2).contiguous(), None


@dataclass
class LayerState:
    """What a layer's attention function reads: the rule, and where its rotary frequencies live now."""

    rule: Rule
    inv_freq: Callable


def register() -> str:
    """Register :func:`extended_attention` (and an always-materialised boolean mask) with transformers as
    :data:`NAME`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def mask(*args, **kwargs):
        kwargs["allow_is_causal_skip"] = False
        return sdpa_mask(*args, **kwargs)

    AttentionInterface.register(NAME, extended_attention)
    AttentionMaskInterface.register(NAME, mask)
    return NAME


def install(model, rule: Rule, inv_freq_of: Callable[[int], Callable | None]) -> int:
    """Run ``model``'s attention under ``rule`` in every forward: each attention module (a ``layer_idx``) gets its
    :class:`LayerState` (``inv_freq_of(layer_idx)``: a callable returning that layer's current inv_freq; None: the
    layer keeps plain SDPA, e.g. a sliding-window layer, whose window never reaches past the original context) and
    the model the :data:`NAME` attention implementation. Refused (InputError) for attention logit soft-capping
    (Gemma 2), which the merge would not apply. Returns the number of attention modules under the rule."""
    cfg = model.config
    if getattr(cfg, "attn_logit_softcapping", None) or getattr(getattr(cfg, "text_config", None),
                                                               "attn_logit_softcapping", None):
        raise InputError(f"--attention-extend {rule.method}: attention logit soft-capping is not supported")
    n = 0
    for m in model.modules():
        if hasattr(m, "layer_idx") and hasattr(m, "q_proj"):
            inv = inv_freq_of(int(m.layer_idx))
            m._ropescale_extend = None if inv is None else LayerState(rule, inv)
            n += inv is not None
    if not n:
        raise InputError(f"--attention-extend {rule.method}: no attention modules found in {type(model).__name__}")
    register()
    model.set_attn_implementation(NAME)
    return n

"""A decoder layer recomputed by sequence chunks (ALST's tiled compute, Bekman et al. 2025, carried to attention):
``--tile-attention N``.

A checkpointed decoder layer stores its input and is recomputed whole in backward, so one layer's recompute holds
its activations for the whole sequence: ~46 x hidden bytes a token for the 7B shape (q, k, v, the attention output,
the norms, LoRA dropout's copies, the backward's gradients), 184 GiB at 1M tokens, more than an H200. Here the layer
is one autograd function (:class:`TiledLayer`) that stores only its input (the checkpoint: offloaded to the host or
derived from a block's input as any other, :mod:`.offload`) and works by chunks of N tokens:

- forward (no graph): the keys and values of the whole sequence, chunk by chunk (norm, k / v projections, RoPE),
  then for each query chunk its queries, attention over the keys up to its end (SDPA with a lower-right causal
  mask: the chunk's query i sees keys 0 .. start + i; an O(N) kernel on CUDA), the output projection, the residual,
  the MLP over the chunk and the second residual;
- backward: the keys and values again (no graph), then each query chunk recomputed with a graph and run backward
  at once: the input gradient of its rows, the trained weights' gradients (summed in fp32) and its share of the
  keys' and values' gradients (accumulated in fp32 over the chunks); last, each chunk's key / value projections
  recomputed with a graph and run backward with those gradients, adding to the input gradient.

What lives for the whole sequence: the keys and values (2 x kv x b bytes a token), their fp32 gradients (2 x kv x
4), the incoming and outgoing residual gradients (2 x hidden x b); everything else is one chunk's. The price: the
key / value projections run once more (three times a step, the rest of the layer twice as with checkpointing).
Each chunk replays the forward's RNG (LoRA dropout's masks) and autocast state, so the recomputed chunks are the
forward's. Used where the layer is a Llama / Qwen2 / Mistral decoder layer on causal attention without a padding
or document mask, sliding window or attention dropout, and not under sequence parallelism; any other call runs
torch's checkpoint of the plain layer (counted in :data:`STATS`).
"""
from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F

from ropescale.common import compat
from ropescale.common.io import InputError

from .tiled_mlp import autocast_state, checkpointed_layers, innermost_layers, replay_context

STATS = {"tiled": 0, "plain": 0}  # calls run tiled / handed to the plain checkpoint (why: STATS["why"])
PLAIN_KERNELS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")  # the attention a layer may replace


def _rng(x: torch.Tensor):
    return torch.get_rng_state(), torch.cuda.get_rng_state(x.device) if x.is_cuda else None


class LayerParts:
    """One decoder layer's pieces and a call's RoPE tables: what :class:`TiledLayer` computes with."""

    def __init__(self, layer, cos: torch.Tensor, sin: torch.Tensor, chunk: int):
        a = layer.self_attn
        self.layer, self.attn, self.chunk = layer, a, int(chunk)
        self.cos, self.sin = cos, sin
        self.d = int(a.head_dim)
        self.scale = float(a.scaling)
        mod = sys.modules[type(a).__module__]
        self.rotate_half = getattr(mod, "rotate_half", None)
        self.apply_rope = getattr(mod, "apply_rotary_pos_emb", None)

    def rope(self, x: torch.Tensor, s: int, e: int) -> torch.Tensor:
        """RoPE of (B, heads, rows, d) at positions s..e of the call (the model's own rotate_half)."""
        cos, sin = self.cos[..., s:e, :].unsqueeze(1), self.sin[..., s:e, :].unsqueeze(1)
        if self.rotate_half is not None:
            return (x * cos + self.rotate_half(x) * sin).to(x.dtype)
        return self.apply_rope(x, x, self.cos[..., s:e, :], self.sin[..., s:e, :])[0]

    def heads(self, y: torch.Tensor) -> torch.Tensor:
        return y.view(*y.shape[:-1], -1, self.d).transpose(1, 2)

    def keys_values(self, xc: torch.Tensor, s: int):
        """(k after RoPE, v) of rows s.. of the call, (B, kv heads, rows, d)."""
        h = self.layer.input_layernorm(xc)
        k = self.rope(self.heads(self.attn.k_proj(h)), s, s + xc.shape[1])
        return k, self.heads(self.attn.v_proj(h))

    def chunk_out(self, xc: torch.Tensor, s: int, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The layer's output for rows s..s+C (queries over keys 0..s+C, both residuals and the MLP)."""
        c = xc.shape[1]
        q = self.rope(self.heads(self.attn.q_proj(self.layer.input_layernorm(xc))), s, s + c)
        e = s + c
        kw = {}
        if k.shape[1] != q.shape[1]:  # GQA: SDPA's own on CPU; on CUDA the lower-right mask's kernel call (torch's
            # CausalBias) takes no GQA, so the chunk's keys and values are repeated per query head
            if q.is_cuda:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            else:
                kw = {"enable_gqa": True}
        if s == 0:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, **kw)
        else:
            from torch.nn.attention.bias import causal_lower_right

            o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(c, e), scale=self.scale, **kw)
        y = xc + self.attn.o_proj(o.transpose(1, 2).reshape(*xc.shape[:-1], -1))
        return y + self.layer.mlp(self.layer.post_attention_layernorm(y))

    def starts(self, rows: int) -> list[int]:
        return list(range(0, rows, self.chunk))


class TiledLayer(torch.autograd.Function):
    """The layer over query chunks (module doc). Inputs: the parts, x (B, T, hidden), the trained parameters
    (their gradients returned, summed over the chunks) or, under ZeRO-3, ``zero3`` (each chunk's backward
    accumulates into them, DeepSpeed reduces after the last: ``ds_grad_is_ready``)."""

    @staticmethod
    def forward(ctx, parts: LayerParts, zero3, x, *params):
        ctx.parts, ctx.zero3, ctx.params = parts, zero3, params
        ctx.autocast = autocast_state(x.device.type)
        ctx.save_for_backward(x)
        starts = parts.starts(x.shape[1])
        ctx.kv_rng, ctx.q_rng = [], []
        k, v = _all_keys_values(parts, x, starts, ctx.kv_rng)
        out = torch.empty_like(x)
        for s in starts:
            ctx.q_rng.append(_rng(x))
            e = min(s + parts.chunk, x.shape[1])
            out[:, s:e] = parts.chunk_out(x[:, s:e], s, k[:, :, :e], v[:, :, :e])
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        parts, zero3, params = ctx.parts, ctx.zero3, ctx.params
        x = x.detach()
        T, chunk = x.shape[1], parts.chunk
        starts = parts.starts(T)
        need_x = ctx.needs_input_grad[2]
        dev = x.device
        with torch.no_grad():  # the keys and values again, with the forward's RNG
            k, v = _all_keys_values(parts, x, starts, ctx.kv_rng, ctx.autocast)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=dev)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=dev)
        x_grad = torch.zeros_like(x) if need_x else None
        run = _Pieces(parts, zero3, params, 2 * len(starts))

        with torch.enable_grad():
            for i, s in enumerate(starts):
                e = min(s + chunk, T)
                xc = x[:, s:e].detach().requires_grad_(need_x)
                kc = k[:, :, :e].detach().requires_grad_()
                vc = v[:, :, :e].detach().requires_grad_()
                with replay_context(ctx.autocast, ctx.q_rng[i], dev):
                    out = parts.chunk_out(xc, s, kc, vc)
                got = _grads(run, out, grad_out[:, s:e], xc if need_x else None, kc, vc)
                gx, gk, gv = got
                if need_x and gx is not None:
                    x_grad[:, s:e] += gx
                dk[:, :, :e] += gk
                dv[:, :, :e] += gv
                del out, got, gx, gk, gv, kc, vc
            del k, v
            for i, s in enumerate(starts):
                e = min(s + chunk, T)
                xc = x[:, s:e].detach().requires_grad_(need_x)
                with replay_context(ctx.autocast, ctx.kv_rng[i], dev):
                    kc, vc = parts.keys_values(xc, s)
                g = (dk[:, :, s:e].to(kc.dtype), dv[:, :, s:e].to(vc.dtype))
                got = _grads(run, (kc, vc), g, xc if need_x else None, None, None)
                if need_x and got[0] is not None:
                    x_grad[:, s:e] += got[0]
        p_out = [None if gp is None else gp.to(p.dtype) for gp, p in zip(run.p_grads, params)]
        return (None, None, x_grad, *p_out)


class _Pieces:
    """The backward of :class:`TiledLayer`'s pieces (each query chunk, then each chunk's keys / values), one call
    each: the gradients of its inputs; the trained parameters' summed over the pieces in fp32 or, under ZeRO-3,
    accumulated into them and reduced after each one's last piece (:func:`_zero3_sides`)."""

    def __init__(self, parts: LayerParts, zero3, params, n: int):
        self.zero3, self.params, self.n, self.step = zero3, params, n, 0
        self.sides = _zero3_sides(parts, zero3) if zero3 else None
        self.p_grads: list[torch.Tensor | None] = [None] * len(params)

    def __call__(self, outputs, inputs, grads):
        self.step += 1
        if self.zero3:
            q_side, kv_side = self.sides
            if self.step <= self.n // 2:  # a query chunk's piece
                compat.defer_zero3_reduce(q_side, ready=self.step == self.n // 2)
                compat.defer_zero3_reduce(kv_side, ready=False)
            else:  # a key / value piece
                compat.defer_zero3_reduce(kv_side, ready=self.step == self.n)
            torch.autograd.backward(outputs, grads)
            return [t.grad for t in inputs]
        got = torch.autograd.grad(outputs, list(inputs) + list(self.params), grads, allow_unused=True)
        for j, gp in enumerate(got[len(inputs):]):
            if gp is not None:
                gp = gp.float()
                self.p_grads[j] = gp if self.p_grads[j] is None else self.p_grads[j].add_(gp)
        return got[:len(inputs)]


def _zero3_sides(parts: LayerParts, zero3: list) -> tuple[list, list]:
    """ZeRO-3 reduces a parameter once, after its last piece: (the parameters the query pieces alone use, reduced
    after the last query chunk; the key / value side's, the norm's included, reduced after the last key / value
    piece)."""
    kv_ids = {id(p) for m in (parts.layer.input_layernorm, parts.attn.k_proj, parts.attn.v_proj)
              for p in m.parameters()}
    return [p for p in zero3 if id(p) not in kv_ids], [p for p in zero3 if id(p) in kv_ids]


def _all_keys_values(parts: LayerParts, x: torch.Tensor, starts: list[int], rngs: list, autocast=None):
    """The keys (after RoPE) and values of the whole sequence, chunk by chunk: each chunk's RNG state recorded into
    ``rngs`` (the forward), or replayed from it with the forward's ``autocast`` state (the backward)."""
    ks, vs = [], []
    for i, s in enumerate(starts):
        if autocast is None:
            rngs.append(_rng(x))
            k, v = parts.keys_values(x[:, s:s + parts.chunk], s)
        else:
            with replay_context(autocast, rngs[i], x.device):
                k, v = parts.keys_values(x[:, s:s + parts.chunk], s)
        ks.append(k)
        vs.append(v)
    return torch.cat(ks, 2), torch.cat(vs, 2)


def _grads(run, outputs, grads, xc, kc, vc):
    """(grad of xc, of kc, of vc) of one piece's backward, None for those not asked."""
    want = [t for t in (xc, kc, vc) if t is not None]
    outs = list(outputs) if isinstance(outputs, tuple) else [outputs]
    gs = list(grads) if isinstance(grads, tuple) else [grads]
    got = iter(run(outs, want, gs))
    return tuple(next(got) if t is not None else None for t in (xc, kc, vc))


def why_plain(layer, x, kwargs: dict) -> str | None:
    """Why this call cannot run tiled (None: it can)."""
    a = getattr(layer, "self_attn", None)
    need = ("input_layernorm", "post_attention_layernorm", "mlp")
    if a is None or not all(hasattr(layer, n) for n in need) or not all(
            hasattr(a, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")):
        return f"{type(layer).__name__} is not a Llama-style decoder layer"
    impl = getattr(getattr(a, "config", None), "_attn_implementation", None)
    if impl not in PLAIN_KERNELS:
        return f"attention implementation {impl!r} (sequence parallel?)"
    if kwargs.get("attention_mask") is not None:
        return "an attention mask (padding or documents)"
    if kwargs.get("position_embeddings") is None:
        return "no position_embeddings passed"
    if getattr(a, "sliding_window", None):
        return "a sliding window"
    if a.training and float(getattr(a, "attention_dropout", 0.0) or 0.0) > 0:
        return "attention dropout"
    if not torch.is_tensor(x) or x.dim() != 3:
        return "hidden states not (batch, tokens, hidden)"
    return None


class TiledCall:
    """The layer's forward as ``function(x, *rest)`` that runs :class:`TiledLayer` (what the checkpoint function
    and a block's recompute call: under no_grad it is the chunked forward alone)."""

    def __init__(self, layer, function, chunk: int):
        self.layer, self.function, self.chunk = layer, function, int(chunk)
        self.kwargs = dict(getattr(function, "keywords", None) or {})

    def __call__(self, x, *rest, **kwargs):
        kw = self.kwargs | kwargs
        cos, sin = kw["position_embeddings"]
        parts = LayerParts(self.layer, cos, sin, self.chunk)
        if not torch.is_grad_enabled():
            return TiledLayer.forward(_NoCtx(), parts, None, x)
        trained = [p for p in self.layer.parameters() if p.requires_grad]
        zero3 = [p for p in trained if compat.is_zero3_param(p)]
        if zero3:
            return TiledLayer.apply(parts, zero3, x)
        return TiledLayer.apply(parts, None, x, *trained)


class _NoCtx:
    """A stand-in ctx for the forward run without autograd (a block's no-grad recompute)."""

    def save_for_backward(self, *a):
        pass


def tiled_checkpoint(layer, chunk: int, base=None):
    """A ``_gradient_checkpointing_func`` for ``layer``: ``fn(function, x, *rest)`` runs the layer tiled (module
    doc) where it can, through ``base(TiledCall, x, *rest)`` (an offloader's checkpoint function built with a
    direct call as its base: the input stored where the plan says); elsewhere torch's non-reentrant checkpoint of
    the plain layer (or ``base`` with it)."""
    from torch.utils.checkpoint import checkpoint

    plain = base or functools.partial(checkpoint, use_reentrant=False)

    def fn(function, *args, **kwargs):
        x = args[0] if args else None
        why = why_plain(layer, x, dict(getattr(function, "keywords", None) or {}) | kwargs)
        if why is None and torch.is_tensor(x) and x.shape[1] > chunk:
            STATS["tiled"] += 1
            call = TiledCall(layer, function, chunk)
            return base(call, *args, **kwargs) if base is not None else call(*args, **kwargs)
        STATS["plain"] += 1
        STATS["why"] = why or f"{x.shape[1] if torch.is_tensor(x) else '?'} tokens <= the chunk"
        if base is not None and getattr(base, "_ropescale_direct", False):
            return getattr(base, "_ropescale_plain")(function, *args, **kwargs)
        return plain(function, *args, **kwargs)

    fn._ropescale_tiled_attention = chunk
    return fn


def direct_call(function, *args, **kwargs):
    """The base of an offloader's checkpoint function around a tiled layer: the layer is its own checkpoint."""
    return function(*args, **kwargs)


def enable_tiled_attention(model, chunk: int, roles=None, offloader=None) -> int:
    """Recompute every checkpointed decoder layer of ``model`` by ``chunk``-token sequence chunks (module doc),
    its input stored as ``roles`` say (``estimate.layer_roles``) through ``offloader`` where one is given.
    Returns the number of layers changed."""
    if chunk <= 0:
        raise InputError(f"--tile-attention must be a number of tokens > 0, not {chunk}")
    layers = innermost_layers(checkpointed_layers(model))
    if not layers:
        raise InputError("--tile-attention: the model has no gradient-checkpointed layer (enable gradient "
                         "checkpointing first)")
    roles = roles or [("gpu", 0)] * len(layers)
    n = 0
    for m, (role, pos) in zip(layers, roles):
        if role == "none":
            continue
        base = None
        if offloader is not None:
            from torch.utils.checkpoint import checkpoint

            base = offloader.checkpoint_fn(base=direct_call, role=role, pos=pos)
            base._ropescale_direct = True
            base._ropescale_plain = offloader.checkpoint_fn(role=role, pos=pos,
                                                            base=functools.partial(checkpoint, use_reentrant=False))
        compat.set_checkpoint_function(m, tiled_checkpoint(m, int(chunk), base))
        n += 1
    return n

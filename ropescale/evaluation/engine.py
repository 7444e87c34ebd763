"""The hf backend's own greedy decoder (``--cache slots``, the default): a fixed slot cache, per-sample prefill,
continuous batching, and on CUDA one CUDA graph for the decode step.

Why not ``model.generate``: at a 16K prompt on a 7B model a decode step is dominated by per-step overhead
(Python, ~1,000 kernel launches, generate's bookkeeping: 75-110 ms on an H100 whatever the batch), batched
``generate`` pads every prompt to the longest and prefills them together (activation memory for the whole batch,
masked attention), and a batch runs until its longest member is done. Here:

- **Slot cache.** One KV buffer per layer, ``[slots, kv_heads, M, head_dim]``, allocated once for the whole run
  with ``M = longest prompt + 2 x max_new_tokens``. All slots write the same column ``w`` at a decode step; a
  slot's prompt sits just left of the column where it joined, its other columns are masked (an additive mask
  ``[slots, 1, 1, M]``). Positions are per slot, so RoPE sees each sample exactly as batch-1 decoding does.
- **Per-sample prefill.** A new sample is prefilled alone (no padding, SDPA's causal flash path, logits for the
  last position only) and its keys/values are written straight into its slot, so prefill needs activation memory
  for one sample, which leaves room for more slots.
- **Continuous batching.** Every few steps finished slots (EOS after ``min_new_tokens``, or ``max_new_tokens``)
  are handed to ``on_done`` and refilled from the queue (longest first). When the shared column would run past
  ``M``, the buffers are shifted left by the columns no live slot uses (a memory move, rare).
- **No cache copies.** A masked step would make transformers' SDPA path repeat every key/value head for its
  query heads (a full copy of the cache, x group size, each step); the decode step's attention instead folds a
  group's query heads into SDPA's query dimension (:func:`_slot_decode_attention`).
- **CUDA graph.** The decode step (forward, EOS suppression below ``min_new_tokens``, argmax, cache/mask/position
  updates) is captured once and replayed, so a step costs GPU time, not launch time. The shape never changes
  during a run, so one capture serves the whole benchmark. A model whose forward cannot be captured falls back to eager
  steps, with a note on stderr; models under a length rule decode eagerly from the start (see below).

Rotary rules that follow the length (dynamic NTK, dynamic YaRN, LongRoPE) give each slot its own frequencies
(:mod:`ropescale.evaluation.rope_rules`: :func:`~ropescale.evaluation.rope_rules.slot_ropes`); those decode steps run
eagerly, since the per-slot frequencies need the positions on the host.

Greedy outputs equal plain batch-1 ``model.generate`` in fp32 (token for token: tests on CPU with Qwen2 / Llama
GQA models, refills and shifts; ``bench/bench_generate.py --device cuda --toy --dtype float32`` on CUDA with the
graph). Measured on an H100 at 12-18K prompts, 400 new tokens: 10.4-12.4x plain ``generate`` (Qwen1.5-7B shape),
23.8x (Qwen2.5-7B shape, GQA); see README. Needs transformers 5.x (its decoder models take a prepared 4D mask as
is) and SDPA attention; on anything else the backend uses ``generate`` (``--cache static``) instead — see
:func:`supported`.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Sequence

from ropescale.common import compat
from ropescale.common.compat.rope import rope_forward

from .rope_rules import slot_ropes

SYNC_EVERY = 16  # decode steps between host syncs (finished slots are noticed at these points)


def cut_at_eos(ids: Sequence[int], eos_ids: set[int]) -> list[int]:
    """Token ids up to (not including) the first EOS (every decoder's output, both backends)."""
    out = []
    for t in ids:
        if t in eos_ids:
            break
        out.append(int(t))
    return out


def supported(model) -> str | None:
    """None if the slot decoder can run ``model``, else why not (one line)."""
    why = compat.prepared_mask_blocker()
    if why:
        return why
    cfg = model.config
    attn = compat.attn_implementation(cfg)
    ext = [m._ropescale_extend for m in model.modules() if getattr(m, "_ropescale_extend", None) is not None]
    if ext:
        return f"--attention-extend {ext[0].rule.method} needs the mask of every step"
    if attn != "sdpa":
        return f"attention implementation {attn!r} (the slot decoder needs sdpa)"
    types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"}:
        return f"layer types {sorted(types)} (sliding-window layers are not supported by the slot decoder)"
    return None


def slot_bytes_per_token(config, dtype) -> int:
    """KV-cache bytes one token takes (all layers, keys and values); both hf-backend memory budgets use it."""
    import torch

    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv * head_dim * (torch.finfo(dtype).bits // 8)


class SlotCache(compat.DuckCache):
    """A duck-typed transformers cache (:class:`ropescale.common.compat.DuckCache`) over fixed per-layer buffers,
    for decode steps: ``update`` writes the new key/value at column ``col`` of every slot and returns the whole
    buffer (the step passes a prepared 4D mask, so transformers' mask builder never asks this cache anything).
    Prompts are written by :func:`_prefill_writer`."""

    def __init__(self, n_layers: int, slots: int, length: int, device, dtype):
        self.n_layers, self.slots, self.length = n_layers, slots, length
        self.device, self.dtype = device, dtype
        self.keys: list = [None] * n_layers
        self.values: list = [None] * n_layers
        import torch

        self.col = torch.zeros(1, dtype=torch.long, device=device)

    def _alloc(self, layer: int, k) -> None:
        import torch

        shape = (self.slots, k.shape[1], self.length, k.shape[3])
        # zeros, not empty: a masked column is multiplied by 0, and 0 * NaN garbage would be NaN
        self.keys[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)
        self.values[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)

    def write(self, key, value, layer_idx: int):
        if self.keys[layer_idx] is None:
            self._alloc(layer_idx, key)
        self.keys[layer_idx].index_copy_(2, self.col, key)
        self.values[layer_idx].index_copy_(2, self.col, value)
        return self.keys[layer_idx], self.values[layer_idx]

    def shift_left(self, s: int) -> None:
        """Move every buffer ``s`` columns to the left (the first ``s`` columns are dropped)."""
        for bufs in (self.keys, self.values):
            for t in bufs:
                if t is not None:
                    t[:, :, :self.length - s].copy_(t[:, :, s:].clone())


ATTN_NAME = "ropescale_slot_decode"
_ATTN_REGISTERED = False


def _slot_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                           **kwargs):
    """Decode-step attention for grouped-query models without copying the cache.

    transformers' SDPA path repeats each key/value head for its query heads whenever a mask is passed (SDPA's own
    GQA support needs mask-free flash), which copies the whole cache, times the group size, at every step. With
    one query token the group's query heads can instead ride in SDPA's query-length dimension: query
    ``[B, H, 1, D]`` -> ``[B, kv, H/kv, D]`` against keys ``[B, kv, M, D]`` (head h uses key/value head
    h // (H/kv), as ``repeat_kv`` does), mask ``[B, 1, 1, M]`` broadcast over both. Anything else (prefill,
    multi-head models) goes to transformers' SDPA function unchanged."""
    import torch.nn.functional as F

    b, h, q, d = query.shape
    kvh = key.shape[1]
    if q != 1 or attention_mask is None or h == kvh or h % kvh:
        return compat.sdpa_attention()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query.reshape(b, kvh, h // kvh, d), key, value,
                                         attn_mask=attention_mask[:, :, :, :key.shape[-2]], dropout_p=0.0,
                                         scale=scaling)
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    global _ATTN_REGISTERED
    if not _ATTN_REGISTERED:
        compat.register_attention(ATTN_NAME, _slot_decode_attention)
        _ATTN_REGISTERED = True


def _prefill_writer(config, cache: "SlotCache", row: int, start: int):
    """A transformers cache that stores nothing (:func:`ropescale.common.compat.writer_cache`): each layer's
    prompt keys/values are copied into slot ``row`` of ``cache`` from column ``start`` and returned unchanged. To the
    model (and its mask builder) it is an empty cache, so the prompt gets the plain causal path (SDPA flash, no
    mask) and attends only to itself, and no second copy of a long prompt's keys/values is ever held."""

    def write(key_states, value_states, layer_idx):
        if cache.keys[layer_idx] is None:
            cache._alloc(layer_idx, key_states)
        n = key_states.shape[-2]
        cache.keys[layer_idx][row, :, start:start + n].copy_(key_states[0])
        cache.values[layer_idx][row, :, start:start + n].copy_(value_states[0])

    return compat.writer_cache(config, write)


class _Slot:
    __slots__ = ("item", "start", "tokens")

    def __init__(self, item, start: int, first: int):
        self.item, self.start, self.tokens = item, start, [first]


class SlotBuffers:
    """The device state of a run of the slot decoder, allocated once: the slot cache (M columns a slot), the additive
    mask ``[slots, 1, 1, M]``, each slot's next token, position, count of new tokens, and the tokens of the last
    decode steps (read on the host at each sync point)."""

    def __init__(self, model, slots: int, length: int, eos: Sequence[int], device: str):
        import torch

        cfg = model.config
        dev = torch.device(device)
        dtype = next(model.parameters()).dtype
        self.length = length
        self.cache = SlotCache(cfg.num_hidden_layers, slots, length, dev, dtype)
        self.neg = torch.finfo(dtype).min
        self.mask = torch.full((slots, 1, 1, length), self.neg, dtype=dtype, device=dev)
        self.tok = torch.zeros((slots, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((slots, 1), dtype=torch.long, device=dev)
        self.gen = torch.zeros((slots,), dtype=torch.long, device=dev)
        self.hist = torch.zeros((slots, SYNC_EVERY), dtype=torch.long, device=dev)
        self.hcol = torch.zeros(1, dtype=torch.long, device=dev)
        vocab = model.get_output_embeddings().weight.shape[0]
        self.eos_mask = torch.zeros((vocab,), dtype=torch.bool, device=dev)
        self.eos_mask[[e for e in eos if 0 <= e < vocab]] = True

    def set_col(self, w: int) -> None:
        """The column the next decode step writes (attended by the step itself)."""
        self.cache.col.fill_(w)
        self.mask[:, :, :, w] = 0

    def open_slot(self, row: int, start: int, w: int, first: int, n: int) -> None:
        """Slot ``row`` after its prompt's prefill: it sees columns ``start .. w``, its next token is ``first`` at
        position ``n``."""
        self.mask[row].fill_(self.neg)
        self.mask[row, :, :, start:w + 1] = 0
        self.tok[row, 0] = first
        self.pos[row, 0] = n
        self.gen[row] = 1

    def shift_left(self, s: int) -> None:
        """Drop the first ``s`` columns of the cache and the mask."""
        self.cache.shift_left(s)
        m = self.mask[:, :, :, s:].clone()
        self.mask.fill_(self.neg)
        self.mask[:, :, :, :self.length - s] = m


class DecodeStep:
    """One decode step of every slot, on device tensors only: eager, or (CUDA) captured once as a CUDA graph after
    two warm-up steps and replayed; a capture that fails falls back to eager steps with a note."""

    def __init__(self, model, buf: SlotBuffers, dynamic: list, *, min_new: int, cuda_graph: bool, log):
        self.model, self.buf, self.dynamic, self.min_new = model, buf, dynamic, min_new
        self.cuda_graph, self.log = cuda_graph, log
        self.graph = None
        self.graph_used = False
        self.eager_steps = 0

    def __call__(self) -> None:
        import torch

        if self.graph is not None:
            self.graph.replay()
            return
        if self.cuda_graph and self.eager_steps >= 2:  # warmed up (lazy inits, cuBLAS handles): capture
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    self.body()
                self.graph, self.graph_used = g, True
                g.replay()  # capture records but does not run: this replay is the step
                return
            except Exception as e:  # any capture failure means eager steps, not a failed run
                self.cuda_graph = False
                self.log(f"[generate] decode step not capturable as a CUDA graph ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:160]}); decoding eagerly")
                torch.cuda.synchronize()
        self.body()
        self.eager_steps += 1

    def body(self) -> None:
        """The step (what the CUDA graph captures): forward, EOS suppressed below ``min_new``, argmax, then the
        cache column, mask, positions and counts moved on."""
        b = self.buf
        with contextlib.ExitStack() as stack:
            for d in self.dynamic:  # per-slot frequencies (rope_rules.slot_ropes)
                stack.enter_context(rope_forward(d.m, d.forward))
            # the attention is read by every layer as it runs (and as it is captured)
            stack.enter_context(compat.using_attention(self.model.config, ATTN_NAME))
            out = self.model(input_ids=b.tok, position_ids=b.pos, attention_mask=b.mask,
                             **compat.cache_kwargs(b.cache), use_cache=True)
        logits = out.logits[:, -1, :].float()
        if self.min_new > 0:
            logits = logits.masked_fill((b.gen < self.min_new).unsqueeze(1) & b.eos_mask, float("-inf"))
        nxt = logits.argmax(-1)
        b.tok.copy_(nxt.unsqueeze(1))
        b.hist.index_copy_(1, b.hcol, nxt.unsqueeze(1))
        b.hcol.add_(1)
        b.pos.add_(1)
        b.gen.add_(1)
        b.cache.col.add_(1)
        # open the next column: new_col = col (already advanced)
        b.mask.index_fill_(3, b.cache.col, 0)


class SlotDecoder:
    """Greedy decoding of many prompts through ``slots`` slots (see the module doc): the schedule (which sample
    sits in which slot, refills, shifts, sync points) over :class:`SlotBuffers` and :class:`DecodeStep`."""

    def __init__(self, model, *, slots: int, eos: Sequence[int], device: str, cuda_graph: bool = True, log=None):
        self.model = model
        self.slots = max(1, int(slots))
        self.eos = [int(e) for e in eos]
        self.device = device
        self.cuda_graph = bool(cuda_graph) and str(device).startswith("cuda")
        self.log = log or (lambda m: print(m, file=sys.stderr))
        self.graph_used = False
        self.compactions = 0  # left shifts of the slot buffers (tests check the path is taken)
        self.dynamic = slot_ropes(model)
        if self.dynamic:
            self.cuda_graph = False  # the per-slot frequencies need the positions on the host

    def run(self, items: Sequence, max_new_tokens: int, min_new_tokens: int,
            on_done: Callable[[object, list[int]], None]) -> None:
        """Decode every item (``.input_ids``); ``on_done(item, ids)`` gets the new tokens cut at the first EOS."""
        if not items:
            return
        queue = sorted(items, key=lambda it: -len(it.input_ids))
        self.max_new, self.min_new = int(max_new_tokens), min(int(min_new_tokens), int(max_new_tokens))
        length = len(queue[0].input_ids) + 2 * max_new_tokens
        self.buf = SlotBuffers(self.model, min(self.slots, len(queue)), length, self.eos, self.device)
        self.step = DecodeStep(self.model, self.buf, self.dynamic, min_new=self.min_new, cuda_graph=self.cuda_graph,
                               log=self.log)
        _register_attention()
        try:
            self._run(queue, on_done)
        finally:  # drop every device buffer now, whatever happened (an OOM retry needs the memory back)
            self.graph_used, self.cuda_graph = self.step.graph_used, self.step.cuda_graph
            self.buf = self.step = None

    def _run(self, queue: list, on_done) -> None:
        import torch

        eos = set(self.eos)
        slots: list[_Slot | None] = [None] * self.buf.mask.shape[0]
        w = len(queue[0].input_ids)  # the column the next decode step writes
        with torch.inference_mode():
            while queue or any(slots):
                w = self._refill(slots, queue, w)
                self._harvest(slots, eos, on_done)  # finished at prefill already (max_new 1, or EOS allowed at once)
                if not any(slots):
                    continue
                # decode until the next sync point; never past a slot's max_new_tokens (its columns end there)
                k = min(SYNC_EVERY, min(self.max_new - len(s.tokens) for s in slots if s is not None))
                self.buf.hcol.zero_()
                for _ in range(k):
                    self.step()
                w += k
                got = self.buf.hist[:, :k].tolist()
                for r, s in enumerate(slots):
                    if s is not None:
                        s.tokens.extend(got[r])
                self._harvest(slots, eos, on_done)

    def _refill(self, slots: list, queue: list, w: int) -> int:
        """Free slots take the next samples (longest first), prefilled at column ``w`` (the buffers shifted left
        first when ``w`` + max new tokens would run past them); returns the write column."""
        free = [r for r, s in enumerate(slots) if s is None]
        if not (free and queue):
            return w
        if not any(slots):
            w = len(queue[0].input_ids)  # nothing live: restart at the left edge
        for r in free:
            if not queue:
                break
            it = queue[0]
            if w + self.max_new > self.buf.length:
                w = self._compact(slots, w, len(it.input_ids))
            queue.pop(0)
            slots[r] = self._prefill(r, it, w)
        self.buf.set_col(w)
        return w

    def _harvest(self, slots: list, eos: set, on_done) -> None:
        """Hand finished slots (EOS, or max new tokens) to ``on_done`` and free them."""
        for r, s in enumerate(slots):
            if s is not None and (len(s.tokens) >= self.max_new or any(t in eos for t in s.tokens)):
                on_done(s.item, cut_at_eos(s.tokens[:self.max_new], eos))
                slots[r] = None

    def _prefill(self, row: int, item, w: int) -> _Slot:
        """Prefill ``item`` alone into slot ``row``, its prompt ending just left of column ``w``."""
        import torch

        ids = item.input_ids
        n = len(ids)
        start = w - n
        dev = self.buf.tok.device
        with contextlib.ExitStack() as stack:  # each length rule in this sample's state (dynamic NTK: fresh)
            for d in self.dynamic:
                stack.enter_context(d.prefill(n, n + self.max_new))
            out = self.model(input_ids=torch.tensor([ids], dtype=torch.long, device=dev),
                             position_ids=torch.arange(n, device=dev).unsqueeze(0),
                             **compat.cache_kwargs(_prefill_writer(self.model.config, self.buf.cache, row, start)),
                             use_cache=True, **compat.last_logits_kwargs(1))
        logits = out.logits[0, -1].float()
        if self.min_new > 0:
            logits = logits.masked_fill(self.buf.eos_mask, float("-inf"))
        first = int(logits.argmax())
        for d in self.dynamic:
            d.take(row)
        self.buf.open_slot(row, start, w, first, n)
        return _Slot(item, start, first)

    def _compact(self, slots, w: int, next_len: int) -> int:
        """Shift buffers left so that column ``w`` + max_new fits; returns the new write column."""
        live = [s.start for s in slots if s is not None]
        s = min(min(live) if live else w, w - next_len)
        if s <= 0:
            raise RuntimeError(f"slot decoder: no room to compact (w={w}, next prompt {next_len}, "
                               f"M={self.buf.length})")
        self.buf.shift_left(s)
        self.compactions += 1
        for sl in slots:
            if sl is not None:
                sl.start -= s
        return w - s

"""The memory of one inference forward (no gradients), estimated from the length and the model's shape before
anything is allocated, and the one-line refusal of a forward that cannot fit this machine (:func:`check_forward`).

What it counts (bytes; t = batch x length tokens, b = bytes of the dtype, h hidden, f intermediate, q / kv = heads x
head dim, d head dim, V vocabulary, L layers): the terms of the training memory model
(``ropescale.training.memory.estimate``) that a forward without gradients keeps, measured on transformers' LLaMA /
Qwen2 decoder layer (SDPA, RMSNorm, SwiGLU):

- activations: at a layer's peak, per token b x (5h + 2d + max(3f, 5q + 2kv)): the embedding output (held by the
  decoder for the whole forward), the residual, the normed input, the norm's temporary and the layer's output being
  formed (5h), the rotary cos and sin (2d), and the MLP's act(gate), up and their product (3f) or attention's q,
  repeated k and v, its output and that output made contiguous (5q + 2kv), whichever is larger;
- KV: with a cache, L x 2 x kv x b a cached token (``kv_tokens``: the prefix's, copied ``kv_copies`` times);
- mask: a padded batch (rows of unequal length) gets a B x T x T mask from transformers, b + 1 bytes an entry (a
  float mask and the boolean one it is built from); an unpadded causal batch gets none (SDPA's is_causal);
- logits: the scored positions only, at most ``head_chunk`` at a time (the label-only head of
  ``ropescale.training.loss``, here ``ropescale.probes.scorer``), V x (b + 4 + 4 below fp32) bytes each: the
  logits, their fp32 copy, the log-softmax; the head's moment also holds the final hidden states (t x h x b);
- weights: what the model's parameters take when it is not loaded yet (:func:`weight_bytes`); 0 when it is (then
  the memory available now already excludes them).

The peak is the larger of a layer's moment and the head's. Measured with glibc's mmap threshold fixed (so the RSS
follows the live tensors), the scorer's forward of 4,096 tokens: estimate / measured 1.04 on the committed tiny
Qwen2 (h 256, f 704, 4 layers), 1.05 on a wide-vocabulary one (V 32,768) and, at 2,048 tokens, 1.00 on SmolLM2-135M
(tests/test_forward_memory.py measures the first two again). Not counted: the allocator's slack, torch's thread
pools, Python objects.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from .io import InputError

HEAD_CHUNK = 4096  # scored positions whose logits are alive at once (training's --head-chunk default)
HOST_SHARE = 0.9  # a forward "fits" in at most this share of the memory available now (the training model's share)
GIB = 2**30


def gib(n: float) -> str:
    """``6.4 GiB``; below 0.1 GiB in MiB, below 0.1 MiB in KiB."""
    if n >= 0.1 * GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 0.1 * 2**20 else f"{n / 1024:.1f} KiB"


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's shape (LLaMA / Qwen2 / Mistral: RMSNorm, SwiGLU MLP): what a forward's memory
    (here) and a training step's (``ropescale.training.memory.estimate``) depend on."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int | None = None  # default hidden / heads
    tied: bool = False  # the LM head shares the input embedding

    @property
    def d(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q(self) -> int:
        return self.heads * self.d

    @property
    def kv(self) -> int:
        return self.kv_heads * self.d

    def layer_params(self) -> int:
        """q, k, v, o and the MLP's gate, up, down (biases left out)."""
        h = self.hidden
        return h * self.q + 2 * h * self.kv + self.q * h + 3 * h * self.intermediate

    def total_params(self) -> int:
        h, v = self.hidden, self.vocab
        return v * h * (1 if self.tied else 2) + self.layers * (self.layer_params() + 2 * h) + h

    def hf_kwargs(self) -> dict:
        """The shape as a transformers config's fields (``AutoConfig.for_model(arch, **shape.hf_kwargs())``)."""
        kw = dict(hidden_size=self.hidden, num_hidden_layers=self.layers, num_attention_heads=self.heads,
                  num_key_value_heads=self.kv_heads, intermediate_size=self.intermediate, vocab_size=self.vocab)
        if self.head_dim is not None:
            kw["head_dim"] = self.head_dim
        return kw

    @classmethod
    def from_config(cls, config) -> Shape:
        """From a transformers config (its text config for a multimodal one) or a config.json dict."""
        c = config.get_text_config() if hasattr(config, "get_text_config") else config
        get = c.get if isinstance(c, dict) else (lambda k, default=None: getattr(c, k, default))
        heads = int(get("num_attention_heads"))
        hidden = int(get("hidden_size"))
        head_dim = get("head_dim")
        return cls(layers=int(get("num_hidden_layers")), hidden=hidden, heads=heads,
                   kv_heads=int(get("num_key_value_heads") or heads),
                   intermediate=int(get("intermediate_size") or 4 * hidden), vocab=int(get("vocab_size")),
                   head_dim=int(head_dim) if head_dim else None, tied=bool(get("tie_word_embeddings", False)))


@dataclass
class ForwardEstimate:
    """Bytes of one forward by part, its peak, and what it was asked for."""

    activations: int
    kv: int
    mask: int
    logits: int
    weights: int
    peak: int
    batch: int
    length: int
    parts: dict = field(default_factory=dict)

    def describe(self) -> str:
        shown = [(k, v) for k, v in (("activations", self.activations), ("KV cache", self.kv), ("mask", self.mask),
                                     ("logits", self.logits), ("weights", self.weights)) if v]
        return ", ".join(f"{k} {gib(v)}" for k, v in shown)


def layer_bytes_per_token(shape: Shape, dtype_bytes: int) -> int:
    """Bytes a token holds at a decoder layer's peak in a forward without gradients (module doc: activations)."""
    h, f, q, kv, d = shape.hidden, shape.intermediate, shape.q, shape.kv, shape.d
    return dtype_bytes * (5 * h + 2 * d + max(3 * f, 5 * q + 2 * kv))


def estimate_forward(shape: Shape, length: int, *, batch: int = 1, scored: int | None = None,
                     dtype_bytes: int = 4, kv_tokens: int = 0, kv_copies: int = 1, padded: bool = False,
                     head_chunk: int = HEAD_CHUNK, weights: int = 0) -> ForwardEstimate:
    """The peak of one forward of ``batch`` rows of ``length`` tokens whose last ``scored`` positions a row
    (default: all) go through the LM head; ``kv_tokens``: tokens a row keeps in the KV cache (0: no cache; a prefix
    reused by ``kv_copies`` copies of it); ``padded``: rows of unequal length (a materialised mask)."""
    b, t = dtype_bytes, batch * length
    scored = length if scored is None else min(scored, length)
    act = t * layer_bytes_per_token(shape, b)
    kv = shape.layers * 2 * shape.kv * b * kv_tokens * kv_copies
    mask = batch * length * length * (b + 1) if padded else 0
    at_once = min(batch * scored, head_chunk)
    logits = at_once * shape.vocab * (b + 4 + (4 if b < 4 else 0))
    head = t * shape.hidden * b + batch * scored * shape.hidden * b + logits
    moments = {"layer": act + mask, "head": head}
    at = max(moments, key=moments.get)
    return ForwardEstimate(activations=act, kv=kv, mask=mask, logits=logits, weights=weights,
                           peak=weights + kv + moments[at], batch=batch, length=length,
                           parts={"at": at, "moments": moments, "per_token": layer_bytes_per_token(shape, b)})


def weight_bytes(model_dir: str | Path, dtype_bytes: int) -> int:
    """The parameters of the model directory ``model_dir`` in ``dtype_bytes`` bytes each: their element counts from
    the safetensors headers (no tensor read); 0 when there are none (a .bin checkpoint: not estimated)."""
    import json

    n = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with open(f, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size).decode("utf-8"))
        n += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return n * dtype_bytes


def available_bytes(device: str = "cpu") -> int:
    """Memory a forward may take now: :data:`HOST_SHARE` of the host's available memory, or of a CUDA device's
    free memory."""
    if str(device).startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free * HOST_SHARE)
    from .host import available_host_bytes

    return int(available_host_bytes() * HOST_SHARE)


def longest_fitting(peak_at, budget: int, upto: int) -> int:
    """The largest length in [0, ``upto``] whose ``peak_at(length)`` is at most ``budget`` (the peak grows with
    the length): a binary search."""
    lo, hi = 0, upto
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if peak_at(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_forward(config, length: int, *, what: str, batch: int = 1, scored: int | None = None,
                  dtype_bytes: int = 4, kv_tokens: int = 0, kv_copies: int = 1, padded: bool = False,
                  weights: int = 0, device: str = "cpu", budget: int | None = None,
                  hint: str = "") -> ForwardEstimate:
    """The estimate of one forward (:func:`estimate_forward`; ``config``: the model's config or a
    :class:`Shape`), or an InputError in one line when its peak exceeds ``budget`` (default:
    :func:`available_bytes` of ``device``), naming the longest length that fits (at this batch and, for a batch,
    at one row) and ``what`` was asked (``--lengths 8000000``)."""
    shape = config if isinstance(config, Shape) else Shape.from_config(config)
    kw = dict(scored=scored, dtype_bytes=dtype_bytes, kv_copies=kv_copies, padded=padded, weights=weights)
    est = estimate_forward(shape, length, batch=batch, kv_tokens=kv_tokens, **kw)
    budget = available_bytes(device) if budget is None else budget
    if est.peak <= budget:
        return est
    extra = kv_tokens - length if kv_tokens else None  # cached tokens beyond the forward's own (a prefix)

    def peak_at(n: int, rows: int = batch) -> int:
        kv_n = 0 if extra is None else max(0, n + extra)
        return estimate_forward(shape, n, batch=rows, kv_tokens=kv_n, **kw).peak

    best = longest_fitting(peak_at, budget, length)
    one = f", {longest_fitting(lambda n: peak_at(n, 1), budget, length):,} with one row a forward" \
        if batch > 1 else ""
    fits = f"the longest that fits is {best:,} tokens{one}" if best else "not even a one-token forward fits"
    raise InputError(f"{what}: one forward of {batch} x {length:,} tokens needs ~{gib(est.peak)} "
                     f"({est.describe()}), more than the {gib(budget)} this machine can give it now; {fits}"
                     f"{'; ' + hint if hint else ''}")

"""A memory model of one training step: the estimated peak per GPU for a model shape, a sample length, the
sequence-parallel degree, the ZeRO stage and what is offloaded. A model, not a measurement.

What it counts (bytes on one GPU; t = the tokens one GPU holds = micro batch x ceil(length / K); b = bytes of the
compute dtype, 2 for bf16; h hidden, f intermediate, V vocabulary, L layers, q / kv = heads x head dim):

- weights: every parameter in b bytes (the trained ones in fp32 without DeepSpeed: fp32 master copies); under
  ZeRO-3 1/W of them (none with parameter offload) plus what is gathered at a time: the embedding or LM head and
  one decoder layer.
- LoRA + optimizer state: AdamW's m and v in fp32 (and the fp32 gradients but the embedding's) without DeepSpeed;
  fp32 master + m + v + fp32 and b-byte gradient partitions (16 + b bytes a parameter) / W under ZeRO-2/3;
  nothing with optimizer offload. Plus, at the end of backward, the trained embedding's dense gradient.
- checkpoints: each decoder layer's input, L x t x h x b (two layers' worth with --offload-checkpoints).
- activations: one decoder layer recomputed in backward, per token: two RMSNorms (fp32 input + output), q, k, v
  after RoPE, the attention output, the layer output, LoRA dropout's copies and masks (dropout > 0), the MLP's
  gate, up, act(gate), act x up (4 f b; with --tile-mlp only a chunk's, plus the MLP output), the largest
  gradients alive in its backward, the residual-stream gradients, and under sequence parallelism a copy of q, k,
  v and the output for the all-to-all.
  With --tile-attention (the layer recomputed by sequence chunks) only the keys, values, their gradients and
  the residual gradients exist for the whole sequence, the rest for one chunk (:func:`tiled_layer_bytes`).
- logits: the label-only head's positions at a time (all labelled positions of the micro-batch under ZeRO-3,
  where the head runs in one call; at most --head-chunk otherwise) x V x (b + 12) bytes (logits, their fp32
  copy, log-softmax, its gradient), plus the final norm over the t tokens.

The peak is the largest of three moments of the step: the head's backward (weights + state + checkpoints +
logits), a layer's recompute (weights + state + checkpoints + activations) and the embedding's gradient at the
end (weights + state + that gradient). Not counted: the CUDA context, the allocator's fragmentation, DeepSpeed's
communication buckets, biases and other small tensors.

``python -m ropescale.training.memory.estimate --table`` prints the README's table (the longest context per GPU
count); ``--check`` compares the model with the H100 measurements of :data:`H100_MEASURED`. The memory planner
(which plan fits a device, ``python -m ropescale.training.memory``) is built on :func:`estimate`.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field, replace

from ropescale.common.cli import Tool, add_command
from ropescale.common.forward_memory import GIB, Shape, gib

FITS_SHARE = 0.9  # a length "fits" when the estimate is at most this share of the GPU's memory
HOST_HEADROOM = 0.9  # use at most this share of the available host memory (pinned pages cannot be swapped out)
# the recipe plan (finetune.py's old auto rules): offload the checkpoints / tile the MLP on CUDA from this many tokens
# per micro-batch on. Measured on an H100 with the 7B shape (README "Measured"): 16K trains in 10 GiB and 32K in 37
# GiB without either; the checkpoints grow by 256 KiB a token (16 GiB at 64K, 32 GiB at 128K) and the MLP's recompute
# by 172 KiB a token, so from 64K on they are what decides whether a sample fits on an 80 GB GPU (128K needed 68 GiB,
# 256K does not fit), while below it offloading only costs host memory and PCIe bandwidth for memory not needed.
AUTO_MIN_TOKENS = 65536


def ordinal(k: int) -> str:
    """2 -> 2nd, 4 -> 4th."""
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def lora_params(shape: Shape, r: int, targets) -> int:
    """Parameters of rank-``r`` LoRA adapters on the ``targets`` projections of every layer (A: r x in, B: out x r;
    Hu et al. 2021, Sec. 4.1)."""
    h, f = shape.hidden, shape.intermediate
    io = {"q_proj": (h, shape.q), "k_proj": (h, shape.kv), "v_proj": (h, shape.kv), "o_proj": (shape.q, h),
          "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}
    return shape.layers * sum(r * sum(io[t]) for t in targets if t in io)


# Qwen1.5-7B (config.json of Qwen/Qwen1.5-7B): MHA, no GQA; the shape every 7B figure here uses (the planner, the
# GPU suite, the benchmarks), and its RoPE (the original context NTK x8 extends to 262,144)
QWEN15_7B = Shape(layers=32, hidden=4096, heads=32, kv_heads=32, intermediate=11008, vocab=151936)
QWEN15_7B_ROPE = {"max_position_embeddings": 32768, "rope_theta": 1e6}


@dataclass(frozen=True)
class Activations:
    """How a step keeps its activations: the activation part of a memory plan (``plan.Plan`` adds where the
    parameters and the optimizer state live; ``install.plan_from_args`` reads finetune's flags into one)."""

    recompute_every: int = 1
    checkpoint_block: int = 1
    offload_checkpoints: bool = False
    gpu_checkpoints: int = 0
    tile_mlp: int = 0
    tile_attention: int = 0  # tokens per chunk of the sequence-tiled layer recompute (tiled_attention), 0 = off


@dataclass(frozen=True)
class Setup:
    """How a step runs (finetune.py's settings that move memory)."""

    length: int  # tokens of the longest sample
    micro_batch: int = 1
    sp: int = 1  # --sequence-parallel K
    world: int = 1  # processes (GPUs): ZeRO partitions over all of them
    zero: int = 3  # 0 = no DeepSpeed, 2 or 3
    offload_param: bool = True
    offload_optimizer: bool = True
    dtype_bytes: int = 2
    lora_r: int = 8
    lora_targets: tuple = ("q_proj", "k_proj", "v_proj", "o_proj")
    lora_dropout: float = 0.05
    train_embeddings: bool = True
    train_norms: bool = True
    gradient_checkpointing: bool = True
    offload_checkpoints: bool = False
    tile_mlp: int = 0  # tokens per MLP chunk, 0 = off
    head_chunk: int = 4096
    label_share: float = 0.1  # labelled tokens / tokens (the summaries)
    recompute_every: int = 1  # checkpoint (and recompute) every k-th decoder layer; 0 = none (all kept)
    checkpoint_block: int = 1  # with every layer recomputed: one stored checkpoint per block of k layers
    gpu_checkpoints: int = 0  # with offload_checkpoints: the stored checkpoints that stay on the GPU
    head_chunk_zero3: bool = False  # under ZeRO-3 the head runs in --head-chunk chunks too (one process)
    tile_attention: int = 0  # tokens per chunk: each recomputed layer by sequence chunks (tiled_attention), 0 = off

    @property
    def tokens(self) -> int:
        """t: the tokens one GPU holds."""
        return self.micro_batch * -(-self.length // self.sp)

    def recomputed_layers(self, layers: int) -> int:
        """Decoder layers whose activations are recomputed in backward (every k-th; all for k = 1)."""
        if not self.gradient_checkpointing or self.recompute_every <= 0:
            return 0
        return -(-layers // self.recompute_every)

    def stored_checkpoints(self, layers: int) -> int:
        """Checkpoints kept from forward to backward: one per recomputed layer, or one per block."""
        n = self.recomputed_layers(layers)
        return -(-n // self.checkpoint_block) if self.recompute_every == 1 else n


@dataclass
class Estimate:
    """Bytes per GPU by component, the peak and the moment of the step that sets it."""

    weights: int
    state: int
    checkpoints: int
    activations: int
    logits: int
    embedding_grad: int
    peak: int
    at: str  # "head", "layer" or "end"
    tokens: int
    host: int = 0  # host bytes per process: offloaded parameters, optimizer, checkpoints
    parts: dict = field(default_factory=dict)

    def describe(self) -> str:
        g = gib
        return (f"~{g(self.peak)} per GPU at the step's peak ({MOMENTS[self.at]}): weights {g(self.weights)}, "
                f"LoRA + optimizer state {g(self.state)}, checkpoints {g(self.checkpoints)}, activations "
                f"{g(self.activations)}, logits {g(self.logits)}; host {g(self.host)} per process")


MOMENTS = {"head": "the LM head's backward", "layer": "a layer's recompute", "end": "the embedding's gradient"}


def trained_params(shape: Shape, s: Setup) -> tuple[int, int]:
    """(trained parameters, of which the largest single tensor: the embedding when it is trained)."""
    emb = shape.vocab * shape.hidden if s.train_embeddings else 0
    norms = (2 * shape.layers + 1) * shape.hidden if s.train_norms else 0
    return lora_params(shape, s.lora_r, s.lora_targets) + emb + norms, emb


def layer_bytes_per_token(shape: Shape, s: Setup) -> dict:
    """Bytes a token costs in one decoder layer's recompute + backward (see module doc), by part; with
    ``tile_attention`` what the tiled layer holds for the whole sequence (:func:`tiled_layer_bytes`)."""
    h, f, b, q, kv = shape.hidden, shape.intermediate, s.dtype_bytes, shape.q, shape.kv
    if s.tile_attention:
        return tiled_layer_bytes(shape, s)[0]
    attn = 2 * 4 * h + 3 * b * h + b * (2 * q + 2 * kv)  # norms (fp32 in, out), q k v, attn out, layer out
    dropout = 0
    if s.lora_dropout > 0:
        ins = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": q, "gate_proj": h, "up_proj": h, "down_proj": f}
        dropout = sum((b + 1) * ins[t] for t in s.lora_targets if t in ins)  # a dropped copy + a bool mask each
    mlp = b * h if s.tile_mlp else 4 * b * f
    grads = max(0 if s.tile_mlp else 2 * b * f, b * (q + 2 * kv)) + 2 * b * h
    a2a = b * (2 * q + 2 * kv) if s.sp > 1 else 0
    return {"attention": attn, "lora_dropout": dropout, "mlp": mlp, "backward": grads, "all_to_all": a2a}


def tiled_layer_bytes(shape: Shape, s: Setup) -> tuple[dict, int]:
    """The sequence-tiled layer's recompute + backward (ropescale/training/memory/tiled_attention.py): (bytes a token of
    the whole sequence, by part; bytes of one chunk). Whole sequence: the keys and values after RoPE (2 x kv x b),
    their gradients accumulated in fp32 (2 x kv x 4), one chunk's share of them as SDPA returns it, up to the
    whole sequence at the last chunk (2 x kv x b), the incoming and outgoing residual gradients (2 x h x b). One
    chunk of C tokens: the plain layer's recompute + backward per token (MLP not tiled) x C. An attention kernel
    that keeps no scores is assumed (SDPA's flash / memory-efficient ones, CPU's flash kernel: measured on CPU in
    tests/test_tiled_attention.py); SDPA's math kernel would add a chunk's scores over all keys. With GQA on CUDA a
    chunk's keys and values are repeated per query head (up to the whole sequence at the last chunk), with their
    gradients: 4 x q x b more a token (on CPU SDPA takes GQA as it is)."""
    h, b, kv, t = shape.hidden, s.dtype_bytes, shape.kv, s.tokens
    per = {"keys_values": 2 * kv * b, "key_value_grads": 2 * kv * 4, "chunk_key_value_grads": 2 * kv * b,
           "backward": 2 * b * h}
    if kv != shape.q:  # GQA on CUDA: a chunk's keys and values repeated per query head, and their gradients
        per["gqa_repeat"] = 4 * shape.q * b
    c = min(s.tile_attention, t)
    plain = layer_bytes_per_token(shape, replace(s, tile_attention=0, tile_mlp=0, sp=1))
    return per, c * sum(plain.values())


def layer_roles(layers: int, *, recompute_every: int = 1, block: int = 1, offload: bool = False,
                gpu_checkpoints: int = 0) -> list[tuple[str, int]]:
    """(role, position in its block) of each decoder layer: ``none`` (not recomputed: its activations are kept from
    forward), ``gpu`` (its input stored on the device), ``host`` (stored in host memory), ``derived`` (a block's
    upper layer: its input recomputed from the block's stored one). Every ``recompute_every``-th layer is
    recomputed (layers 0, k, 2k, ...); with every layer recomputed, one input is stored per ``block`` layers;
    offloaded, the top ``gpu_checkpoints`` stored inputs stay on the device (backward needs them first)."""
    k = max(0, int(recompute_every))
    block = max(1, int(block)) if k == 1 else 1
    roles: list[tuple[str, int]] = []
    for i in range(layers):
        if not k or i % k:
            roles.append(("none", 0))
        else:
            pos = i % block
            roles.append(("derived", pos) if pos else ("store", 0))
    stored = [i for i, (r, _) in enumerate(roles) if r == "store"]
    keep = set(stored) if not offload else set(stored[len(stored) - min(len(stored), max(0, gpu_checkpoints)):])
    return [(("gpu" if i in keep else "host"), 0) if r == "store" else (r, p) for i, (r, p) in enumerate(roles)]


def checkpoint_split(shape: Shape, s: Setup) -> tuple[int, int, int]:
    """(checkpoints on the GPU at the step's peak, of which in flight, checkpoints on the host), in checkpoints of
    t x h x b bytes. Offloaded: the top ``gpu_checkpoints`` stored ones stay on the GPU, the rest go to the host and
    two are on the GPU at a time (the one in use and the next one, prefetched); with blocks of k layers the inputs
    of a block's upper k - 1 layers are recomputed from its stored input and alive until their layer's backward."""
    stored = s.stored_checkpoints(shape.layers)
    kept = min(stored, max(0, s.gpu_checkpoints)) if s.offload_checkpoints else stored
    host = stored - kept
    flight = (2 if host else 0) + (s.checkpoint_block - 1 if s.recompute_every == 1 and stored else 0)
    return kept + flight, flight, host


def estimate(shape: Shape, s: Setup) -> Estimate:
    """The memory of one training step on one GPU (see module doc)."""
    b, t, h, w = s.dtype_bytes, s.tokens, shape.hidden, s.world
    total = shape.total_params()
    trained, emb = trained_params(shape, s)
    # weights
    if s.zero == 3:
        live = (shape.vocab * h + shape.layer_params()) * b
        weights = (0 if s.offload_param else math.ceil(total * b / w)) + live
    elif s.zero == 0 and b < 4:
        weights = (total - trained) * b + trained * 4  # fp32 master copies of the trained tensors
    else:
        weights = total * b
    # LoRA + optimizer state, and the trained embedding's gradient at the end of backward
    if s.zero == 0:
        state = 8 * trained + 4 * (trained - emb)
        emb_grad = emb * max(b, 4)
    else:
        state = 0 if s.offload_optimizer else math.ceil((16 + b) * trained / w)
        emb_grad = emb * b
    # checkpoints, the activations of the layers not recomputed (kept from forward), one layer's backward
    per = layer_bytes_per_token(shape, s)
    per_token = sum(per.values())
    const = 6 * b * shape.intermediate * min(s.tile_mlp, t) if s.tile_mlp else 0
    if s.tile_attention:
        const = tiled_layer_bytes(shape, s)[1]
    recomputed = s.recomputed_layers(shape.layers)
    on_gpu, _, on_host = checkpoint_split(shape, s)
    ckpt = on_gpu * t * h * b
    kept = layer_bytes_per_token(shape, replace(s, tile_attention=0)) if s.tile_attention else per
    kept_act = t * (shape.layers - recomputed) * (sum(kept.values()) - kept["backward"])
    act = kept_act + t * (per_token if recomputed else kept["backward"]) + const
    # the label-only head
    labelled = math.ceil(s.label_share * t)
    at_once = labelled if (s.zero == 3 and not s.head_chunk_zero3) else min(labelled, s.head_chunk)
    logits = at_once * shape.vocab * (b + 12)
    final_norm = t * h * (4 + b)
    tied_grad = shape.vocab * h * b if (shape.tied and s.train_embeddings) else 0
    moments = {"head": ckpt + kept_act + logits + final_norm + tied_grad, "layer": ckpt + act, "end": emb_grad}
    at = max(moments, key=moments.get)
    host = 0
    if s.zero == 3 and s.offload_param:
        host += math.ceil(total * b / w)
    if s.zero and s.offload_optimizer:
        host += math.ceil(16 * trained / w)
    host += on_host * t * h * b
    return Estimate(weights=weights, state=state, checkpoints=ckpt, activations=act, logits=logits + final_norm,
                    embedding_grad=emb_grad, peak=weights + state + moments[at], at=at, tokens=t, host=host,
                    parts={"per_token": per, "labelled_at_once": at_once, "moments": moments,
                           "recomputed_layers": recomputed, "host_checkpoints": on_host,
                           "checkpoint_bytes": t * h * b})


def auto_memory(s: Setup, shape: Shape) -> Setup:
    """The recipe plan's choices on CUDA: checkpoint offload and an MLP tiled over hidden-size chunks from
    :data:`AUTO_MIN_TOKENS` tokens per GPU on."""
    on = s.gradient_checkpointing and s.tokens >= AUTO_MIN_TOKENS
    return replace(s, offload_checkpoints=on, tile_mlp=shape.hidden if s.tokens >= AUTO_MIN_TOKENS else 0)


def longest_context(shape: Shape, gpus: int, gpu_gib: float = 80.0, *, step: int = 1024, auto: bool = True,
                    **setup) -> tuple[int, Estimate]:
    """The longest sample (a multiple of ``step`` x the SP degree) whose estimate fits in :data:`FITS_SHARE` of a
    ``gpu_gib`` GPU when one sample is split over all ``gpus`` (``--sequence-parallel gpus``, ZeRO over all)."""
    budget = FITS_SHARE * gpu_gib * GIB
    unit = step * gpus

    def est(n: int) -> Estimate:
        s = Setup(length=n * unit, sp=gpus, world=gpus, **setup)
        return estimate(shape, auto_memory(s, shape) if auto else s)

    if est(1).peak > budget:
        return 0, est(1)
    lo, hi = 1, 2
    while est(hi).peak <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if est(mid).peak <= budget else (lo, mid)
    return lo * unit, est(lo)


# The H100 80 GB figures this model is checked against: the real recipe path (`deepspeed finetune.py
# --recipe qwen1.5-7b_ntk-x8_16k.yaml` on a random 7B Qwen1.5-shape model in bf16, ZeRO-3 with parameter and
# optimizer offload, one GPU, samples of exactly N tokens with 10% labelled: bench/bench_train_path.py), measured
# before checkpoint offload and MLP tiling existed, so they are compared with both off.
H100_MEASURED = {16384: 10.4, 65536: 35.0, 131072: 68.0}


def check_h100() -> list[dict]:
    """The model against :data:`H100_MEASURED`: [{length, measured_gib, model_gib, error}]."""
    rows = []
    for n, measured in H100_MEASURED.items():
        e = estimate(QWEN15_7B, Setup(length=n))
        rows.append({"length": n, "measured_gib": measured, "model_gib": round(e.peak / GIB, 2), "at": e.at,
                     "error": round(e.peak / GIB / measured - 1, 3)})
    return rows


def table(gpus=(1, 2, 4, 8), gpu_gib: float = 80.0, shape: Shape = QWEN15_7B, **setup) -> list[dict]:
    rows = []
    for g in gpus:
        n, e = longest_context(shape, g, gpu_gib, **setup)
        rows.append({"gpus": g, "longest": n, "tokens_per_gpu": e.tokens, "peak_gib": round(e.peak / GIB, 1),
                     "host_gib_per_gpu": round(e.host / GIB, 1), "at": e.at})
    return rows


def markdown(rows: list[dict], gpu_gib: float) -> str:
    out = [f"| GPUs x {gpu_gib:g} GB | --sequence-parallel | longest sample (model) | tokens per GPU | estimated peak "
           f"per GPU | host memory per GPU |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['gpus']} | {r['gpus']} | {r['longest'] // 1024:,}K ({r['longest']:,}) | "
                   f"{r['tokens_per_gpu']:,} | {r['peak_gib']} GiB | {r['host_gib_per_gpu']} GiB |")
    return "\n".join(out)


def register(sub) -> None:
    p = add_command(sub, "memory-model", help="estimated per-GPU training memory of a 7B LoRA fine-tune",
                    description="Estimated per-GPU training memory (a model, not a measurement) of a 7B Qwen1.5-shape "
                                "LoRA fine-tune on the recipe path (ZeRO-3, parameter and optimizer offload, bf16, "
                                "gradient checkpointing; checkpoint offload and MLP tiling as `auto` chooses them).")
    p.add_argument("--table", action="store_true", help="the longest sample per GPU count (the default output)")
    p.add_argument("--check", action="store_true", help="the model against the H100 measurements")
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4, 8], help="GPU counts (default: 1 2 4 8)")
    p.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU in GiB (default: 80)")
    p.add_argument("--label-share", type=float, default=0.1, help="labelled share of the tokens (default: 0.1)")
    p.add_argument("--json", action="store_true", help="JSON instead of a markdown table")
    p.set_defaults(func=cmd_memory_model)


def cmd_memory_model(a: argparse.Namespace) -> int:
    if a.check:
        rows = check_h100()
        if a.json:
            print(json.dumps(rows))
        else:
            print("| length | measured (H100) | model | error |\n|---|---|---|---|")
            for r in rows:
                print(f"| {r['length'] // 1024}K | {r['measured_gib']} GiB | {r['model_gib']} GiB | "
                      f"{100 * r['error']:+.1f}% |")
        return 0
    rows = table(tuple(a.gpus), a.gpu_gib, label_share=a.label_share)
    print(json.dumps(rows) if a.json else markdown(rows, a.gpu_gib))
    return 0


def run_setup(config, settings, *, length: int, label_share: float, world: int, ds_config: dict | None,
              dtype_bytes: int) -> tuple[Shape, Setup]:
    """(the model's shape, the step's :class:`Setup`) of a finetune run: its model config,
    :class:`~ropescale.training.config.TrainSettings`, the longest sample, the data's labelled share, the process
    count, the DeepSpeed config as written (its ZeRO stage and offload) and the compute dtype's bytes."""
    zo = (ds_config or {}).get("zero_optimization", {}) or {}
    dev = lambda k: (zo.get(k) or {}).get("device", "none") not in (None, "none")  # noqa: E731
    s = Setup(length=int(length), micro_batch=settings.micro_batch, sp=settings.sequence_parallel, world=world,
              zero=int(zo.get("stage", 0)) if ds_config else 0, offload_param=dev("offload_param"),
              offload_optimizer=dev("offload_optimizer"), dtype_bytes=dtype_bytes, lora_r=settings.lora_r,
              lora_targets=tuple(settings.lora_targets), lora_dropout=settings.lora_dropout,
              train_embeddings=settings.train_embeddings, train_norms=settings.train_norms,
              gradient_checkpointing=settings.gradient_checkpointing, head_chunk=settings.head_chunk,
              label_share=label_share)
    return Shape.from_config(config), s


def estimate_run(config, settings, *, length: int, label_share: float, world: int, ds_config: dict | None,
                 dtype_bytes: int, plan=None) -> Estimate:
    """The estimate for a finetune run (:func:`run_setup`) with the activation part of a memory plan
    (:class:`~ropescale.training.memory.install.MemoryPlan`: checkpoint offload, MLP tiling, recompute, blocks)."""
    shape, s = run_setup(config, settings, length=length, label_share=label_share, world=world,
                         ds_config=ds_config, dtype_bytes=dtype_bytes)
    if plan is not None:
        s = replace(s, offload_checkpoints=bool(plan.offload_checkpoints), tile_mlp=int(plan.tile_mlp),
                    recompute_every=int(getattr(plan, "recompute_every", 1)),
                    checkpoint_block=int(getattr(plan, "checkpoint_block", 1)),
                    gpu_checkpoints=int(getattr(plan, "gpu_checkpoints", 0)),
                    tile_attention=int(getattr(plan, "tile_attention", 0)))
    return estimate(shape, s)


TOOL = Tool("python -m ropescale.training.memory.estimate", __doc__, (register,), single=True)
main = TOOL.entry()

if __name__ == "__main__":
    sys.exit(main())

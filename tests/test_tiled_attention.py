"""ropescale.training.memory.tiled_attention on toy Qwen2 / Llama models in fp32: a decoder layer recomputed by sequence
chunks (queries over the full keys, the MLP per chunk) gives the loss and every trained gradient of the plain
gradient-checkpointed path (to 1e-5), alone, with PEFT LoRA, with checkpoints on the host and with blocks of 2;
under no_grad it is the plain forward; the calls it cannot take run the plain checkpoint. Its peak memory in one
layer's backward, measured on CPU (peak RSS, VmHWM), against the memory model's terms."""
from __future__ import annotations

import pytest
import torch

from ropescale.training.loss import label_only_loss
from ropescale.training.memory import install, tiled_attention
from ropescale.training.model import add_lora

TOL = dict(rtol=1e-5, atol=1e-5)
LORA = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj")  # the LoRA target modules of the LoRA cases


def _batch(vocab, B=2, T=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    labels = ids.clone()
    labels[0, :7] = -100
    labels[1, 20:31] = -100
    return ids, labels



def _step(model, ids, labels):
    model.zero_grad(set_to_none=True)
    loss = label_only_loss(model, ids, labels, chunk=16)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _assert_same(a, b):
    (la, ga), (lb, gb) = a, b
    assert torch.allclose(la, lb, **TOL), (la, lb)
    assert ga.keys() == gb.keys() and ga
    for n in ga:
        assert gb[n] is not None and torch.allclose(ga[n], gb[n], **TOL), (n, (ga[n] - gb[n]).abs().max())


@pytest.mark.parametrize("arch,lora,chunk,T", [("qwen2", False, 13, 40), ("llama", True, 7, 48)])
def test_tiled_layer_matches_plain_checkpointing(train_model, arch, lora, chunk, T):
    ids, labels = _batch(1000, T=T)
    ref = _step(train_model(arch, lora=LORA if lora else None), ids, labels)
    model = train_model(arch, lora=LORA if lora else None)
    assert tiled_attention.enable_tiled_attention(model, chunk) == model.config.num_hidden_layers
    before = tiled_attention.STATS["tiled"]
    got = _step(model, ids, labels)
    assert tiled_attention.STATS["tiled"] == before + model.config.num_hidden_layers
    _assert_same(got, ref)
    with torch.no_grad():  # no graph: the layers run plain (transformers checkpoints only with grad)
        assert torch.allclose(model(ids).logits, train_model(arch, lora=LORA if lora else None)(ids).logits, **TOL)


PLANS = {"tiled-host": dict(tile_attention=16, offload_checkpoints=True),
         "tiled-block-2-host": dict(tile_attention=16, checkpoint_block=2, offload_checkpoints=True),
         "tiled-block-2-split": dict(tile_attention=24, checkpoint_block=2, offload_checkpoints=True,
                                     gpu_checkpoints=1)}
_REF: dict = {}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_memory_plans_with_the_tiled_layer_match_plain(train_model, name):
    """Through ``install.setup_memory`` (what finetune runs): the tiled layer alone, with its input on the host, and
    in blocks of 2 (an upper layer's input recomputed from its block's stored one by the chunked forward) give the
    plain path's loss and gradients: a 5-layer PEFT model (dropout 0: the plain path draws its masks whole)."""
    import argparse

    from ropescale.training.memory.plan import Plan

    ids, labels = _batch(1000, seed=4)

    def run(plan):
        pm = train_model("qwen2", lora=LORA, num_layers=5)
        mp = None
        if plan is not None:
            mp = install.setup_memory(pm, argparse.Namespace(), max_len=96, cuda=False, dtype=torch.float32,
                                     page_bytes=512, quiet=True, available=2**40, plan=plan)
        return _step(pm, ids, labels), mp

    if "ref" not in _REF:
        _REF["ref"] = run(None)[0]
    before = tiled_attention.STATS["tiled"]
    got, mp = run(Plan(**PLANS[name]))
    _assert_same(got, _REF["ref"])
    assert tiled_attention.STATS["tiled"] - before == 5
    assert mp.record()["tile_attention"] == PLANS[name]["tile_attention"]
    if name == "tiled-block-2-host":  # stored: layers 0, 2, 4 on the host; 1 and 3 recomputed from 0 and 2
        st = mp.offloader.stats
        assert st["offloaded"] == 3 and st["recomputed"] == 2
    if name == "tiled-host":
        assert mp.offloader.stats["offloaded"] == 5


def test_tiled_layer_gradient_under_dropout_is_the_loss_slope(make_tiny_model):
    """LoRA dropout 0.3: each chunk's recompute replays the forward's masks, so the gradient is the slope of the
    loss the tiled forward computed (a central difference along a random direction, the masks fixed by the seed;
    float64; the losses computed with grad on, where the layers run tiled)."""
    model, _ = make_tiny_model(arch="qwen2", save=False)
    model, _ = add_lora(model, r=4, alpha=8, dropout=0.3, gradient_checkpointing=True,
                        targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    g = torch.Generator().manual_seed(1)
    for n, p in model.named_parameters():
        if "lora_B" in n:  # nonzero: the LoRA branch (and so its dropout masks) reaches the loss
            p.data.copy_(torch.randn(p.shape, generator=g) * 0.1)
    model.double().train()
    tiled_attention.enable_tiled_attention(model, 16)
    ids, labels = _batch(1000, T=48)
    params = [p for p in model.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(2)
    direction = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]

    def loss_at(eps, seed=7):
        saved = [p.detach().clone() for p in params]
        if eps:
            with torch.no_grad():
                for p, d in zip(params, direction):
                    p.add_(d, alpha=eps)
        torch.manual_seed(seed)
        logits = model(ids).logits  # float64 (label_only_loss computes in fp32)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        if eps:
            with torch.no_grad():
                for p, s in zip(params, saved):
                    p.copy_(s)
        return loss

    model.zero_grad(set_to_none=True)
    before = tiled_attention.STATS["tiled"]
    loss_at(0.0).backward()
    assert tiled_attention.STATS["tiled"] == before + 2
    slope = sum((p.grad * d).sum() for p, d in zip(params, direction)).item()
    eps = 1e-4  # the RMSNorms compute in fp32: the difference is good to ~1e-4 (the plain path's too)
    fd = (loss_at(eps).item() - loss_at(-eps).item()) / (2 * eps)
    assert fd == pytest.approx(slope, rel=2e-3), (fd, slope)
    # the masks do matter here: another seed gives another loss
    assert abs(loss_at(0.0, seed=8).item() - loss_at(0.0).item()) > 1e-4


def test_calls_it_cannot_take_run_the_plain_checkpoint(train_model):
    """A padding mask: the plain checkpoint runs (and gives the plain path's numbers); a short call too."""
    ids, labels = _batch(1000, T=40)
    mask = torch.ones_like(ids)
    mask[1, -5:] = 0
    labels[1, -5:] = -100
    ref_model = train_model("qwen2")
    model = train_model("qwen2")
    tiled_attention.enable_tiled_attention(model, 16)
    outs = []
    for m in (ref_model, model):
        m.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(m(ids, attention_mask=mask).logits[:, :-1].flatten(0, 1),
                                                 labels[:, 1:].flatten(), ignore_index=-100)
        loss.backward()
        outs.append((loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    assert tiled_attention.STATS["why"] == "an attention mask (padding or documents)"
    _assert_same(outs[1], outs[0])
    with pytest.raises(Exception, match="--tile-attention"):
        tiled_attention.enable_tiled_attention(model, 0)


MEASURE = r"""
import ctypes, functools, json, sys, time
ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD fixed at 64 KiB: a freed tensor leaves the RSS
import torch
from torch.utils.checkpoint import checkpoint
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding
from ropescale.training.memory import tiled_attention as ta

h, f, heads, T, C = (int(v) for v in sys.argv[1:6])
def status(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))
torch.manual_seed(0)
cfg = Qwen2Config(hidden_size=h, intermediate_size=f, num_attention_heads=heads, num_key_value_heads=heads,
                  num_hidden_layers=1, vocab_size=64)
cfg._attn_implementation = "sdpa"
layer = Qwen2DecoderLayer(cfg, 0).train()
x0 = torch.randn(1, T, h)
cos, sin = Qwen2RotaryEmbedding(cfg)(x0, torch.arange(T)[None])
out = {}
for mode in ("plain", "tiled"):
    x = x0.clone().requires_grad_()
    if mode == "plain":  # torch's checkpoint of the whole layer: what a recomputed layer does without tiling
        y = checkpoint(functools.partial(layer.forward, position_embeddings=(cos, sin), attention_mask=None), x,
                       use_reentrant=False)
    else:
        y = ta.TiledLayer.apply(ta.LayerParts(layer, cos, sin, C), None, x, *layer.parameters())
    g = torch.randn_like(y)
    base = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")  # the peak RSS (VmHWM) starts again from here
    y.backward(g)
    out[mode] = status("VmHWM") - base
    del x, y, g
    layer.zero_grad(set_to_none=True)
print(json.dumps(out))
"""


def test_tiled_layer_peak_memory_on_cpu_against_the_model():
    """One Qwen2 decoder layer (hidden 256, MHA 4 x 64, intermediate 512, fp32) at 4,096 tokens in 256-token
    chunks: the peak RSS its backward adds (VmHWM after a reset, in a process of its own) against the memory
    model's activations for one recomputed layer, tiled (the whole sequence's keys, values, their gradients and
    the residual gradients + one chunk's working set) and plain (every activation for the whole sequence)."""
    import json
    import subprocess
    import sys
    from dataclasses import replace

    from ropescale.common.forward_memory import Shape
    from ropescale.training.memory.estimate import Setup, layer_bytes_per_token, tiled_layer_bytes

    h, f, heads, T, C = 256, 512, 4, 4096, 256
    r = subprocess.run([sys.executable, "-c", MEASURE, *map(str, (h, f, heads, T, C))], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    shape = Shape(layers=1, hidden=h, heads=heads, kv_heads=heads, intermediate=f, vocab=64)
    s = Setup(length=T, zero=0, dtype_bytes=4, lora_dropout=0.0, tile_attention=C)
    per, const = tiled_layer_bytes(shape, s)
    # by hand: keys + values 2 x 256 x 4 B, their fp32 gradients as much, a chunk's share as much, the residual
    # gradients 2 x 256 x 4: 8,192 B a token; the plain layer 36h + 16f + 8f + 8h = 23,552 B a token
    assert sum(per.values()) == 8192 and sum(layer_bytes_per_token(shape, replace(s, tile_attention=0)).values()) \
        == 23552 and const == C * 23552
    model_tiled, model_plain = T * 8192 + const, T * 23552
    ratio_tiled, ratio_plain = got["tiled"] / model_tiled, got["plain"] / model_plain
    print(f"peak RSS added by one layer's backward at {T:,} tokens: tiled {got['tiled'] / 2**20:.1f} MiB (model "
          f"{model_tiled / 2**20:.1f}, measured / model {ratio_tiled:.3f}), plain {got['plain'] / 2**20:.1f} MiB "
          f"(model {model_plain / 2**20:.1f}, {ratio_plain:.3f})")
    assert 0.85 <= ratio_tiled <= 1.15 and 0.8 <= ratio_plain <= 1.2
    assert got["tiled"] < 0.5 * got["plain"]

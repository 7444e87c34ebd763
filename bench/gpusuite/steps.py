"""The GPU suite's own steps (``gpu_suite.py --_step env|prepare``): the environment with the attention kernels
and a bf16 smoke check of the memory paths, and the random model written once.

Part of ``bench/gpu_suite.py`` (see its doc).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .plan import ROOT, model_shape
from .runner import ENV_UNUSABLE, has_module


def run_env_step(dry: bool) -> int:
    """``env``: the environment and the bf16 smoke check; prints one JSON line (see module doc)."""
    from ropescale.common.process import ALLOC_CONF_VARS, prepare_process

    prepare_process()
    import importlib.metadata as md

    import torch

    cuda = torch.cuda.is_available()
    res = {"cuda": torch.version.cuda, "cuda_available": cuda, "python": sys.version.split()[0],
           "versions": {}, "alloc_conf": next((f"{k}={os.environ[k]}" for k in ALLOC_CONF_VARS if k in os.environ),
                                              None), "cpus": os.cpu_count()}
    for name in ("torch", "transformers", "peft", "accelerate", "deepspeed", "datasets", "flash-attn"):
        try:
            res["versions"][name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    res["flash_attn"] = _flash_attn()
    from ropescale.common.host import available_host_bytes

    res["host_available_gib"] = round(available_host_bytes() / 2**30, 1)
    res["host_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    if cuda:
        p = torch.cuda.get_device_properties(0)
        res.update(device=p.name, gpu_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}")
    else:
        res["device"] = "cpu"
    if not cuda and not dry:
        res["error"] = (f"torch {torch.__version__} sees no CUDA GPU (a CPU build?): use the machine's own CUDA torch "
                        f"(ROPESCALE_SYSTEM_TORCH=1 make setup)")
        print(json.dumps(res), flush=True)
        print(f"error: {res['error']}", file=sys.stderr)
        return ENV_UNUSABLE
    if cuda:  # the SDPA kernels (and FlashAttention-2 where importable) on the 7B attention shape at 16K
        from ropescale.training.attn_pick import measure

        res["attention_ms"] = measure(heads=32, head_dim=128, tokens=16384, flash_attn=res["flash_attn"] is not None)
    res["smoke"] = smoke(torch.device("cuda" if cuda else "cpu"))
    print(json.dumps(res), flush=True)
    if not res["smoke"]["ok"]:
        print(f"error: smoke check: the memory paths' loss {res['smoke']['paths_loss']} / gradient cosine "
              f"{res['smoke']['grad_cosine']} differ from the plain path's loss {res['smoke']['plain_loss']}",
              file=sys.stderr)
        return 1
    return 0


def _flash_attn() -> str | None:
    if not has_module("flash_attn"):
        return None
    try:
        import flash_attn

        return getattr(flash_attn, "__version__", "found")
    except Exception as e:  # found but broken (built for another torch): say so
        return f"found but fails to import ({type(e).__name__})"


SMOKE_TOL = {"loss": 5e-3, "cosine": 0.99}  # bf16: the paths' kernels round differently, nothing more


SMOKE_VARIANTS = {  # the memory paths checked against the plain path, each on a fresh copy of the model
    "recipe": dict(offload_checkpoints=True, tile=True),  # every checkpoint to the host, tiled MLP
    "blocks": dict(checkpoint_block=2, offload_checkpoints=True, gpu_checkpoints=1, tile=True),  # + blocks, split
    "selective": dict(recompute_every=2),  # every other layer's activations kept from forward
    # each layer recomputed by sequence chunks (queries over all keys), blocks of 2, checkpoints split
    "tiled": dict(checkpoint_block=2, offload_checkpoints=True, gpu_checkpoints=1, tile_attention=True),
}


def smoke(device) -> dict:
    """The memory paths (``ropescale.training.memory.install.setup_memory`` + ``loss.label_only_loss``, what finetune.py
    runs: checkpoints offloaded to host memory, blocks of 2 layers with one stored input, checkpoints split between
    device and host, every other layer recomputed, the MLP tiled over sequence chunks, the label-only LM head in
    chunks) against the plain path (gradient checkpointing, the model's own full-logits loss) on a small Qwen2 shape
    in bf16: the loss and the gradients' cosine of each (:data:`SMOKE_VARIANTS`); the top-level figures are the
    first's."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from ropescale.training.loss import label_only_loss
    from ropescale.training.memory.estimate import Activations
    from ropescale.training.memory.install import setup_memory

    cuda = device.type == "cuda"
    tokens = 1024 if cuda else 64
    cfg = Qwen2Config(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=4096, max_position_embeddings=4096, tie_word_embeddings=False,
                      use_cache=False)

    def fresh():
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").to(device)
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.train()
        return m

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (1, tokens), generator=g).to(device)
    labels = ids.clone()
    labels[:, : tokens // 2] = -100  # the second half labelled, as a summary after its context

    def grads(model):
        return torch.cat([p.grad.double().flatten() for p in model.parameters() if p.grad is not None])

    model = fresh()
    plain = model(input_ids=ids, labels=labels).loss
    plain.backward()
    g_plain, a = grads(model), plain.item()
    out, ok = {}, True
    for name, v in SMOKE_VARIANTS.items():
        model = fresh()
        acts = Activations(recompute_every=v.get("recompute_every", 1), checkpoint_block=v.get("checkpoint_block", 1),
                           offload_checkpoints=v.get("offload_checkpoints", False),
                           gpu_checkpoints=v.get("gpu_checkpoints", 0), tile_mlp=tokens // 8 if v.get("tile") else 0,
                           tile_attention=tokens // 8 if v.get("tile_attention") else 0)
        try:
            plan_ = setup_memory(model, argparse.Namespace(), max_len=tokens, cuda=cuda, dtype=torch.bfloat16,
                                 quiet=True, plan=acts)
            loss = label_only_loss(model, ids, labels, chunk=tokens // 8)
            loss.backward()
        except Exception as e:  # a path that fails on this device is a failed check, not a crashed step
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}", "ok": False}
            ok = False
            continue
        cos = float(torch.nn.functional.cosine_similarity(g_plain, grads(model), dim=0))
        b = loss.item()
        good = abs(a - b) <= SMOKE_TOL["loss"] and cos >= SMOKE_TOL["cosine"]
        ok = ok and good
        out[name] = {"paths_loss": round(b, 5), "abs_diff": round(abs(a - b), 6), "grad_cosine": round(cos, 6),
                     "memory_plan": plan_.record(), "ok": good}
    first = out[next(iter(SMOKE_VARIANTS))]
    if "paths_loss" not in first:
        first = {"paths_loss": None, "abs_diff": None, "memory_plan": None}
    return {"tokens": tokens, "dtype": "bfloat16", "plain_loss": round(a, 5), "paths_loss": first["paths_loss"],
            "abs_diff": first["abs_diff"], "grad_cosine": min((v["grad_cosine"] for v in out.values()
                                                               if "grad_cosine" in v), default=None),
            "memory_plan": first["memory_plan"], "variants": out, "ok": ok, "tolerance": SMOKE_TOL}


def run_prepare_step(workdir: Path, dry: bool) -> int:
    """``prepare``: the random model in DIR/train (bench_train_path's writer) and, on CUDA, DeepSpeed's CPU Adam
    op (JIT-built on first use: minutes on a fresh machine); prints one JSON line."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train_path", ROOT / "bench" / "bench_train_path.py")
    btp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(btp)
    t0 = time.time()
    out = btp.write_model(model_shape(dry), workdir / "train" / f"model-{model_shape(dry)}")
    res = {"path": str(out), "params": json.loads((out / "bench_model.json").read_text())["params"],
           "seconds": round(time.time() - t0, 1)}
    import torch

    if torch.cuda.is_available() and not dry:
        t1 = time.time()
        from deepspeed.ops.op_builder import CPUAdamBuilder

        CPUAdamBuilder().load()
        res["cpu_adam"] = f"built in {time.time() - t1:.0f} s"
    print(json.dumps(res), flush=True)
    return 0



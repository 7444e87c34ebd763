"""GPU benchmark: one fine-tuning training step of a 7B-shaped model at 16K / 32K tokens, on one GPU.

The model is Qwen1.5-7B-shaped (hidden 4096, 32 layers, 32 heads, intermediate 11008, vocab 151,936, q/k/v
bias) with random weights created directly in bf16 on the GPU (no fp32 copy, nothing read from disk). The
training set-up is finetune.py's own code (``ropescale.training.model.add_lora``, ``ropescale.training.loss``,
``ropescale.training.trainer.LabelOnlyTrainer``): LoRA r=8 on q,k,v,o + embeddings + every norm trainable (fp32 master
copies of the trained tensors, bf16 autocast), SDPA (FlashAttention-2 when installed), gradient checkpointing,
the label-only LM head, and finetune.py's memory settings for long samples (``ropescale.training.memory``:
``--offload-checkpoints`` / ``--tile-mlp``, by default on from 64K tokens on CUDA). Each sample is one packed
sequence whose labels cover ``--label-share`` of it (the summaries), batch 1 per step.

Each (variant, length) runs in a fresh process: a few warm-up steps, then timed steps; it prints tokens/s and
``torch.cuda.max_memory_allocated``. ``--baseline`` also runs the plain HF Trainer + PEFT loop (default
compute_loss: the model's full-logits loss) on the same model and data, in the same run; an out-of-memory
step is reported as OOM. ``--in-process`` runs the variants one after the other in this process instead (the same
code, one process start fewer each: for a CPU rehearsal, where there is no peak GPU memory to keep apart).

    python bench/gpu_train_step.py --seq 16384 32768 --baseline          # on the GPU
    python bench/gpu_train_step.py --toy                                 # CPU, toy shape (for testing)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from ropescale.common.process import prepare_process  # noqa: E402
from ropescale.training.memory.estimate import QWEN15_7B, QWEN15_7B_ROPE  # noqa: E402

prepare_process()  # as every entry point: the CUDA allocator setting, quiet libraries

SHAPE_7B = QWEN15_7B.hf_kwargs()  # Qwen1.5-7B (ropescale.training.memory.estimate)
SHAPE_TOY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=172, vocab_size=151936)


def make_config(shape: dict, max_len: int):
    from transformers import AutoConfig

    orig = QWEN15_7B_ROPE["max_position_embeddings"]
    cfg = AutoConfig.for_model("qwen2", **shape, max_position_embeddings=max(orig, max_len),
                               rope_theta=QWEN15_7B_ROPE["rope_theta"],
                               tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
                               eos_token_id=151643, pad_token_id=151643, bos_token_id=None)
    cfg.use_cache = False
    return cfg


def make_model(cfg, device, dtype, attn: str):
    """Random weights created in ``dtype`` directly on ``device`` (no fp32 init, no disk)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)
    finally:
        torch.set_default_dtype(prev)
    model.config.use_cache = False
    return model


def make_rows(seq: int, n: int, vocab: int, label_share: float, pairs: int = 6) -> list[dict]:
    """``n`` packed-like samples of ``seq`` tokens: ``pairs`` segments, each ending in a labelled summary."""
    import random

    rng = random.Random(0)
    rows = []
    seg = seq // pairs
    lab_len = max(1, int(seg * label_share))
    for _ in range(n):
        ids = [rng.randrange(vocab) for _ in range(seq)]
        labels = [-100] * seq
        for p in range(pairs):
            end = (p + 1) * seg if p < pairs - 1 else seq
            for t in range(end - lab_len, end):
                labels[t] = ids[t]
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def one(variant: str, seq: int, warmup: int, steps: int, toy: bool, label_share: float, attn_arg: str,
        bf16: bool = False, offload: str = "auto", tile: str = "auto") -> dict:
    """Run ``warmup + steps`` optimizer steps of ``variant`` (ours | baseline) in this process."""
    import torch

    from ropescale.training.model import param_counts, resolve_attn

    cuda = torch.cuda.is_available() and not toy
    mixed = cuda or bf16  # bf16 weights + autocast, fp32 trained tensors (the GPU path; on CPU only to test it)
    dtype = torch.bfloat16 if mixed else torch.float32
    attn = resolve_attn(attn_arg, cuda)
    cfg = make_config(SHAPE_TOY if toy else SHAPE_7B, seq)
    t0 = time.time()
    pm, plan = build_peft(variant, cfg, "cuda" if cuda else "cpu", dtype, attn, mixed, seq, offload, tile)
    trainable, total = param_counts(pm)
    build_s = time.time() - t0
    rows = make_rows(seq, warmup + steps, cfg.vocab_size, label_share)
    res = {"variant": variant, "seq": seq, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
           "attn": attn, "dtype": str(dtype).replace("torch.", ""), "trainable_params": trainable,
           "total_params": total, "build_seconds": round(build_s, 1), "warmup_steps": warmup, "timed_steps": steps}
    times, tr, t_start, oom = timed_training(variant, pm, rows, warmup + steps, cuda, mixed)
    if oom is not None:
        res.update({"oom": True, "error": str(oom).splitlines()[0][:200], "steps_done": len(times)})
    else:
        first = times[warmup - 1] if warmup > 0 else t_start
        dt = times[-1] - first
        res.update({"oom": False, "seconds_timed": round(dt, 3), "seconds_per_step": round(dt / steps, 3),
                    "tokens_per_s": round(seq * steps / dt, 1),
                    "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                    "final_loss": round(float(tr.state.log_history[-1].get("train_loss", float("nan"))), 4)
                    if tr.state.log_history else None})
    if plan is not None:
        res["memory_plan"] = plan.record()
    if oom is not None and cuda:
        res["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return res


def build_peft(variant: str, cfg, device: str, dtype, attn: str, mixed: bool, seq: int, offload: str, tile: str):
    """(the LoRA model as finetune.py builds it, ours' memory plan or None): seeded weights, LoRA with gradient
    checkpointing, fp32 trained tensors under mixed precision, and for ours finetune.py's memory settings."""
    from transformers import set_seed

    from ropescale.training.memory.install import setup_memory
    from ropescale.training.model import add_lora, fp32_master

    set_seed(0)
    model = make_model(cfg, device, dtype, attn)
    pm, _ = add_lora(model, r=8, alpha=16, dropout=0.05, gradient_checkpointing=True)
    if mixed:
        fp32_master(pm, dtype)  # as finetune.py without DeepSpeed: fp32 trained tensors, bf16 autocast forward
    plan = None
    if variant == "ours":  # finetune.py's memory settings (ropescale.training.memory): auto = from 64K tokens on CUDA
        ns = argparse.Namespace(offload_checkpoints=offload, tile_mlp=None if tile == "auto" else int(tile),
                                gradient_checkpointing=True, micro_batch=1)
        plan = setup_memory(pm, ns, max_len=seq, cuda=device == "cuda", dtype=dtype)
    return pm, plan


def timed_training(variant: str, pm, rows, max_steps: int, cuda: bool, mixed: bool):
    """(the end time of each step, the trainer, the start time, the out-of-memory error or None): ours is the
    label-only Trainer, the baseline HF's plain Trainer."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from ropescale.training.data import Collator, PackedDataset
    from ropescale.training.loss import install_label_only_forward
    from ropescale.training.trainer import LabelOnlyTrainer

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(output_dir=tmp, max_steps=max_steps, per_device_train_batch_size=1,
                                  gradient_accumulation_steps=1, learning_rate=2e-5, warmup_steps=0,
                                  lr_scheduler_type="constant", bf16=mixed, use_cpu=not cuda, report_to=[],
                                  save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                  remove_unused_columns=False, seed=0, data_seed=0, optim="adamw_torch_fused"
                                  if cuda else "adamw_torch", gradient_checkpointing=False)
        ds = PackedDataset(rows)
        if variant == "ours":
            install_label_only_forward(pm)
            tr = LabelOnlyTrainer(model=pm, args=targs, train_dataset=ds, data_collator=Collator(0))
        else:
            tr = Trainer(model=pm, args=targs, train_dataset=ds, data_collator=Collator(0))
        tr.add_callback(Clock())
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t_start = time.perf_counter()
        try:
            tr.train()
        except torch.OutOfMemoryError as e:
            return times, tr, t_start, e
    return times, tr, t_start, None


def run_sub(variant: str, seq: int, a) -> dict:
    cmd = [sys.executable, __file__, "--_one", variant, "--seq", str(seq), "--warmup", str(a.warmup), "--steps",
           str(a.steps), "--label-share", str(a.label_share), "--attn", a.attn, "--offload-checkpoints",
           a.offload_checkpoints, "--tile-mlp", a.tile_mlp] + (["--toy"] if a.toy else []) + \
        (["--bf16"] if a.bf16 else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = p.stderr.strip().splitlines()[-3:]
        oom = any("out of memory" in x.lower() for x in p.stderr.splitlines()[-50:])
        return {"variant": variant, "seq": seq, "oom": oom, "error": " | ".join(tail)[-400:]}
    return json.loads(lines[-1])


def run_here(variant: str, seq: int, a) -> dict:
    """What :func:`run_sub` gives, run in this process (``--in-process``): an error is a result, as there."""
    import traceback

    try:
        return one(variant, seq, a.warmup, a.steps, a.toy, a.label_share, a.attn, a.bf16, a.offload_checkpoints,
                   a.tile_mlp)
    except Exception as e:  # reported as run_sub reports a failed child
        traceback.print_exc()
        return {"variant": variant, "seq": seq, "oom": "out of memory" in str(e).lower(),
                "error": f"{type(e).__name__}: {e}"[-400:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, nargs="+", default=None,
                    help="sequence lengths (default 16384 32768; --toy: 512)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (default %(default)s)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (default %(default)s)")
    ap.add_argument("--baseline", action="store_true",
                    help="also run the plain HF Trainer + PEFT loop (full-logits loss) for comparison")
    ap.add_argument("--attn", default="auto", help="auto (flash_attention_2 if installed, else sdpa), sdpa, eager")
    ap.add_argument("--label-share", type=float, default=0.1,
                    help="share of each sample with labels (the summaries), default %(default)s")
    ap.add_argument("--toy", action="store_true", help="toy shape on CPU (hidden 64, 2 layers) to test the script")
    ap.add_argument("--bf16", action="store_true", help="with --toy: the GPU's mixed-precision path on CPU")
    ap.add_argument("--offload-checkpoints", default="auto",
                    help="ours: checkpoints in pinned host memory (ropescale.training.memory): auto (on CUDA from "
                         "65536 tokens), true, false")
    ap.add_argument("--tile-mlp", default="auto", help="ours: MLP over chunks of N tokens: auto (the hidden size on "
                                                       "CUDA from 65536 tokens), N, 0 = off")
    ap.add_argument("--in-process", action="store_true",
                    help="run the variants one after the other in this process, not each in a fresh one (CPU "
                         "rehearsals: peak GPU memory would mix)")
    ap.add_argument("--json", action="store_true", help="print one JSON object with every result")
    ap.add_argument("--_one", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._one:
        seq = a.seq[0] if a.seq else 512
        print(json.dumps(one(a._one, seq, a.warmup, a.steps, a.toy, a.label_share, a.attn, a.bf16,
                             a.offload_checkpoints, a.tile_mlp)), flush=True)
        return 0
    seqs = a.seq or ([512] if a.toy else [16384, 32768])
    variants = ["ours"] + (["baseline"] if a.baseline else [])
    results = []
    for seq in seqs:
        for v in variants:
            r = run_here(v, seq, a) if a.in_process else run_sub(v, seq, a)
            results.append(r)
            if r.get("oom"):
                msg = f"OOM (peak {r.get('peak_mem_gib', '?')} GiB)"
            elif "error" in r:
                msg = f"FAILED: {r['error']}"
            else:
                msg = (f"{r['tokens_per_s']:>9,.0f} tok/s  {r['seconds_per_step']:.2f} s/step  peak "
                       f"{r['peak_mem_gib'] if r['peak_mem_gib'] is not None else '-'} GiB  ({r['device']}, "
                       f"{r['attn']}, {r['dtype']}, trainable {r['trainable_params']:,} of {r['total_params']:,})")
                plan = r.get("memory_plan")
                if plan and (plan.get("offload_checkpoints") or plan.get("tile_mlp")):
                    msg += (f"  [offload {'on' if plan.get('offload_checkpoints') else 'off'}, tile "
                            f"{plan.get('tile_mlp', 0)}]")
            name = "ours (label-only head)" if v == "ours" else "plain HF Trainer + PEFT"
            print(f"seq {seq:>6}  {name:<24} {msg}", flush=True)
    for seq in seqs:
        by = {r["variant"]: r for r in results if r["seq"] == seq}
        if "baseline" in by and "tokens_per_s" in by.get("ours", {}) and "tokens_per_s" in by["baseline"]:
            line = (f"seq {seq:>6}  speed ratio ours / plain HF+PEFT: "
                    f"{by['ours']['tokens_per_s'] / by['baseline']['tokens_per_s']:.2f}x")
            if by["ours"].get("peak_mem_gib") and by["baseline"].get("peak_mem_gib"):
                line += f"; peak memory ratio {by['ours']['peak_mem_gib'] / by['baseline']['peak_mem_gib']:.2f}"
            print(line)
    if a.json:
        print(json.dumps({"results": results}))
    return 0 if all("error" not in r or r.get("oom") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark (CPU): the fine-tuning step of finetune.py against the usual way, in one run.

Model: a tiny Qwen2-shaped model (hidden 64, 2 layers) with the real ~150K-token Qwen2 vocabulary, random
weights; LoRA r=8 on q,k,v,o + embeddings + norms trainable, gradient checkpointing, fp32. Data: real pairs
from the shared novels (Qwen2 tokens), packed with data_concat into samples of about ``--seq`` tokens (loss on
the summaries only, as in training).

1. Peak memory of one training step (forward + backward + AdamW step), each variant in a fresh process:
   ours (the label-only head, ``ropescale.training.loss``) vs the naive full-logits loss (``model(labels=...).loss``).
   Memory = peak RSS during the step minus RSS before it. Goal: ratio <= 0.5.
2. Training throughput (tokens/s after a warm-up step) of ``finetune``'s trainer (``ropescale.training.trainer``) vs a
   plain HF Trainer + PEFT loop (default compute_loss: full logits) on the same model and data. Goal: >= 1.0.

    .venv/bin/python bench/bench_finetune.py [--seq 2048] [--steps 4] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from ropescale.common.process import prepare_process  # noqa: E402

prepare_process()  # as every entry point: the CUDA allocator setting, quiet libraries

from ropescale.common.process import setup_env  # noqa: E402

setup_env()


def build_data(out: Path, seq: int, n_samples: int) -> Path:
    from data_concat import pack
    from data_concat.pairs import build_pairs
    from data_concat.tokenizer import load_tokenizer
    from ropescale.common.chapters import read_chapters
    from ropescale.common.io import write_jsonl_atomic
    from ropescale.common.paths import CHAPTERS_JSONL, QWEN2_TOKENIZER

    tok = load_tokenizer(QWEN2_TOKENIZER)
    chapters = [c for c in read_chapters(CHAPTERS_JSONL) if c.book == "hongloumeng"][:40]
    pairs, _ = build_pairs(chapters, tok, seq // 8, seq // 4, split="all", max_pairs=n_samples * 8)
    p = out / "pairs.jsonl"
    write_jsonl_atomic(p, pairs)
    pack(p, QWEN2_TOKENIZER, out / "packed", target=seq, prompt="mix", seed=0, on_bad="skip")  # seq x 7/8 .. 9/8
    return out / "packed"


def build_model(model_dir: Path) -> Path:
    from transformers import AutoTokenizer

    from ropescale.common.paths import QWEN2_TOKENIZER
    from ropescale.tiny.build import random_model, tiny_config

    tok = AutoTokenizer.from_pretrained(str(QWEN2_TOKENIZER))
    cfg = tiny_config(len(tok), "qwen2", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=128, orig_ctx=32768, eos_token_id=tok.eos_token_id)
    random_model(cfg, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return model_dir


def _setup(model_dir: str):
    import torch
    from transformers import AutoModelForCausalLM, set_seed

    from ropescale.training.model import add_lora

    set_seed(0)
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    m.config.use_cache = False
    pm, _ = add_lora(m, r=8, alpha=16, dropout=0.05)
    return pm


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def one_memory(model_dir: str, data: str, variant: str) -> dict:
    """One training step of ``variant`` in this (fresh) process; peak RSS above the pre-step RSS."""
    import resource

    import torch

    from data_concat import load_packed
    from ropescale.training.loss import install_label_only_forward

    row = max(load_packed(data), key=lambda r: r["length"])
    ids = torch.tensor([row["input_ids"]])
    labels = torch.tensor([row["labels"]])
    pm = _setup(model_dir)
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-4)
    if variant == "ours":
        install_label_only_forward(pm)
    pm.train()
    before = rss_mb()
    if variant == "ours":
        out = pm(input_ids=ids, labels=labels)
        loss = out["loss_sum"] / out["n_tokens"]
    else:
        loss = pm(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"variant": variant, "tokens": int(ids.numel()), "loss": float(loss), "step_peak_mb": peak - before}


def throughput(model_dir: str, data: str, variant: str, steps: int) -> dict:
    """tokens/s of ``steps`` optimizer steps (batch 1) after one warm-up step, through an HF Trainer."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from data_concat import load_packed
    from ropescale.training.data import Collator, PackedDataset
    from ropescale.training.loss import install_label_only_forward
    from ropescale.training.trainer import LabelOnlyTrainer

    rows = load_packed(data)[: steps + 1]
    pm = _setup(model_dir)
    times, lengths = [], []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter())

    class Counting(Collator):  # batch 1, no accumulation: batch i is step i
        def __call__(self, batch):
            lengths.append(sum(len(b["input_ids"]) for b in batch))
            return super().__call__(batch)

    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(output_dir=tmp, max_steps=steps + 1, per_device_train_batch_size=1,
                                  learning_rate=1e-4, warmup_steps=0, use_cpu=True, report_to=[],
                                  save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                  remove_unused_columns=False, seed=0, data_seed=0)
        ds = PackedDataset(rows)
        if variant == "ours":
            install_label_only_forward(pm)
            tr = LabelOnlyTrainer(model=pm, args=targs, train_dataset=ds, data_collator=Counting(0))
        else:  # the plain HF Trainer + PEFT loop: default compute_loss, the model's full-logits loss
            tr = Trainer(model=pm, args=targs, train_dataset=ds, data_collator=Counting(0))
        tr.add_callback(Clock())
        tr.train()
    dt = times[-1] - times[0]  # steps 2..steps+1 (the first is the warm-up)
    toks = sum(lengths[1:steps + 1])
    return {"variant": variant, "steps_timed": steps, "seconds": dt, "tokens": toks, "tokens_per_s": toks / dt}


def sub(mode: str, *args) -> dict:
    cmd = [sys.executable, __file__, "--_one", mode, *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit(f"{mode} {args} failed")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=2048, help="packed sample length (tokens), default %(default)s")
    ap.add_argument("--steps", type=int, default=4, help="timed training steps per variant, default %(default)s")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--_one", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._one:
        mode, *rest = a._one
        res = one_memory(*rest) if mode == "memory" else throughput(rest[0], rest[1], rest[2], int(rest[3]))
        print(json.dumps(res))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.time()
        model_dir = build_model(tmp / "model")
        data = build_data(tmp, a.seq, a.steps + 2)
        print(f"model: Qwen2-shaped, hidden 64, 2 layers, vocab 151,665 (~150K); data: {data} "
              f"({time.time() - t0:.0f}s to build)", file=sys.stderr)
        mem = {v: sub("memory", model_dir, data, v) for v in ("naive", "ours")}
        thr = {v: sub("throughput", model_dir, data, v, a.steps) for v in ("hf_trainer_peft", "ours")}
    res = {
        "seq_tokens": mem["ours"]["tokens"],
        "memory_mb": {k: round(v["step_peak_mb"], 1) for k, v in mem.items()},
        "memory_ratio": round(mem["ours"]["step_peak_mb"] / mem["naive"]["step_peak_mb"], 3),
        "loss_equal": abs(mem["ours"]["loss"] - mem["naive"]["loss"]) < 1e-4,
        "tokens_per_s": {k: round(v["tokens_per_s"], 1) for k, v in thr.items()},
        "speed_ratio": round(thr["ours"]["tokens_per_s"] / thr["hf_trainer_peft"]["tokens_per_s"], 2),
    }
    if a.json:
        print(json.dumps(res))
    else:
        print(f"one training step at {res['seq_tokens']} tokens, ~150K vocab: peak memory ours "
              f"{res['memory_mb']['ours']:.0f} MB vs naive full-logits loss {res['memory_mb']['naive']:.0f} MB "
              f"-> ratio {res['memory_ratio']:.3f} (goal <= 0.5); same loss: {res['loss_equal']}")
        print(f"training throughput: ours {res['tokens_per_s']['ours']:.0f} tok/s vs plain HF Trainer + PEFT "
              f"{res['tokens_per_s']['hf_trainer_peft']:.0f} tok/s -> ratio {res['speed_ratio']:.2f} "
              f"(goal >= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The HF Trainer with the label-only loss, progress lines (loss, tokens/s, peak memory) and exports at saves."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback

from .saving import export


def peak_memory_mb() -> float:
    """Peak memory of this process: CUDA allocator peak on GPU, max RSS on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class LabelOnlyTrainer(Trainer):
    """compute_loss: the model's forward is :func:`training.loss.label_only_forward` (sum of CE over labelled
    positions + count); the sum is normalised by the number of labelled tokens of the whole optimizer step
    (``num_items_in_batch``: all micro-batches and ranks), i.e. the token mean over the global batch."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.model_accepts_loss_kwargs = True  # we normalise by num_items_in_batch ourselves
        self.tokens_seen = 0
        self.label_tokens_seen = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(input_ids=inputs["input_ids"], labels=inputs["labels"],
                    attention_mask=inputs.get("attention_mask"))
        self.tokens_seen += int(inputs["input_ids"].numel()) if "attention_mask" not in inputs else \
            int(inputs["attention_mask"].sum())
        self.label_tokens_seen += int(out["n_tokens"])
        if num_items_in_batch is None:
            loss = out["loss_sum"] / out["n_tokens"].clamp(min=1)
        else:
            loss = out["loss_sum"] / num_items_in_batch
            if self.args.average_tokens_across_devices and self.accelerator.num_processes > 1:
                loss = loss * self.accelerator.num_processes
        return (loss, out) if return_outputs else loss


class ProgressCallback(TrainerCallback):
    """One line per logging step on stderr (rank 0): step, loss, lr, tokens/s, peak memory; also appended to
    RUN/train_log.jsonl."""

    def __init__(self, trainer_ref, log_path: Path | None, is_main: bool, world: int):
        self.trainer_ref = trainer_ref
        self.log_path = log_path
        self.is_main = is_main
        self.world = world
        self.t0 = None
        self.tok0 = 0
        self.bar = None

    def on_train_begin(self, args, state, control, **kw):
        self.t0 = time.time()
        self.tok0 = self.trainer_ref().tokens_seen
        if self.is_main:
            from tqdm import tqdm

            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="finetune", unit="step",
                            file=sys.stderr, dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kw):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_train_end(self, args, state, control, **kw):
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def on_log(self, args, state, control, logs=None, **kw):
        if not logs or "loss" not in logs:
            return
        tr = self.trainer_ref()
        dt = max(time.time() - self.t0, 1e-9)
        tps = (tr.tokens_seen - self.tok0) * self.world / dt
        rec = {"step": state.global_step, "loss": round(float(logs["loss"]), 5),
               "lr": float(logs.get("learning_rate", 0.0)), "tokens_per_s": round(tps, 1),
               "peak_mem_mb": round(peak_memory_mb(), 1), "seconds": round(dt, 2)}
        if "grad_norm" in logs:
            rec["grad_norm"] = round(float(logs["grad_norm"]), 5)
        if self.is_main:
            line = (f"step {rec['step']}/{state.max_steps}  loss {rec['loss']:.4f}  lr {rec['lr']:.2e}  "
                    f"{rec['tokens_per_s']:.0f} tok/s  peak mem {rec['peak_mem_mb']:.0f} MB")
            if self.bar is not None:
                self.bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr, flush=True)
            if self.log_path is not None:
                with open(self.log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
                    f.flush()


class ExportCallback(TrainerCallback):
    """After each checkpoint: write the export (adapter + trained tensors + config) into checkpoint-N/export."""

    def __init__(self, trainer_ref, export_kw: dict, is_main: bool):
        self.trainer_ref = trainer_ref
        self.export_kw = export_kw
        self.is_main = is_main

    def on_save(self, args, state, control, **kw):
        tr = self.trainer_ref()
        d = Path(args.output_dir) / f"checkpoint-{state.global_step}" / "export"
        export(tr.model, d, step=state.global_step, is_main=self.is_main, **self.export_kw)

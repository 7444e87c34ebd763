"""One full-length fine-tune of SmolLM2-135M, a GPU suite step (``smollm2-METHOD-xS``): LoRA with RoPE scaling
METHOD at xS on packed windows of S x 8,192 tokens of Austen's three training novels (Pride and Prejudice, Sense
and Sensibility, Mansfield Park: the real-model table's held-out three are never trained on), merged, then read on
the real-model windows (experiments/real_model.yaml's held-out novels with planted passkeys,
``ropescale.probes.passkey.novel_windows``) beside the same method training-free on the base model: passkeys
retrieved per length, answer loss, loss inside the original window and past it. Prints one JSON line (stdout);
progress on stderr.

    python bench/gpusuite/smollm2.py --method yarn --scale 2 --workdir DIR [--dry-run]

``--dry-run`` (CPU): the same code on 256 x S-token samples and windows, 1 optimizer step, 1 window, fp32: the path,
not a measurement. Where the model directory is missing the step fails in one line (``make real-model`` writes it).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "smollm2-135m"
TRAIN = ("prideprejudice", "sensesensibility", "mansfieldpark")
HELDOUT = ("emma", "persuasion", "northangerabbey")  # experiments/real_model.yaml's windows
SEED = 0
ORIG = 8192  # SmolLM2's window (max_position_embeddings)
METHODS = ("pi", "ntk", "yarn")
# the GPU run (minutes on an H200 in all): optimizer steps and samples a step, the same tokens a step at x2 and x4
STEPS, BATCH_TOKENS = 20, 65536
LR = 1e-4  # LoRA's usual order (the recipes' 2e-5 is for hundreds of steps): a choice, not a tuned value
DRY = {"length_div": 32, "steps": 1, "windows": 1}


def log(msg: str) -> None:
    print(f"[smollm2] {msg}", file=sys.stderr, flush=True)


def settings(scale: int, dry: bool) -> dict:
    """The run's lengths and counts: samples of S x 8,192 tokens (dry: / 64), BATCH_TOKENS a step."""
    length = scale * ORIG // (DRY["length_div"] if dry else 1)
    orig = ORIG // (DRY["length_div"] if dry else 1)
    return {"length": length, "orig": orig, "steps": DRY["steps"] if dry else STEPS,
            "global_batch": 1 if dry else max(1, BATCH_TOKENS // length), "windows": DRY["windows"] if dry else 3,
            "eval_lengths": (length // 2, length) if dry else (length // 4, length // 2, length),
            "depths": (0.25, 0.75) if dry else (0.15, 0.45, 0.75)}


def run(cmd: list[str], what: str, timeout: float) -> subprocess.CompletedProcess:
    log(f"{what}: {' '.join(map(str, cmd))}")
    p = subprocess.run([str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        tail = [x for x in p.stderr.strip().splitlines() if x.strip()][-1:] or [f"exit code {p.returncode}"]
        raise RuntimeError(f"{what} failed: {tail[0][:300]}")
    return p


def read(model, ids: list[int], device: str, chunk: int = 1024):
    """(next-token loss, argmax) per position, the model on ``device``: the passkey probe's reading."""
    from ropescale.probes.passkey import forward_read

    return forward_read(model, ids, chunk, device=device)


def summarise(windows, reads, cfg: dict) -> dict:
    """Passkeys retrieved and answer loss per length, loss inside the original window (positions 1K..orig) and
    past it (orig..length), over the windows."""
    from ropescale.probes import passkey as pk

    keys, inside, past = {}, [], []
    bucket = max(1, cfg["orig"] // 8)
    for w, (nll, arg) in zip(windows, reads):
        for r in pk.key_results(w, arg, nll):
            keys.setdefault(r["length"], []).append(r)
        b = pk.bucket_losses(w, nll, cfg["length"], bucket)
        n_in = cfg["orig"] // bucket
        inside += [v for v in b[1:n_in] if not math.isnan(v)]
        past += [v for v in b[n_in:] if not math.isnan(v)]
    mean = lambda v: round(sum(v) / len(v), 4) if v else None  # noqa: E731
    return {"passkey": {str(L): f"{sum(k['retrieved'] for k in ks)}/{len(ks)}" for L, ks in sorted(keys.items())},
            "answer_loss": {str(L): mean([k["answer_loss"] for k in ks]) for L, ks in sorted(keys.items())},
            "loss_in_window": mean(inside), "loss_past_window": mean(past)}


def evaluate(model_dir: Path, spec, cfg: dict, device: str, windows) -> dict:
    """One model on the windows: ``spec`` None reads the model's own config (the merged fine-tune's rope)."""
    import torch

    from rope_scaling.load import load_config, load_model

    mc = load_config(model_dir, spec)
    dtype = torch.float32
    model = load_model(model_dir, mc.config, dtype=dtype, attn="sdpa", state=mc.state).to(device).eval()
    t = time.monotonic()
    reads = [read(model, w.ids[:cfg["length"]], device) for w in windows]
    out = summarise(windows, reads, cfg) | {"seconds": round(time.monotonic() - t, 1)}
    del model
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench/gpusuite/smollm2.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--method", required=True, choices=METHODS)
    p.add_argument("--scale", type=int, required=True, choices=(2, 4))
    p.add_argument("--workdir", required=True, help="where the data, the run and the merged model go")
    p.add_argument("--model", default=str(MODEL), help="the base model (make real-model writes it)")
    p.add_argument("--dry-run", action="store_true", help="CPU, short windows, 1 step: the path, not a figure")
    p.add_argument("--timeout", type=float, default=500.0, help="seconds for the fine-tune's process")
    a = p.parse_args(argv)
    model = Path(a.model)
    if not (model / "config.json").is_file():
        print(f"error: {model}: no model directory (make real-model writes it)", file=sys.stderr)
        return 2
    import torch

    from data_concat.text import pack_text
    from rope_scaling import RopeSpec
    from ropescale.common.paths import DATA_DIR

    cfg = settings(a.scale, a.dry_run)
    device = "cuda" if torch.cuda.is_available() and not a.dry_run else "cpu"
    work = Path(a.workdir) / f"{a.method}-x{a.scale}"
    data = Path(a.workdir) / f"data-{cfg['length']}"
    t0 = time.monotonic()
    if not data.is_dir():
        pack_text([DATA_DIR / "english" / "austen" / f"{n}.txt" for n in TRAIN], model, data, length=cfg["length"])
    run_dir, merged = work / "run", work / "merged"
    ft = [sys.executable, ROOT / "finetune.py", "--model", model, "--data", data, "--rope", a.method, "--scale",
          a.scale, "--max-steps", cfg["steps"], "--global-batch", cfg["global_batch"], "--out", run_dir,
          "--overwrite"]
    ft += ["--warmup-steps", "0"] if a.dry_run else ["--lr", str(LR), "--warmup-steps", "2"]
    run(ft, "fine-tune", a.timeout)
    run([sys.executable, ROOT / "finetune.py", "merge", "--run", run_dir, "--out", merged, "--overwrite"], "merge",
        300)
    logs = [json.loads(x) for x in (run_dir / "train_log.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in logs if "loss" in r]
    train = {"steps": len(steps), "first_loss": steps[0]["loss"] if steps else None,
             "final_loss": steps[-1]["loss"] if steps else None,
             "tokens_per_s": next((r.get(k) for r in reversed(logs) for k in ("tokens_per_s_steady", "tokens_per_s")
                                   if r.get(k)), None), "seconds": round(time.monotonic() - t0, 1)}
    from transformers import AutoTokenizer

    from ropescale.probes.passkey import novel_windows, read_novels

    windows = novel_windows(AutoTokenizer.from_pretrained(str(model)),
                            read_novels([f"english/austen/{n}.txt" for n in HELDOUT]), cfg["windows"],
                            cfg["eval_lengths"], cfg["depths"], SEED)
    spec = RopeSpec(a.method, float(a.scale), orig_ctx=ORIG)
    res = {"method": a.method, "scale": a.scale, "length": cfg["length"], "device": device,
           "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "train": train,
           "windows": [w.source for w in windows], "finetuned": evaluate(merged, None, cfg, device, windows),
           "training_free": evaluate(model, spec, cfg, device, windows), "seconds": round(time.monotonic() - t0, 1)}
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())

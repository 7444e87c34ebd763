#!/usr/bin/env python
"""The end-to-end demo (``make demo``, README command (1)): extend the tiny default's 512-token context x8 with each
RoPE method, fine-tune, and evaluate extrapolation the CNNSum way, on a CPU in minutes. Every step prints the
command it runs.

1. the embedded tiny default (``python -m ropescale make-tiny``: the committed build in assets/tiny, a 3.5M-parameter
   Qwen2-architecture model with a 512-token context that copies and does the recall task inside its context);
2. data (``python -m data_concat recall``): the recall task (sentences marked 【1】..【4】 spread over a novel excerpt,
   the marked sentences in order as the reference; see data_concat/recall.py) — training pairs of 2x-4x the original
   context from the training chapters, packed with ``python -m data_concat pack`` (F.2 prompts, loss on the
   answers); eval sets at 1x, 2x, 4x, 8x the original context from the held-out chapters (never trained on);
3. ``deepspeed finetune.py --rope M --scale 8 --data PACK --out OUT/train/tiny-M-x8`` for each method (none
   = the same fine-tune without RoPE scaling), then ``python finetune.py merge``;
4. ``eval_summ.py generate`` for the base model and every fine-tuned one, both F.2 prompts, every length;
5. ``eval_summ.py report``: CNNSum ROUGE-L of every run, the extrapolation table, Table 2's IE/IB averages and
   MSE, the failure modes (OUT/report/) and the Fig. 3 plot (OUT/fig3.png).

The recall task stands in for CNNSum's human-written summaries, which a model this small cannot write: every
reference line is copied from its input and the marks are spread evenly, so a model that cannot reach part of the
input loses the lines there. Re-running reuses what is finished (data, fine-tuned models, finished generations);
``--fresh`` starts over. ``--seed`` changes the fine-tuning seed, the training pairs and the eval samples.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

T0 = time.time()
METHODS = ("none", "pi", "ntk", "yarn")


def say(msg: str) -> None:
    print(f"[demo {time.time() - T0:6.1f}s] {msg}", flush=True)


def rel(p) -> str:
    p = Path(p)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def show(argv: list[str]) -> None:
    print("  $ " + " ".join(shlex.quote(rel(a) if os.sep in a and Path(a).exists() else a) for a in argv),
          flush=True)


def sh(argv: list[str], capture: bool = False) -> str:
    """Run a command (echoed first); its stderr (progress, logs) passes through; stop the demo if it fails."""
    show(argv)
    res = subprocess.run(argv, cwd=ROOT, text=True, stdout=subprocess.PIPE if capture else None,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if res.returncode != 0:
        raise SystemExit(f"[demo] step failed (exit {res.returncode}): {' '.join(argv)}")
    return res.stdout or ""


def in_process(prog: str, main, argv: list[str]) -> None:
    """Run a CLI's main function in this process (the same parser and code as the command; no new interpreter
    per run); stop the demo if it fails."""
    show(["python", prog] + argv)
    rc = main(argv)
    if rc:
        raise SystemExit(f"[demo] step failed (exit {rc}): {prog} {' '.join(argv)}")


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_demo(out: str = "runs/demo", *, model: str = "tiny", methods=METHODS, scale: float = 8,
             factors=(1, 2, 4, 8), samples: int = 16, max_new_tokens: int = 128, train_lo: float = 2,
             train_hi: float = 4, pairs: int = 256, launcher: str = "deepspeed", finetune_args=(), seed: int = 0,
             chapters: str | None = None, heldout: int | None = None, fresh: bool = False) -> dict:
    from transformers import AutoConfig

    from ropescale.common.paths import CHAPTERS_JSONL
    from rope_scaling import read_rope

    py = sys.executable
    out = Path(out)
    chapters = str(chapters or CHAPTERS_JSONL)
    s_txt = f"{scale:g}"
    if fresh and out.exists():
        say(f"--fresh: removing {rel(out)}")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    # 1 ---------------------------------------------------------------- the model
    if model == "tiny":
        say("step 1/5: the embedded tiny default (Qwen2 architecture, 512-token context; assets/tiny)")
        info = json.loads(sh([py, "-m", "ropescale", "make-tiny"], capture=True).strip().splitlines()[-1])
        model_dir = Path(info["model"])
        say(f"tiny default: {info['params'] / 1e6:.1f}M params; held-out perplexity {info['ppl_heldout']:.1f} "
            f"(random weights {info['ppl_heldout_random']:.1f}); loss on a passage seen earlier in the window "
            f"{info['copy_loss']:.2f} vs {info['nocopy_loss']:.2f} unseen; recall ROUGE-L inside its context "
            f"{info['recall_rouge_l']}")
    else:
        model_dir = Path(model)
        say(f"step 1/5: model {rel(model_dir)} (given)")
    orig = read_rope(AutoConfig.from_pretrained(str(model_dir))).orig_ctx
    if not orig:
        raise SystemExit(f"[demo] cannot tell the original context of {model_dir}")
    if heldout is None:
        from ropescale.common.recall import HELDOUT

        heldout = HELDOUT
    if model == "tiny":
        heldout = json.loads((model_dir / "tiny.json").read_text(encoding="utf-8"))["spec"]["heldout_per_book"]
    say(f"original context {orig} tokens; every method at scale {s_txt} ({int(orig * scale)} tokens)")

    # 2 ---------------------------------------------------------------- data
    data = out / "data"
    pairs_file, packed = data / f"pairs_s{seed}.jsonl", data / f"packed_s{seed}"
    lo, hi = int(orig * train_lo), int(orig * train_hi)
    recall = [py, "-m", "data_concat", "recall", "--chapters", chapters, "--tokenizer", str(model_dir),
              "--heldout", str(heldout), "--seed", str(seed)]
    say(f"step 2/5: data: {pairs} recall pairs from the training chapters, packed with the F.2 prompts into "
        f"samples of {lo}-{hi} tokens ({train_lo:g}x-{train_hi:g}x the context); eval sets from the held-out "
        f"chapters")
    if not (packed / "train.parquet").is_file():
        from ropescale.common.recall import pair_range
        from data_concat.tokenizer import load_tokenizer

        ctx_lo, ctx_hi = pair_range(load_tokenizer(str(model_dir)), lo, hi)
        sh(recall + ["--part", "train", "--min-tokens", str(ctx_lo), "--max-tokens", str(ctx_hi), "--n", str(pairs),
                     "--out", str(pairs_file)])
        sh([py, "-m", "data_concat", "pack", "--pairs", str(pairs_file), "--tokenizer", str(model_dir),
            "--min-tokens", str(lo), "--max-tokens", str(hi), "--prompt", "mix", "--seed", str(seed),
            "--on-bad", "skip", "--out", str(packed)])
    else:
        say(f"reusing {rel(packed)}")
    targets = [int(orig * f) for f in factors]
    evals = {}
    for t in targets:
        p = data / f"eval_T{t}_s{seed}.jsonl"
        if not p.is_file():
            sh(recall + ["--part", "heldout", "--target", str(t), "--n", str(samples), "--out", str(p)])
        evals[t] = p

    # 3 ---------------------------------------------------------------- fine-tune + merge
    merged = {}
    name = "tiny" if model == "tiny" else model_dir.name
    for m in methods:
        run_name = f"{name}-{m}" if m == "none" else f"{name}-{m}-x{s_txt}"
        train_dir = out / "train" / (run_name + (f"-s{seed}" if seed else ""))
        merged[m] = train_dir / "merged"
        say(f"step 3/5: fine-tuning {'without RoPE scaling' if m == 'none' else f'with {m} x{s_txt}'} "
            f"({launcher}), then merging into {rel(merged[m])}")
        if (merged[m] / "config.json").is_file():
            say(f"reusing {rel(merged[m])}")
            continue
        if not (train_dir / "final").is_dir():
            # none: the same fine-tune at the same lengths, past the original context with no RoPE change
            ft = ["finetune.py"] + (["--allow-extrapolation"] if m == "none" else ["--rope", m, "--scale", s_txt])
            ft += ["--data", str(packed), "--out", str(train_dir), "--seed", str(seed)]
            if model != "tiny":
                ft += ["--model", str(model_dir)]
            if train_dir.exists():  # an interrupted earlier demo run: continue it
                ft += ["--resume", "auto"]
            ft += list(finetune_args)
            if launcher == "deepspeed":  # a free rendezvous port: 29500 may be taken by another job
                launch = [str(Path(py).parent / "deepspeed"), "--master_port", str(free_port())]
            else:
                launch = [py]
            sh(launch + ft)
        sh([py, "finetune.py", "merge", "--run", str(train_dir), "--out", str(merged[m])])

    # 4 ---------------------------------------------------------------- generation
    from ropescale.evaluation.cli import main as eval_main

    series = [("base", "tiny" if model == "tiny" else str(model_dir))]
    series += [(f"ft-{m}" if m == "none" else f"ft-{m}-x{s_txt}", str(merged[m])) for m in methods]
    gen = out / (f"gen_s{seed}" if seed else "gen")
    n_runs = len(series) * 2 * len(targets)
    say(f"step 4/5: greedy generation: {n_runs} runs ({len(series)} models x 2 prompts x {len(targets)} lengths, "
        f"{samples} samples each, at most {max_new_tokens} new tokens; a fine-tuned model keeps the RoPE setting "
        f"saved in its config)")
    t_gen = time.time()
    for sname, m in series:
        for pr in ("ft-ie", "ft-ib"):
            for t in targets:
                in_process("eval_summ.py", eval_main, [
                    "generate", "--model", m, "--data", str(evals[t]), "--prompt", pr, "--max-new-tokens",
                    str(max_new_tokens), "--out", str(gen / f"{sname}_{pr}_T{t}")])
    say(f"generation done in {time.time() - t_gen:.0f}s")

    # 5 ---------------------------------------------------------------- score + report
    report, fig = out / ("report" if not seed else f"report_s{seed}"), out / (f"fig3_s{seed}.png" if seed else
                                                                             "fig3.png")
    say("step 5/5: scoring (CNNSum ROUGE-L) and the report: extrapolation table (ROUGE-L x100 by eval length; rows: "
        "model, RoPE method, scale, training length), Table 2 (IE/IB averages, MSE), failure modes, Fig. 3")
    from ropescale.evaluation.report import make_report

    show(["python", "eval_summ.py", "report", str(gen), "--out", str(report), "--plot", str(fig)])
    make_report([gen], out_dir=report, plot=fig)
    for view in ("extrapolation", "table2"):
        print()
        print((report / f"{view}.md").read_text(encoding="utf-8").strip())
    print()
    say(f"all tables in {rel(report)}/, Fig. 3 in {rel(fig)}")
    say(f"demo finished in {time.time() - T0:.0f}s")
    return {"model_dir": str(model_dir), "packed": str(packed), "merged": {m: str(p) for m, p in merged.items()},
            "evals": {t: str(p) for t, p in evals.items()}, "gen": str(gen), "report": str(report), "fig": str(fig)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo", help="where everything goes (default runs/demo)")
    ap.add_argument("--model", default="tiny", help="'tiny' (default) or an HF model directory")
    ap.add_argument("--methods", default=",".join(METHODS), help="RoPE methods to compare (default none,pi,ntk,yarn)")
    ap.add_argument("--scale", type=float, default=8, help="scale factor of every method (default 8)")
    ap.add_argument("--factors", default="1,2,4,8", help="eval lengths as multiples of the original context")
    ap.add_argument("--samples", type=int, default=16, help="eval samples per length (default 16)")
    ap.add_argument("--max-new-tokens", type=int, default=128,
                    help="the references are four marked sentences (~60-100 tokens), so 128 rather than 400")
    ap.add_argument("--pairs", type=int, default=256, help="fine-tuning pairs (default 256)")
    ap.add_argument("--launcher", default="deepspeed", choices=("deepspeed", "python"))
    ap.add_argument("--finetune-args", default="", help="extra finetune.py flags, e.g. '--max-steps 4'")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fine-tunes, the pairs and the eval samples")
    ap.add_argument("--fresh", action="store_true", help="remove earlier demo outputs first")
    args = ap.parse_args(argv)
    from ropescale.common.io import InputError

    try:
        run_demo(args.out, model=args.model, methods=[m for m in args.methods.split(",") if m], scale=args.scale,
                 factors=[float(x) for x in args.factors.split(",")], samples=args.samples,
                 max_new_tokens=args.max_new_tokens, pairs=args.pairs, launcher=args.launcher,
                 finetune_args=shlex.split(args.finetune_args), seed=args.seed, fresh=args.fresh)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The end-to-end demo (``make demo``, README command (1)): RoPE-extend the tiny default x8, fine-tune it, and
evaluate extrapolation the CNNSum way, on a CPU in minutes. Every step prints the command it runs.

1. build the tiny default (cached): ``python -m ropescale make-tiny``;
2. fine-tuning data: ``python -m data_concat pairs`` (chapter/heading pairs from three of the four novels) and
   ``python -m data_concat pack`` into samples of 2x-8x the original context (F.2 prompts, loss on summaries);
3. ``deepspeed finetune.py --rope ntk --scale 8 --data <pack> --output-dir OUT/train/tiny-ntk-x8``, then
   ``python finetune.py merge``;
4. eval sets sampled the CNNSum way (``python -m data_concat sample --target T``, Sec 3.2) from the fourth novel
   (西游记, never trained on) at 1x, 2x, 4x, 8x the original context;
5. ``eval_summ.py generate`` for three models x two prompts x four lengths: the base model unscaled, the base model
   with NTK x8 (no training), and the fine-tuned merged model (its F.2 prompts ft-ie/ft-ib; baselines IE/IB);
6. ``eval_summ.py report``: scores every run (CNNSum ROUGE-L), prints the extrapolation table, writes every
   table to OUT/report/ and the Fig. 3 plot to OUT/fig3.png.

Everything goes under ``--out`` (runs/demo), the fine-tuning run included (runs/demo/train/tiny-ntk-x8, merged
model in its merged/), so the demo never touches a run of yours in finetune.py's default runs/train/. Re-running
reuses what is finished (the tiny model, the data, the fine-tuned model, finished generations); ``--fresh``
starts over.
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


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def eval_generate(argv: list[str]) -> None:
    """``python eval_summ.py generate ARGV`` in this process (the same parser and function, no new interpreter
    per run; its one-line JSON result is not printed)."""
    from evaluation.cli import build_parser
    from evaluation.generate import generate, generate_kwargs

    show(["python", "eval_summ.py", "generate"] + argv)
    generate(**generate_kwargs(build_parser().parse_args(["generate"] + argv)))


def run_demo(out: str = "runs/demo", *, model: str = "tiny", rope: str = "ntk", scale: float = 8,
             factors=(1, 2, 4, 8), samples: int = 6, max_new_tokens: int = 48, train_lo: float = 2,
             train_hi: float = 8, max_pairs: int = 400, train_books: str = "sanguo_yanyi,shuihu_zhuan,hongloumeng",
             eval_books: str = "xiyou_ji", launcher: str = "deepspeed", train_dir: str | None = None,
             finetune_args=(), chapters: str | None = None, fresh: bool = False) -> dict:
    from transformers import AutoConfig

    from rope_scaling import read_rope
    from common.paths import CHAPTERS_JSONL

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
        say("step 1/6: the embedded tiny default (Qwen2 architecture, 512-token context), built once and cached")
        printed = sh([py, "-m", "ropescale", "make-tiny"], capture=True)
        info = json.loads(printed.strip().splitlines()[-1])  # its result is the last stdout line
        model_dir = Path(info["model"])
        say(f"tiny default at {rel(model_dir)}: {info['params'] / 1e6:.1f}M params, held-out perplexity "
            f"{info['ppl_heldout']:.1f} (random weights: {info['ppl_heldout_random']:.1f})")
    else:
        model_dir = Path(model)
        say(f"step 1/6: model {rel(model_dir)} (given)")
    orig = read_rope(AutoConfig.from_pretrained(str(model_dir))).orig_ctx
    if not orig:
        raise SystemExit(f"[demo] cannot tell the original context of {model_dir}")
    say(f"original context {orig} tokens; target: {rope} x{s_txt} = {int(orig * scale)} tokens")

    # 2 ---------------------------------------------------------------- fine-tuning data
    data = out / "data"
    pairs, packed = data / "pairs.jsonl", data / "packed"
    lo, hi = int(orig * train_lo), int(orig * train_hi)
    say(f"step 2/6: fine-tuning data: pairs from {train_books} packed into {lo}-{hi}-token samples "
        f"({train_lo:g}x-{train_hi:g}x the original context)")
    if not (packed / "train.parquet").is_file():
        sh([py, "-m", "data_concat", "pairs", "--chapters", chapters, "--tokenizer", str(model_dir), "--books",
            train_books, "--min-tokens", str(max(32, lo // 8)), "--max-tokens", str(max(64, lo // 2)),
            "--split", "all", "--max-pairs", str(max_pairs), "--out", str(pairs)])
        sh([py, "-m", "data_concat", "pack", "--pairs", str(pairs), "--tokenizer", str(model_dir), "--min",
            str(lo), "--max", str(hi), "--prompt", "mix", "--on-bad", "skip", "--out", str(packed)])
    else:
        say(f"reusing {rel(packed)}")

    # 3 ---------------------------------------------------------------- fine-tune + merge
    name = "tiny" if model == "tiny" else model_dir.name
    train_dir = Path(train_dir) if train_dir else out / "train" / f"{name}-{rope}-x{s_txt}"
    merged = train_dir / "merged"
    say(f"step 3/6: LoRA fine-tuning with {rope} x{s_txt} ({launcher}), then merging into {rel(merged)}")
    if not (merged / "config.json").is_file():
        if not (train_dir / "final").is_dir():
            ft = ["finetune.py", "--rope", rope, "--scale", s_txt, "--data", str(packed), "--output-dir",
                  str(train_dir)]
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
        sh([py, "finetune.py", "merge", "--run", str(train_dir), "--out", str(merged)])
    else:
        say(f"reusing {rel(merged)}")

    # 4 ---------------------------------------------------------------- eval sets
    targets = [int(orig * f) for f in factors]
    say(f"step 4/6: eval sets sampled the CNNSum way (Sec 3.2) from {eval_books}: {samples} samples at each of "
        f"{', '.join(map(str, targets))} tokens")
    evals = {}
    for t in targets:
        p = data / f"eval_T{t}.jsonl"
        if not p.is_file():
            sh([py, "-m", "data_concat", "sample", "--chapters", chapters, "--tokenizer", str(model_dir),
                "--target", str(t), "--unit", "paragraph", "--books", eval_books, "--max-samples", str(samples),
                "--out", str(p)])
        evals[t] = p

    # 5 ---------------------------------------------------------------- generation
    series = [
        ("base", str(model_dir) if model != "tiny" else "tiny", [], ("ie", "ib")),
        (f"base-{rope}-x{s_txt}", str(model_dir) if model != "tiny" else "tiny", ["--rope", rope, "--scale", s_txt],
         ("ie", "ib")),
        (f"ft-{rope}-x{s_txt}", str(merged), [], ("ft-ie", "ft-ib")),
    ]
    gen = out / "gen"
    n_runs = len(series) * 2 * len(targets)
    say(f"step 5/6: greedy generation ({n_runs} runs: 3 models x 2 prompts x {len(targets)} lengths, at most "
        f"{max_new_tokens} new tokens; the fine-tuned model keeps the RoPE setting saved in its config)")
    t_gen = time.time()
    for name, m, rope_flags, prompts_ in series:
        for pr in prompts_:
            for t in targets:
                eval_generate([
                    "--model", m, "--data", str(evals[t]), "--prompt", pr, "--subset", f"T{t}",
                    "--max-new-tokens", str(max_new_tokens), "--out", str(gen / f"{name}_{pr}_T{t}"), *rope_flags])
    say(f"generation done in {time.time() - t_gen:.0f}s")

    # 6 ---------------------------------------------------------------- score + report
    fig = out / "fig3.png"
    say("step 6/6: scoring (CNNSum ROUGE-L) and the extrapolation table (ROUGE-L by eval length; rows: model, "
        "RoPE method, scale, training length)")
    from evaluation.report import make_report

    show(["python", "eval_summ.py", "report", str(gen), "--out", str(out / "report"), "--plot", str(fig)])
    make_report([gen], out_dir=out / "report", plot=fig)
    text = (out / "report" / "extrapolation.md").read_text(encoding="utf-8")
    print()
    print(text.strip())
    print()
    say(f"all tables (Table 2/7 views, extrapolation, failure modes) in {rel(out / 'report')}/, "
        f"Fig. 3 plot in {rel(fig)}")
    say(f"demo finished in {time.time() - T0:.0f}s")
    return {"model_dir": str(model_dir), "packed": str(packed), "train_dir": str(train_dir), "merged": str(merged),
            "evals": {t: str(p) for t, p in evals.items()}, "gen": str(gen), "report": str(out / "report"),
            "fig": str(fig)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo")
    ap.add_argument("--model", default="tiny", help="'tiny' (default) or an HF model directory")
    ap.add_argument("--rope", default="ntk")
    ap.add_argument("--scale", type=float, default=8)
    ap.add_argument("--factors", default="1,2,4,8", help="eval lengths as multiples of the original context")
    ap.add_argument("--samples", type=int, default=6, help="eval samples per length")
    ap.add_argument("--max-new-tokens", type=int, default=48,
                    help="the references are chapter headings (~15-30 tokens), so 48 rather than the paper's 400")
    ap.add_argument("--max-pairs", type=int, default=400)
    ap.add_argument("--launcher", default="deepspeed", choices=("deepspeed", "python"))
    ap.add_argument("--train-dir", help="fine-tuning run directory (default: OUT/train/<model>-<rope>-x<scale>)")
    ap.add_argument("--finetune-args", default="", help="extra finetune.py flags, e.g. '--max-steps 4'")
    ap.add_argument("--fresh", action="store_true", help="remove earlier demo outputs first")
    args = ap.parse_args(argv)
    from common.io import InputError

    try:
        run_demo(args.out, model=args.model, rope=args.rope, scale=args.scale,
                 factors=[float(x) for x in args.factors.split(",")], samples=args.samples,
                 max_new_tokens=args.max_new_tokens, max_pairs=args.max_pairs, launcher=args.launcher,
                 train_dir=args.train_dir, finetune_args=shlex.split(args.finetune_args), fresh=args.fresh)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

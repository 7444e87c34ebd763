#!/usr/bin/env python
"""The end-to-end demo (``make demo``, README command (1)): extend the tiny default's 512-token context x8 with each
RoPE method, with and without fine-tuning, and evaluate extrapolation the CNNSum way, on a CPU in minutes. Every
step prints the command it runs.

1. the embedded tiny default (``python -m ropescale make-tiny``: the committed build in assets/tiny, a 3.5M-parameter
   Qwen2-architecture model with a 512-token context that copies and does the recall task inside its context);
2. data (``python -m data_concat recall``): the recall task (sentences marked 【1】..【4】 spread over a novel excerpt,
   the marked sentences in order as the reference; see data_concat/recall.py) — training pairs of 2x-4x the original
   context from the training chapters, packed with ``python -m data_concat pack`` (F.2 prompts, loss on the
   answers); eval sets at 1x, 2x, 4x, 8x the original context from the held-out chapters (never trained on);
3. ``deepspeed finetune.py --rope M --scale 8 --data PACK --out OUT/train/tiny-M-x8`` for each method (none
   = the same fine-tune without RoPE scaling), then ``python finetune.py merge``;
4. ``eval_summ.py generate``, greedy, every length, for: the base model; the base model with each method applied
   at load time (``--rope M --scale 8``, no fine-tune: what the method alone does); every fine-tuned model — all
   with both F.2 prompts (ft-ie / ft-ib, those of the pre-training and the fine-tunes) — and the base model with
   the F.1 baseline prompts (ie / ib, as the paper's Table 2 evaluates its baselines);
5. ``eval_summ.py report``: CNNSum ROUGE-L of every run, the extrapolation table, Table 2's IE/IB averages and
   MSE, the exact recall per mark when the report writes it (recall.md), the failure modes (OUT/report/) and
   the Fig. 3 plot (OUT/fig3.png); the F.1 runs get their own report (OUT/report/baseline_prompts/), so the two
   prompt families are never averaged together;
6. the demo's own table (OUT/report/demo.md): each row's predicted reach (``rope_scaling describe``: the longest
   context in which every rotary pair stays inside the angles it saw in pre-training), its fine-tune's answer loss
   at step 1 (before any update) and over the last steps (a row whose loss stays above 1 nat per answer token is
   marked under-trained: it has not learned the task at its training lengths), its ROUGE-L per length, the
   Prompt-IE vs Prompt-IB MSE, and a floor row: the score of an answer holding only the four marks.

The recall task stands in for CNNSum's human-written summaries, which a model this small cannot write: every
reference line is copied from its input and the marks are spread evenly, so a model that cannot reach part of the
input loses the lines there. ROUGE-L on it has a floor of about 20 (the marks and line breaks alone), not 0.
Re-running reuses what is finished (data, fine-tuned models, finished generations); ``--fresh`` starts over.
``--seed`` changes the fine-tuning seed, the training pairs, the eval passages and their marked sentences.
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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# OpenMP threads that wait by sleeping, not spinning (before torch loads; the fine-tune subprocesses inherit it):
# on a shared machine two spinning threads per process took 129 s for what takes 2.4 s this way (the same run)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

T0 = time.time()
METHODS = ("none", "pi", "ntk", "yarn")  # fine-tuned
FREE = ("pi", "ntk", "yarn")  # applied at load time, no fine-tune
F2 = ("ft-ie", "ft-ib")  # Appendix F.2, the fine-tuning prompts: every row
F1 = ("ie", "ib")  # Appendix F.1, the baseline prompts: the base model, as the paper's Table 2
LEARNED = 1.0  # answer loss (nats/token) over the last steps above which a fine-tune is marked under-trained
LAST = 4  # steps the final loss is averaged over


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
    from ropescale.training.env import DIST_DEFAULTS

    # each fine-tune picks its own rendezvous port: never one an in-process step of this demo set and may still hold
    env = {k: v for k, v in os.environ.items() if k not in {*DIST_DEFAULTS, "MASTER_PORT"}}
    res = subprocess.run(argv, cwd=ROOT, text=True, stdout=subprocess.PIPE if capture else None,
                         env=dict(env, PYTHONPATH=str(ROOT)))
    if res.returncode != 0:
        raise SystemExit(f"[demo] step failed (exit {res.returncode}): {' '.join(argv)}")
    return res.stdout or ""


def in_process(prog: str, main, argv: list[str]) -> None:
    """Run a CLI's main function in this process (the same parser and code as the command; no new interpreter
    per run); stop the demo if it fails."""
    show(prog.split() + argv)
    rc = main(argv)
    if rc:
        raise SystemExit(f"[demo] step failed (exit {rc}): {prog} {' '.join(argv)}")


@dataclass
class Row:
    """One evaluated setting: the model it loads, the RoPE flags given at load time, its fine-tune run (if any)."""

    key: str  # run-directory prefix: base, free-ntk-x8, ft-ntk-x8
    label: str  # how the demo table names it
    model: str  # 'tiny', a model dir, or a merged fine-tune
    method: str  # none / pi / ntk / yarn
    flags: tuple = ()  # generate's RoPE flags (training-free rows)
    train_dir: Path | None = None  # fine-tuned rows


def train_losses(train_dir: Path) -> tuple[float, float, int] | None:
    """(answer loss at step 1, mean over the last LAST steps, steps) from a fine-tune's train_log.jsonl."""
    p = Path(train_dir) / "train_log.jsonl"
    if not p.is_file():
        return None
    from ropescale.common.io import read_jsonl

    steps = {r["step"]: r["loss"] for r in read_jsonl(p) if isinstance(r.get("loss"), (int, float))}
    if not steps:
        return None
    order = sorted(steps)
    last = [steps[s] for s in order[-LAST:]]
    return steps[order[0]], sum(last) / len(last), order[-1]


def predicted_reach(model: str, spec=None) -> float | None:
    """``rope_scaling describe``'s predicted reach for a model directory (with ``spec`` applied at load time)."""
    from rope_scaling.describe import describe, load_config

    return describe(load_config(model), spec)["reach"]


def row_cells(run_dirs: list[Path]) -> tuple[dict, float | None, dict]:
    """({column: ROUGE-L}, MSE(P-IE vs P-IB), {column: marks-only floor}) of one row, by the report's own formulas
    (one row's runs; the floor is the recall view's: the score of an answer holding only the marks)."""
    from ropescale.evaluation.report.intake import build_report

    rep = build_report([str(d) for d in run_dirs if (d / "predictions.jsonl").is_file()])
    _, rows = rep.extrapolation()
    t2 = list(rep.table2().values())
    floor = {r["subset"]: r["rouge_l"] for r in rep.recall()[1] if r["label"] is None}
    return (rows[0]["cells"] if rows else {}), (t2[0]["mse"] if t2 else None), floor


def run_demo(out: str = "runs/demo", *, model: str = "tiny", methods=METHODS, free=FREE, scale: float = 8,
             factors=(1, 2, 4, 8), samples: int = 16, max_new_tokens: int = 128, train_lo: float = 2,
             train_hi: float = 4, pairs: int = 256, launcher: str = "deepspeed", finetune_args=(), seed: int = 0,
             chapters: str | None = None, heldout: int | None = None, baseline_prompts: bool = True,
             fresh: bool = False) -> dict:
    from transformers import AutoConfig

    from rope_scaling import RopeSpec, read_rope
    from ropescale.common.paths import CHAPTERS_JSONL

    py = sys.executable
    out = Path(out)
    chapters = str(chapters or CHAPTERS_JSONL)
    s_txt = f"{scale:g}"
    if fresh and out.exists():
        say(f"--fresh: removing {rel(out)}")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}

    # 1 ---------------------------------------------------------------- the model
    if model == "tiny":
        say("step 1/6: the embedded tiny default (Qwen2 architecture, 512-token context; assets/tiny)")
        info = json.loads(sh([py, "-m", "ropescale", "make-tiny"], capture=True).strip().splitlines()[-1])
        model_dir = Path(info["model"])
        say(f"tiny default: {info['params'] / 1e6:.1f}M params; held-out perplexity {info['ppl_heldout']:.1f} "
            f"(random weights {info['ppl_heldout_random']:.1f}); loss on a passage seen earlier in the window "
            f"{info['copy_loss']:.2f} vs {info['nocopy_loss']:.2f} unseen; recall ROUGE-L inside its context "
            f"{info['recall_rouge_l']}")
    else:
        model_dir = Path(model)
        say(f"step 1/6: model {rel(model_dir)} (given)")
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
    from data_concat.cli import main as data_main

    t = time.time()
    data = out / "data"
    pairs_file, packed = data / f"pairs_s{seed}.jsonl", data / f"packed_s{seed}"
    lo, hi = int(orig * train_lo), int(orig * train_hi)
    recall = ["recall", "--chapters", chapters, "--tokenizer", str(model_dir), "--heldout", str(heldout),
              "--seed", str(seed)]
    say(f"step 2/6: data: {pairs} recall pairs from the training chapters, packed with the F.2 prompts into "
        f"samples of {lo}-{hi} tokens ({train_lo:g}x-{train_hi:g}x the context); eval sets from the held-out "
        f"chapters")
    from data_concat.packed import TRAIN_FILE

    if not (packed / TRAIN_FILE).is_file():
        from data_concat.tokenizer import load_tokenizer
        from ropescale.common.recall import pair_range

        ctx_lo, ctx_hi = pair_range(load_tokenizer(str(model_dir)), lo, hi)
        in_process("python -m data_concat", data_main, recall + [
            "--part", "train", "--min-tokens", str(ctx_lo), "--max-tokens", str(ctx_hi), "--n", str(pairs),
            "--out", str(pairs_file)])
        in_process("python -m data_concat", data_main, [
            "pack", "--pairs", str(pairs_file), "--tokenizer", str(model_dir), "--min-tokens", str(lo),
            "--max-tokens", str(hi), "--prompt", "mix", "--seed", str(seed), "--on-bad", "skip", "--out", str(packed)])
    else:
        say(f"reusing {rel(packed)}")
    targets = [int(orig * f) for f in factors]
    evals = {}
    for tg in targets:
        p = data / f"eval_T{tg}_s{seed}.jsonl"
        if not p.is_file():
            in_process("python -m data_concat", data_main, recall + [
                "--part", "heldout", "--eval-tokens", str(tg), "--n", str(samples), "--max-answer-tokens",
                str(max_new_tokens), "--out", str(p)])
        evals[tg] = p
    times["data"] = time.time() - t

    # 3 ---------------------------------------------------------------- fine-tune + merge
    from ropescale.training.cli import main as finetune_main

    t = time.time()
    name = "tiny" if model == "tiny" else model_dir.name
    base_model = "tiny" if model == "tiny" else str(model_dir)
    rows = [Row("base", f"{name} (no fine-tune)", base_model, "none")]
    rows += [Row(f"free-{m}-x{s_txt}", f"{name}, {m} x{s_txt} at load time", base_model, m,
                 ("--rope", m, "--scale", s_txt)) for m in free]
    merged = {}
    for m in methods:
        run_name = f"{name}-{m}" if m == "none" else f"{name}-{m}-x{s_txt}"
        train_dir = out / "train" / (run_name + (f"-s{seed}" if seed else ""))
        merged[m] = train_dir / "merged"
        say(f"step 3/6: fine-tuning {'without RoPE scaling' if m == 'none' else f'with {m} x{s_txt}'} "
            f"({launcher}), then merging into {rel(merged[m])}")
        rows.append(Row(f"ft-{m}" if m == "none" else f"ft-{m}-x{s_txt}",
                        f"fine-tuned, {'no RoPE change' if m == 'none' else f'{m} x{s_txt}'}", str(merged[m]), m,
                        train_dir=train_dir))
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
                from ropescale.training.env import free_port

                launch = [str(Path(py).parent / "deepspeed"), "-q", "--master_port", str(free_port())]
            else:
                launch = [py]
            sh(launch + ft)
        in_process("python finetune.py", finetune_main, ["merge", "--run", str(train_dir), "--out", str(merged[m])])
    times["fine-tunes"] = time.time() - t

    # 4 ---------------------------------------------------------------- generation
    from ropescale.evaluation.cli import main as eval_main

    sfx = f"_s{seed}" if seed else ""
    gen, gen_f1 = out / f"gen{sfx}", out / f"gen_f1{sfx}"
    jobs = [(gen, r, pr) for r in rows for pr in F2] + ([(gen_f1, rows[0], pr) for pr in F1] if baseline_prompts
                                                          else [])
    say(f"step 4/6: greedy generation: {len(jobs) * len(targets)} runs ({len(rows)} settings x 2 F.2 prompts"
        + (" + the base model x 2 F.1 prompts" if baseline_prompts else "")
        + f", x {len(targets)} lengths, {samples} samples each, at most {max_new_tokens} new tokens; a fine-tuned "
          f"model keeps the RoPE setting saved in its config)")
    t = time.time()
    for where, r, pr in jobs:
        for tg in targets:
            in_process("python eval_summ.py", eval_main, [
                "generate", "--model", r.model, *r.flags, "--data", str(evals[tg]), "--prompt", pr,
                "--max-new-tokens", str(max_new_tokens), "--out", str(where / f"{r.key}_{pr}_T{tg}")])
    times["generation"] = time.time() - t
    say(f"generation done in {times['generation']:.0f}s")

    # 5 ---------------------------------------------------------------- score + report
    from ropescale.evaluation.report.cli import make_report

    t = time.time()
    report, fig = out / f"report{sfx}", out / f"fig3{sfx}.png"
    report_f1 = report / "baseline_prompts"
    say("step 5/6: scoring (CNNSum ROUGE-L) and the report: extrapolation table (ROUGE-L x100 by eval length; rows: "
        "model, RoPE method, scale, training length), Table 2 (IE/IB averages, MSE), exact recall per mark, failure "
        "modes, Fig. 3; the F.1 (baseline prompt) runs in a report of their own")
    show(["python", "eval_summ.py", "report", str(gen), "--out", str(report), "--plot", str(fig)])
    make_report([gen], out_dir=report, plot=fig)
    if baseline_prompts:
        show(["python", "eval_summ.py", "report", str(gen_f1), "--out", str(report_f1)])
        make_report([gen_f1], out_dir=report_f1)
    for view in ("extrapolation", "recall"):
        p = report / f"{view}.md"
        if p.is_file():  # recall.md: the exact recall per mark, where the report writes it
            print()
            print(p.read_text(encoding="utf-8").strip())

    # 6 ---------------------------------------------------------------- the demo's table
    say("step 6/6: the demo table: predicted reach (rope_scaling describe), the fine-tunes' answer loss, ROUGE-L per "
        "length beside the marks-only floor, MSE(P-IE vs P-IB)")
    from ropescale.common.io import write_text_atomic
    from ropescale.common.runs import TrainLength, read_train_record
    from ropescale.common.tables import csv_text, json_text, markdown, number

    cols = [f"T{tg}" for tg in targets]
    cells_of = {r.key: row_cells([gen / f"{r.key}_{pr}_T{tg}" for pr in F2 for tg in targets]) for r in rows}
    floor = cells_of[rows[0].key][2]
    header = ["row", "predicted reach", "train length: mean (range)", "answer loss: step 1 -> last", *cols,
              "MSE (P-IE vs P-IB)"]
    table = [["marks only (the floor)", None, None, None, *[floor.get(c) for c in cols], None]]
    records = [{"row": "marks only (the floor)", "cells": floor}]
    for r in rows:
        reach = predicted_reach(str(model_dir), RopeSpec(r.method, scale=scale) if r.flags else None) \
            if r.train_dir is None else predicted_reach(r.model)
        loss = train_losses(r.train_dir) if r.train_dir is not None else None
        under = loss is not None and loss[1] > LEARNED
        cells, mse, _ = cells_of[r.key]
        loss_txt = None if loss is None else f"{loss[0]:.2f} -> {loss[1]:.2f} ({loss[2]} steps)"
        tl = TrainLength.of((read_train_record(r.model) or {}).get("length")) if r.train_dir is not None else None
        reach_txt = "unbounded" if reach is None else f"{reach:.0f}"
        table.append([r.label + (" (under-trained)" if under else ""), reach_txt, tl and tl.text(), loss_txt,
                      *[cells.get(c) for c in cols], mse])
        records.append({"row": r.label, "key": r.key, "method": r.method, "fine_tuned": r.train_dir is not None,
                        "predicted_reach": reach, "train_length": tl and tl.to_dict(), "loss_step1": loss and loss[0],
                        "loss_last": loss and loss[1], "steps": loss and loss[2], "under_trained": under,
                        "cells": cells, "mse_ie_ib": mse, "prompts": "F.2"})
        if r is rows[0] and baseline_prompts:  # the same model with the F.1 baseline prompts
            cells, mse, _ = row_cells([gen_f1 / f"base_{pr}_T{tg}" for pr in F1 for tg in targets])
            table.append([f"{r.label}, F.1 baseline prompts", reach_txt, None, None, *[cells.get(c) for c in cols],
                          mse])
            records.append({"row": f"{r.label}, F.1 baseline prompts", "key": "base-f1", "method": "none",
                            "fine_tuned": False, "predicted_reach": reach, "cells": cells, "mse_ie_ib": mse,
                            "prompts": "F.1"})
    md = markdown(header, table, number(2))
    title = ("### The demo table: CNNSum ROUGE-L x100 (mean of the two prompts: F.2 unless the row says F.1) by eval "
             "length, the predicted reach "
             f"(tokens), the fine-tunes' answer loss (nats/token; under-trained: above {LEARNED:g} over the last "
             f"{LAST} steps)")
    write_text_atomic(report / "demo.md", f"{title}\n{md}\n")
    write_text_atomic(report / "demo.csv", csv_text(header, table))
    write_text_atomic(report / "demo.json", json_text({"columns": cols, "rows": records}))
    print()
    print(title)
    print(md)
    for p, what in ((report / "table2.md", "F.2 prompts"), (report_f1 / "table2.md", "F.1 baseline prompts")):
        if p.is_file():
            print()
            print(f"({what})")
            print(p.read_text(encoding="utf-8").strip())
    times["report"] = time.time() - t
    print()
    say(f"all tables in {rel(report)}/ (demo.md: the table above), Fig. 3 in {rel(fig)}")
    say("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in times.items()))
    say(f"demo finished in {time.time() - T0:.0f}s")
    return {"model_dir": str(model_dir), "packed": str(packed), "merged": {m: str(p) for m, p in merged.items()},
            "evals": {tg: str(p) for tg, p in evals.items()}, "gen": str(gen), "gen_f1": str(gen_f1),
            "report": str(report), "fig": str(fig), "rows": [r.key for r in rows], "table": records, "times": times}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo", help="where everything goes (default runs/demo)")
    ap.add_argument("--model", default="tiny", help="'tiny' (default) or an HF model directory")
    ap.add_argument("--methods", default=",".join(METHODS), help="RoPE methods to fine-tune (default none,pi,ntk,yarn)")
    ap.add_argument("--free", default=",".join(FREE),
                    help="RoPE methods to evaluate applied at load time, without fine-tuning (default pi,ntk,yarn; "
                         "'' for none)")
    ap.add_argument("--scale", type=float, default=8, help="scale factor of every method (default 8)")
    ap.add_argument("--factors", default="1,2,4,8", help="eval lengths as multiples of the original context")
    ap.add_argument("--samples", type=int, default=16, help="eval samples per length (default 16)")
    ap.add_argument("--max-new-tokens", type=int, default=128,
                    help="the references are four marked sentences (~100 tokens), so 128 rather than 400; the eval "
                         "sets hold only references that fit (data_concat recall --max-answer-tokens)")
    ap.add_argument("--pairs", type=int, default=256, help="fine-tuning pairs (default 256)")
    ap.add_argument("--launcher", default="deepspeed", choices=("deepspeed", "python"))
    ap.add_argument("--finetune-args", default="", help="extra finetune.py flags, e.g. '--max-steps 4'")
    ap.add_argument("--no-baseline-prompts", action="store_true",
                    help="skip the base model's runs with the F.1 baseline prompts (ie / ib)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the fine-tunes, the training pairs, the eval passages and their marks")
    ap.add_argument("--fresh", action="store_true", help="remove earlier demo outputs first")
    args = ap.parse_args(argv)
    from ropescale.common.io import InputError

    try:
        run_demo(args.out, model=args.model, methods=[m for m in args.methods.split(",") if m],
                 free=[m for m in args.free.split(",") if m], scale=args.scale,
                 factors=[float(x) for x in args.factors.split(",")], samples=args.samples,
                 max_new_tokens=args.max_new_tokens, pairs=args.pairs, launcher=args.launcher,
                 finetune_args=shlex.split(args.finetune_args), seed=args.seed,
                 baseline_prompts=not args.no_baseline_prompts, fresh=args.fresh)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

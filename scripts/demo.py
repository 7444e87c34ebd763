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
3. ``deepspeed finetune.py --rope M --scale 8 --data PACK --out OUT/train/tiny-M-x8`` for each method of
   ``--methods`` (default ntk, yarn; none = the same fine-tune without RoPE scaling), then ``python finetune.py
   merge``;
4. ``eval_summ.py generate``, greedy, every length, for: the base model; the base model with each method applied
   at load time (``--rope M --scale 8``, no fine-tune: what the method alone does); every fine-tuned model — all
   with both F.2 prompts (ft-ie / ft-ib, those of the pre-training and the fine-tunes) — and the base model with
   the F.1 baseline prompts (ie / ib, as the paper's Table 2 evaluates its baselines) inside its window (1x: past
   it the unscaled base model is below the floor with any prompt);
5. ``eval_summ.py report``: CNNSum ROUGE-L of every run, the extrapolation table, Table 2's IE/IB averages and
   MSE, the exact recall per mark when the report writes it (recall.md), the failure modes (OUT/report/) and
   the Fig. 3 plot (OUT/fig3.png); the F.1 runs get their own report (OUT/report/baseline_prompts/), so the two
   prompt families are never averaged together;
6. the demo's own tables (OUT/report/demo.md): A. per row its angle bound (``formulas.reach``, or
   ``formulas.finetune_bound`` with the fine-tune's longest trained sample for a fine-tuned row: the longest context
   in which every rotary pair stays inside angles it saw -- a necessary condition, not a prediction) beside Liu et
   al. 2023's closed form for the base-change rows (its premise, a fine-tune with the new base at the original
   length, is what ``scripts/bound_tiny.py`` trains), the fine-tune's answer loss at step 1 and over the last steps,
   ROUGE-L per length with n (eval samples, each under both prompts) and a 95 % bootstrap interval, the effective
   context length (NoLiMa's 85 % of 1x), the above-floor length (the longest length scoring at least the marks-only
   floor's highest upper bound) and retention (1x / the base model's 1x), under a floor row (the score of an answer
   holding only the four marks); B. IE - IB per length with its paired bootstrap interval and sign-flip permutation
   p, MSE(P-IE vs P-IB) beside its noise floor with its permutation p and the chance that a row with no prompt
   effect reaches the paper's red mark (MSE >= 5); C. the differences the readings compare (a row against another
   on the same eval samples), each with its interval and paired sign-flip p
   (``ropescale/evaluation/report/significance.py``).

Every eval length is a total: the rendered prompt + context + the generation budget fit in it
(``data_concat recall --eval-tokens T --max-answer-tokens N``), so the 1x column is inside the original window.
The recall task stands in for CNNSum's human-written summaries, which a model this small cannot write: every
reference line is copied from its input and the marks are spread evenly, so a model that cannot reach part of the
input loses the lines there. ROUGE-L on it has a floor of about 20 (the marks and line breaks alone), not 0.
Re-running reuses what is finished (data, fine-tuned models, finished generations); ``--fresh`` starts over.
``--seed`` changes the fine-tuning seed, the training pairs, the eval passages and their marked sentences.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# OpenMP threads that wait by sleeping, not spinning (before torch loads; the fine-tune subprocesses inherit it):
# on a shared machine two spinning threads per process took 129 s for what takes 2.4 s this way (the same run)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

T0 = time.time()
METHODS = ("ntk", "yarn")  # fine-tuned by default (none and pi: --methods none,pi,ntk,yarn, about 5 minutes more)
FREE = ("pi", "ntk", "yarn")  # applied at load time, no fine-tune
F2 = ("ft-ie", "ft-ib")  # Appendix F.2, the fine-tuning prompts: every row
F1 = ("ie", "ib")  # Appendix F.1, the baseline prompts: the base model, as the paper's Table 2
LEARNED = 1.0  # answer loss (nats/token) over the last steps above which a row is marked "answer loss > 1 nat"
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


def row_bound(model: str, spec=None, train_record: dict | None = None) -> dict:
    """A row's angle bound, called what it is: a necessary condition, not a prediction. ``bound``: the pre-training
    bound (``formulas.reach``) of a training-free row, ``formulas.finetune_bound`` with the fine-tune's longest trained
    distance (``ropescale.common.runs.trained_distance``) for a fine-tuned one; ``pretrain``: the pre-training bound
    alone; ``liu``: Liu et al. 2023's closed form (``formulas.critical_period``: the critical pair's full period under
    the new base, T_train = the original context) where its premise holds -- a training-free row whose method
    changes only the base (none, ntk); else None. Values in tokens, None for unbounded."""
    from rope_scaling import bounds as F
    from rope_scaling.load import load_config
    from ropescale.common.runs import trained_distance

    mc = load_config(model, spec)
    st = mc.state
    orig, new = st.original_frequencies(), st.frequencies(mc.context)
    tl = trained_distance(train_record)
    pre = F.reach(st.orig_ctx, orig.inv_freq, new.inv_freq)
    bound = pre if tl is None else F.finetune_bound(st.orig_ctx, orig.inv_freq, new.inv_freq, tl)
    liu = None
    if tl is None and st.spec.method in ("none", "ntk"):
        liu = F.critical_period(st.rotary_dim, st.base, new.base, st.orig_ctx)

    def fin(v):
        return None if v is None or math.isinf(v) else v

    return {"bound": fin(bound), "pretrain": fin(pre), "liu": fin(liu), "trained_length": tl,
            "rule": "reach" if tl is None else "finetune_bound"}


def row_stats(run_dirs: list[Path], threshold: float | None = None):
    """One row's cells by the report's own formulas (a report over the row's runs only): the extrapolation row
    (estimates with n and interval, effective length with ``threshold``), IE - IB per column (paired interval), the
    MSE with its noise floor, the recall view's marks-only floor per column (an Estimate each) and each column's
    per-sample scores ({column: (IE {sample key: score}, IB {...})}). None without runs."""
    from ropescale.evaluation.report.intake import build_report

    rep = build_report([str(d) for d in run_dirs if (d / "predictions.jsonl").is_file()])
    cols, rows = rep.extrapolation(threshold)
    if not rows:
        return None
    s = rows[0]["setting"]
    return {"columns": cols, "row": rows[0], "diffs": {c: rep.difference(s, c) for c in cols}, "mse": rep.mse(s),
            "floor": {c: rep.floor(c) for c in cols}, "floor_samples": floor_samples(rep),
            "samples": {c: tuple(rep.samples.get((s, k, c), {}) for k in ("IE", "IB")) for c in cols}}


def floor_samples(rep) -> dict:
    """{column: {sample id: the marks-only floor's ROUGE-L of that sample}} (the runs' ``marks_only_rouge_l``)."""
    out: dict = {}
    for r in rep.runs:
        for smp in r.samples:
            sub = smp.get("subset") or r.summary.get("subset")
            if isinstance(smp.get("marks_only_rouge_l"), (int, float)):
                out.setdefault(sub, {})[str(smp.get("id"))] = float(smp["marks_only_rouge_l"])
    return out


def floor_threshold(floor: dict) -> float | None:
    """The above-floor length's threshold: the highest upper 95 % bound of the marks-only floor over the lengths (a
    row at or above it scores more than the marks, the task's free points, at every length it holds). A fixed
    threshold as in RULER's rule, but not RULER's effective length, whose threshold is a strong model's score."""
    his = [e.hi for e in floor.values() if e is not None and e.hi is not None]
    return max(his) if his else None


@dataclass
class Demo:
    """One demo run: its settings (run_demo's arguments), then what each step adds for the next."""

    out: Path
    model: str
    methods: tuple
    free: tuple
    scale: float
    factors: tuple
    samples: int
    max_new_tokens: int
    train_lo: float
    train_hi: float
    pairs: int
    launcher: str
    finetune_args: tuple
    seed: int
    chapters: str
    heldout: int | None
    baseline_prompts: bool
    times: dict = field(default_factory=dict)
    # step 1: the model
    model_dir: Path | None = None
    orig: int = 0
    # step 2: data
    packed: Path | None = None
    evals: dict = field(default_factory=dict)  # eval length -> eval set
    # step 3: the rows and the fine-tunes
    rows: list = field(default_factory=list)
    merged: dict = field(default_factory=dict)  # method -> merged model dir

    @property
    def s_txt(self) -> str:
        return f"{self.scale:g}"

    @property
    def targets(self) -> list[int]:
        return [int(self.orig * f) for f in self.factors]

    @property
    def f1_targets(self) -> list[int]:
        """The lengths the F.1 baseline prompts run at: those inside the original context (1x)."""
        return [tg for tg in self.targets if tg <= self.orig] or self.targets[:1]

    @property
    def sfx(self) -> str:
        return f"_s{self.seed}" if self.seed else ""

    @property
    def gen(self) -> Path:
        return self.out / f"gen{self.sfx}"

    @property
    def gen_f1(self) -> Path:
        return self.out / f"gen_f1{self.sfx}"

    @property
    def report(self) -> Path:
        return self.out / f"report{self.sfx}"

    @property
    def fig(self) -> Path:
        return self.out / f"fig3{self.sfx}.png"


def run_demo(out: str = "runs/demo", *, model: str = "tiny", methods=METHODS, free=FREE, scale: float = 8,
             factors=(1, 2, 4, 8), samples: int = 16, max_new_tokens: int = 128, train_lo: float = 2,
             train_hi: float = 4, pairs: int = 256, launcher: str = "deepspeed", finetune_args=(), seed: int = 0,
             chapters: str | None = None, heldout: int | None = None, baseline_prompts: bool = True,
             fresh: bool = False) -> dict:
    """The demo's six steps (module doc), in order; returns where everything went and the demo table's rows."""
    from ropescale.common.paths import CHAPTERS_JSONL

    d = Demo(Path(out), model, tuple(methods), tuple(free), scale, tuple(factors), samples, max_new_tokens, train_lo,
             train_hi, pairs, launcher, tuple(finetune_args), seed, str(chapters or CHAPTERS_JSONL), heldout,
             baseline_prompts)
    if fresh and d.out.exists():
        say(f"--fresh: removing {rel(d.out)}")
        shutil.rmtree(d.out)
    d.out.mkdir(parents=True, exist_ok=True)
    the_model(d)
    the_data(d)
    fine_tunes(d)
    generation(d)
    t = time.time()
    reports(d)
    records = demo_table(d)
    d.times["report"] = time.time() - t
    print()
    say(f"all tables in {rel(d.report)}/ (demo.md: the table above), Fig. 3 in {rel(d.fig)}")
    say("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in d.times.items()))
    say(f"demo finished in {time.time() - T0:.0f}s")
    return {"model_dir": str(d.model_dir), "packed": str(d.packed),
            "merged": {m: str(p) for m, p in d.merged.items()}, "evals": {tg: str(p) for tg, p in d.evals.items()},
            "gen": str(d.gen), "gen_f1": str(d.gen_f1), "report": str(d.report), "fig": str(d.fig),
            "rows": [r.key for r in d.rows], "table": records, "times": d.times}


def the_model(d: Demo) -> None:
    """Step 1: the model (the committed tiny default, or the one given), its original context, the held-out
    chapters its build kept."""
    from transformers import AutoConfig

    from rope_scaling import read_rope

    if d.model == "tiny":
        say("step 1/6: the embedded tiny default (Qwen2 architecture, 512-token context; assets/tiny)")
        info = json.loads(sh([sys.executable, "-m", "ropescale", "make-tiny"], capture=True).strip().splitlines()[-1])
        d.model_dir = Path(info["model"])
        say(f"tiny default: {info['params'] / 1e6:.1f}M params; held-out perplexity {info['ppl_heldout']:.1f} "
            f"(random weights {info['ppl_heldout_random']:.1f}); loss on a passage seen earlier in the window "
            f"{info['copy_loss']:.2f} vs {info['nocopy_loss']:.2f} unseen; recall ROUGE-L inside its context "
            f"{info['recall_rouge_l']}")
    else:
        d.model_dir = Path(d.model)
        say(f"step 1/6: model {rel(d.model_dir)} (given)")
    d.orig = read_rope(AutoConfig.from_pretrained(str(d.model_dir))).orig_ctx
    if not d.orig:
        raise SystemExit(f"[demo] cannot tell the original context of {d.model_dir}")
    if d.heldout is None:
        from ropescale.common.recall import HELDOUT

        d.heldout = HELDOUT
    if d.model == "tiny":
        d.heldout = json.loads((d.model_dir / "tiny.json").read_text(encoding="utf-8"))["spec"]["heldout_per_book"]
    say(f"original context {d.orig} tokens; every method at scale {d.s_txt} ({int(d.orig * d.scale)} tokens)")


def the_data(d: Demo) -> None:
    """Step 2: recall pairs from the training chapters packed with the F.2 prompts; an eval set per length from
    the held-out chapters (each reused when it is there)."""
    from data_concat.cli import main as data_main
    from data_concat.packed import TRAIN_FILE

    t = time.time()
    data = d.out / "data"
    pairs_file, d.packed = data / f"pairs_s{d.seed}.jsonl", data / f"packed_s{d.seed}"
    lo, hi = int(d.orig * d.train_lo), int(d.orig * d.train_hi)
    recall = ["recall", "--chapters", d.chapters, "--tokenizer", str(d.model_dir), "--heldout", str(d.heldout),
              "--seed", str(d.seed)]
    say(f"step 2/6: data: {d.pairs} recall pairs from the training chapters, packed with the F.2 prompts into "
        f"samples of {lo}-{hi} tokens ({d.train_lo:g}x-{d.train_hi:g}x the context); eval sets from the held-out "
        f"chapters")
    if not (d.packed / TRAIN_FILE).is_file():
        from data_concat.tokenizer import load_tokenizer
        from ropescale.common.recall import pair_range

        ctx_lo, ctx_hi = pair_range(load_tokenizer(str(d.model_dir)), lo, hi)
        in_process("python -m data_concat", data_main, recall + [
            "--part", "train", "--min-tokens", str(ctx_lo), "--max-tokens", str(ctx_hi), "--n", str(d.pairs),
            "--out", str(pairs_file)])
        in_process("python -m data_concat", data_main, [
            "pack", "--pairs", str(pairs_file), "--tokenizer", str(d.model_dir), "--min-tokens", str(lo),
            "--max-tokens", str(hi), "--prompt", "mix", "--seed", str(d.seed), "--on-bad", "skip", "--out",
            str(d.packed)])
    else:
        say(f"reusing {rel(d.packed)}")
    for tg in d.targets:
        p = data / f"eval_T{tg}_s{d.seed}.jsonl"
        if not p.is_file():
            in_process("python -m data_concat", data_main, recall + [
                "--part", "heldout", "--eval-tokens", str(tg), "--n", str(d.samples), "--max-answer-tokens",
                str(d.max_new_tokens), "--prompts", ",".join(F2 + (F1 if d.baseline_prompts else ())),
                "--out", str(p)])
        d.evals[tg] = p
    d.times["data"] = time.time() - t


def fine_tunes(d: Demo) -> None:
    """Step 3: the rows (the base model, each free method, each fine-tune), each method fine-tuned and merged
    (reused when merged already; an interrupted fine-tune is resumed)."""
    from ropescale.training.cli import main as finetune_main

    t = time.time()
    name = "tiny" if d.model == "tiny" else d.model_dir.name
    base_model = "tiny" if d.model == "tiny" else str(d.model_dir)
    d.rows = [Row("base", f"{name} (no fine-tune)", base_model, "none")]
    d.rows += [Row(f"free-{m}-x{d.s_txt}", f"{name}, {m} x{d.s_txt} at load time", base_model, m,
                   ("--rope", m, "--scale", d.s_txt)) for m in d.free]
    for m in d.methods:
        run_name = f"{name}-{m}" if m == "none" else f"{name}-{m}-x{d.s_txt}"
        train_dir = d.out / "train" / (run_name + (f"-s{d.seed}" if d.seed else ""))
        d.merged[m] = merged = train_dir / "merged"
        say(f"step 3/6: fine-tuning {'without RoPE scaling' if m == 'none' else f'with {m} x{d.s_txt}'} "
            f"({d.launcher}), then merging into {rel(merged)}")
        d.rows.append(Row(f"ft-{m}" if m == "none" else f"ft-{m}-x{d.s_txt}",
                          f"fine-tuned, {'no RoPE change' if m == 'none' else f'{m} x{d.s_txt}'}", str(merged), m,
                          train_dir=train_dir))
        if (merged / "config.json").is_file():
            say(f"reusing {rel(merged)}")
            continue
        if not (train_dir / "final").is_dir():
            sh(finetune_command(d, m, train_dir))
        in_process("python finetune.py", finetune_main, ["merge", "--run", str(train_dir), "--out", str(merged)])
    d.times["fine-tunes"] = time.time() - t


def finetune_command(d: Demo, method: str, train_dir: Path) -> list[str]:
    """The fine-tune of ``method`` (none: the same fine-tune at the same lengths, past the original context with
    no RoPE change), under the demo's launcher; an interrupted earlier one is continued."""
    py = sys.executable
    ft = ["finetune.py"] + (["--allow-extrapolation"] if method == "none" else ["--rope", method, "--scale", d.s_txt])
    ft += ["--data", str(d.packed), "--out", str(train_dir), "--seed", str(d.seed)]
    if d.model != "tiny":
        ft += ["--model", str(d.model_dir)]
    if train_dir.exists():  # an interrupted earlier demo run: continue it
        ft += ["--resume", "auto"]
    ft += list(d.finetune_args)
    if d.launcher == "deepspeed":  # a free rendezvous port: 29500 may be taken by another job
        from ropescale.training.env import free_port

        return [str(Path(py).parent / "deepspeed"), "-q", "--master_port", str(free_port())] + ft
    return [py] + ft


def generation(d: Demo) -> None:
    """Step 4: greedy generation of every row with both F.2 prompts at every length, and of the base model with the
    F.1 baseline prompts at 1x (:attr:`Demo.f1_targets`)."""
    from ropescale.evaluation.cli import main as eval_main

    jobs = [(d.gen, r, pr, d.targets) for r in d.rows for pr in F2]
    jobs += [(d.gen_f1, d.rows[0], pr, d.f1_targets) for pr in F1] if d.baseline_prompts else []
    say(f"step 4/6: greedy generation: {sum(len(j[3]) for j in jobs)} runs ({len(d.rows)} settings x 2 F.2 prompts"
        f" x {len(d.targets)} lengths"
        + (f" + the base model x 2 F.1 prompts at {', '.join(f'T{tg}' for tg in d.f1_targets)}"
           if d.baseline_prompts else "")
        + f"; {d.samples} samples each, at most {d.max_new_tokens} new tokens; a fine-tuned model keeps the RoPE "
          f"setting saved in its config)")
    t = time.time()
    for where, r, pr, targets in jobs:
        for tg in targets:
            in_process("python eval_summ.py", eval_main, [
                "generate", "--model", r.model, *r.flags, "--data", str(d.evals[tg]), "--prompt", pr,
                "--max-new-tokens", str(d.max_new_tokens), "--out", str(where / f"{r.key}_{pr}_T{tg}")])
    d.times["generation"] = time.time() - t
    say(f"generation done in {d.times['generation']:.0f}s")


def reports(d: Demo) -> None:
    """Step 5: scores and the report of the F.2 runs (with Fig. 3), the F.1 runs in a report of their own."""
    from ropescale.evaluation.report.cli import make_report

    say("step 5/6: scoring (CNNSum ROUGE-L) and the report: extrapolation table (ROUGE-L x100 by eval length; rows: "
        "model, RoPE method, scale, training length), Table 2 (IE/IB averages, MSE), exact recall per mark, failure "
        "modes, Fig. 3; the F.1 (baseline prompt) runs in a report of their own")
    show(["python", "eval_summ.py", "report", str(d.gen), "--out", str(d.report), "--plot", str(d.fig)])
    make_report([d.gen], out_dir=d.report, plot=d.fig)
    if d.baseline_prompts:
        show(["python", "eval_summ.py", "report", str(d.gen_f1), "--out", str(d.report / "baseline_prompts")])
        make_report([d.gen_f1], out_dir=d.report / "baseline_prompts")
    for view in ("extrapolation", "recall"):
        p = d.report / f"{view}.md"
        if p.is_file():  # recall.md: the exact recall per mark, where the report writes it
            print()
            print(p.read_text(encoding="utf-8").strip())


def demo_table(d: Demo) -> list[dict]:
    """Step 6: the demo's own tables (report/demo.{md,csv,json}), printed with both Table 2 views; returns its
    rows. Table A: per row the bound, ROUGE-L per length with n and 95 % intervals, the effective context length
    (NoLiMa's 85 % of 1x), the above-floor length (the marks-only floor's highest upper bound as threshold) and
    retention; table B: IE - IB per length with its paired interval and sign-flip p, MSE(P-IE vs P-IB) beside its
    noise floor with its permutation p; table C: the differences the readings compare, with intervals and p."""
    from ropescale.common.io import write_text_atomic
    from ropescale.common.tables import csv_text, json_text

    say("step 6/6: the demo tables: A. the angle bound (fine-tune aware) beside Liu et al.'s closed form, ROUGE-L per "
        "length with n and 95% intervals beside the marks-only floor, effective and above-floor length, retention; "
        "B. IE-IB with paired intervals and permutation p, MSE(P-IE vs P-IB) beside its noise floor with its p; "
        "C. the differences the readings compare")
    cols = [f"T{tg}" for tg in d.targets]
    base_runs = [d.gen / f"{d.rows[0].key}_{pr}_T{tg}" for pr in F2 for tg in d.targets]
    first = row_stats(base_runs)
    floor = first["floor"] if first else {}
    thr = floor_threshold(floor)
    stats = {r.key: row_stats([d.gen / f"{r.key}_{pr}_T{tg}" for pr in F2 for tg in d.targets], thr) for r in d.rows}
    base_1x = _first(stats[d.rows[0].key], cols)
    records = [{"row": "marks only (the floor)", "cells": {c: e and e.mean for c, e in floor.items()},
                "n": {c: e.n for c, e in floor.items() if e}, "ci": {c: _ci(e) for c, e in floor.items()},
                "threshold": thr,
                "samples": {c: {"floor": v} for c, v in (first["floor_samples"] if first else {}).items()}}]
    for r in d.rows:
        records.append(table_row(d, r, stats[r.key], cols, base_1x))
        if r is d.rows[0] and d.baseline_prompts:  # the same model with the F.1 baseline prompts
            st = row_stats([d.gen_f1 / f"base_{pr}_T{tg}" for pr in F1 for tg in d.f1_targets], thr)
            rec = table_row(d, r, st, cols, None, bound=records[-1])  # retention: F.2 and F.1 not compared
            # evaluated inside the window only: no effective length to measure
            records.append({**rec, "row": f"{r.label}, F.1 baseline prompts (1x only)", "key": "base-f1",
                            "prompts": "F.1", "effective_length": {}})
    comps = comparisons(d, records, cols)
    md_a, md_b, header, table = demo_markdown(records, cols, thr)
    md_c = comparisons_markdown(comps, cols)
    write_text_atomic(d.report / "demo.md", f"{md_a}\n\n{md_b}\n\n{md_c}\n")
    write_text_atomic(d.report / "demo.csv", csv_text(header, table))
    write_text_atomic(d.report / "demo.json", json_text({"columns": cols, "threshold": thr, "rows": records,
                                                         "comparisons": comps}))
    for md in (md_a, md_b, md_c):
        print()
        print(md)
    for p, what in ((d.report / "table2.md", "F.2 prompts"),
                    (d.report / "baseline_prompts" / "table2.md", "F.1 baseline prompts")):
        if p.is_file():
            print()
            print(f"({what})")
            print(p.read_text(encoding="utf-8").strip())
    return records


def sample_means(rec: dict, col: str) -> dict:
    """{sample id: the mean of its scores under the prompts present} of one row's column (the demo record's
    ``samples``): the unit a comparison of two rows pairs."""
    by = (rec.get("samples") or {}).get(col) or {}
    ids = sorted({i for scores in by.values() for i in scores}, key=_sort_id)
    return {i: sum(v[i] for v in by.values() if i in v) / sum(1 for v in by.values() if i in v) for i in ids}


def _sort_id(i: str):
    return (0, int(i), "") if i.isdigit() else (1, 0, i)


def comparison_pairs(d: Demo) -> list[tuple[str, str, str]]:
    """(label, row key a, row key b) of the differences the readings compare: every row against the marks-only
    floor (on the same samples); each method at load time against the base model; each fine-tune against its
    method at load time; fine-tuned YaRN against fine-tuned NTK; the base model's F.1 prompts against its F.2
    prompts (at 1x)."""
    s = d.s_txt
    pairs = [(f"{r.label} - floor", r.key, "floor") for r in d.rows]
    pairs += [(f"{m} x{s} at load time - base", f"free-{m}-x{s}", "base") for m in d.free]
    pairs += [(f"fine-tuned {m} x{s} - {m} x{s} at load time", f"ft-{m}-x{s}", f"free-{m}-x{s}")
              for m in d.methods if m in d.free]
    if "ntk" in d.methods and "yarn" in d.methods:
        pairs.append((f"fine-tuned yarn x{s} - fine-tuned ntk x{s}", f"ft-yarn-x{s}", f"ft-ntk-x{s}"))
    if d.baseline_prompts:
        pairs.append(("base, F.1 - F.2 prompts", "base-f1", "base"))
    return pairs


def comparisons(d: Demo, records: list[dict], cols: list[str]) -> list[dict]:
    """Table C's records: per compared pair of rows and column, a - b over the eval samples both scored (each
    sample's prompts averaged), with its bootstrap interval and two-sided paired sign-flip permutation p."""
    from ropescale.evaluation.report.significance import paired_sign_flip

    by = {rec.get("key", "floor"): rec for rec in records}
    out = []
    for label, a, b in comparison_pairs(d):
        if a not in by or b not in by:
            continue
        cells = {}
        for c in cols:
            x, y = sample_means(by[a], c), sample_means(by[b], c)
            if x and y:
                t = paired_sign_flip(x, y)
                cells[c] = {"mean": t.statistic, "ci": [t.lo, t.hi] if t.lo is not None else None, "p": t.p,
                            "n": t.n, "exact": t.exact, "reading": t.reading()}
        out.append({"label": label, "a": a, "b": b, "cells": cells})
    return out


def comparisons_markdown(comps: list[dict], cols: list[str]) -> str:
    title = ("### C. Differences the readings compare: a - b on the same eval samples (each sample's two prompts "
             "averaged) [95% bootstrap interval] p (paired sign-flip permutation, two-sided)")
    from ropescale.common.tables import markdown

    rows = [[c["label"], *[_diff_text(c["cells"].get(col)) for col in cols]] for c in comps]
    tests = sum(len(c["cells"]) for c in comps)
    ns = sorted({x["n"] for c in comps for x in c["cells"].values()})
    note = (f"n = {'/'.join(map(str, ns)) or '-'} eval samples a cell; p exact over the 2^n sign vectors (up to "
            f"n = 16; else 20,000 random ones); a difference is resolved where p < 0.05. {tests} tests at 0.05 resolve "
            f"about {0.05 * tests:.1f} by chance when nothing differs.")
    return f"{title}\n{markdown(['difference', *cols], rows)}\n\n{note}"


def _first(st, cols):
    return None if not st or not cols else st["row"]["cells"].get(cols[0])


def _ci(e) -> list | None:
    return None if e is None or e.lo is None else [round(e.lo, 4), round(e.hi, 4)]


def _tok(v) -> str:
    return "unbounded" if v is None else f"{v:,.0f}"


def demo_markdown(records: list[dict], cols: list[str], thr: float | None) -> tuple[str, str, list, list]:
    """The two markdown tables (with their titles) and the CSV's header and rows, from the JSON records."""
    from ropescale.common.tables import markdown

    def cell(rec, c):
        m, ci = rec["cells"].get(c), rec.get("ci", {}).get(c)
        return "-" if m is None else f"{m:.1f}" if not ci else f"{m:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]"

    thr_txt = "-" if thr is None else f"{thr:.1f}"
    head_a = ["row", "bound (tokens)", "Liu et al. 2023 T_extra", "train length (the data set): mean (range)",
              "answer loss: step 1 -> last", "n (samples)", *cols, "effective length (85% of 1x)",
              f"above-floor length (>= {thr_txt})", "retention"]
    rows_a, rows_b, csv_rows = [], [], []
    for rec in records:
        fine = "key" in rec
        eff = rec.get("effective_length") or {}
        ns = sorted(set((rec.get("n") or {}).values()))
        n_txt = "-" if not ns else str(ns[0]) if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
        loss = None if rec.get("loss_last") is None else \
            f"{rec['loss_step1']:.2f} -> {rec['loss_last']:.2f} ({rec['steps']} steps)"
        label = rec["row"] + (f" (answer loss > {LEARNED:g} nat)" if rec.get("loss_above") else "")
        rows_a.append([label, _tok(rec["bound"]) if fine else "", "" if not fine or rec.get("liu") is None
                       else _tok(rec["liu"]), rec.get("train_length_text") or "", loss or "", n_txt,
                       *[cell(rec, c) for c in cols],
                       *[(eff.get(k) or {}).get("text", "-") if fine and eff else "" for k in ("relative", "absolute")],
                       "" if rec.get("retention") is None else f"{100 * rec['retention']:.0f}%"])
        if fine:
            diffs = rec["ie_minus_ib"]
            red = rec.get("mse_p_red")
            rows_b.append([rec["row"], *[_diff_text(diffs.get(c)) for c in cols], _mse_text(rec),
                           "-" if red is None else f"{red:.2f}"])
        csv_rows.append([rec["row"], rec.get("bound"), rec.get("liu"), *[rec["cells"].get(c) for c in cols],
                         *[x for c in cols for x in (rec.get("ci", {}).get(c) or [None, None])],
                         (eff.get("relative") or {}).get("length"), (eff.get("absolute") or {}).get("length"),
                         rec.get("retention"), rec.get("mse_ie_ib"), rec.get("mse_floor"), rec.get("mse_p"),
                         rec.get("mse_p_red")])
    title_a = ("### A. ROUGE-L x100 by total eval length (prompt + context + answer budget <= T), mean of the two "
               "prompts (F.2 unless the row says F.1) [95% bootstrap interval]; n eval samples per cell, each under "
               "both prompts")
    note_a = (f"Bound: the longest context in which every rotary pair stays inside the angles it saw (pre-training; "
              f"for a fine-tuned row also its fine-tune's longest sample) -- a necessary condition, not a prediction. "
              f"Liu et al. 2023 T_extra: their closed form (the critical pair's full period under the new base), "
              f"which they derive for a model fine-tuned with the new base at its original training length; shown "
              f"for the base-change rows, none of which had that fine-tune. Effective length: the longest length up "
              f"to which the row keeps >= 85% of its own 1x score (NoLiMa's rule); '-': no 85% length for a row "
              f"below {thr_txt} at 1x. Above-floor length: the longest length up to which the row scores >= "
              f"{thr_txt}, the marks-only floor's highest upper 95% bound (a fixed threshold, as in RULER's rule; "
              f"not RULER's effective length, whose threshold is a strong model's score). '>T': holds at every "
              f"length. Retention: the row's 1x score / the base model's. Answer loss: nats per answer token at "
              f"step 1 and over the last {LAST} steps.")
    reds = [r.get("mse_p_red") for r in records if "key" in r and r.get("mse_p_red") is not None]
    title_b = ("### B. IE - IB per length [paired 95% bootstrap interval] p (paired sign-flip permutation, "
               "two-sided), and MSE(P-IE vs P-IB) [noise floor] p (permutation) with P(MSE >= 5) under no prompt "
               "effect")
    note_b = ("Noise floor: the MSE expected with no prompt effect (its mean under that null, not a test). MSE p: "
              "each sample's IE and IB scores swapped at random in every cell (20,000 draws), p = P(null MSE >= "
              "MSE). P(MSE >= 5): how often a row with no prompt effect reaches the paper's red mark (Table 2: MSE "
              "5.0 or more) at this n" + (f"; summed over these {len(reds)} rows: {sum(reds):.1f} red rows expected "
                                          f"from noise alone." if reds else "."))
    md_a = f"{title_a}\n{markdown(head_a, rows_a)}\n\n{note_a}"
    md_b = (f"{title_b}\n{markdown(['row', *cols, 'MSE [floor] p', 'P(MSE >= 5) under no effect'], rows_b)}\n\n"
            f"{note_b}")
    header = ["row", "bound", "liu_t_extra", *cols, *[f"{c}_{x}" for c in cols for x in ("lo", "hi")],
              "effective_length_85", "above_floor_length", "retention", "mse", "mse_floor", "mse_p", "mse_p_red5"]
    return md_a, md_b, header, csv_rows


def _diff_text(x: dict | None) -> str:
    if not x or x.get("mean") is None:
        return "-"
    p = "" if x.get("p") is None else f" p={p_text(x['p'])}"
    if not x.get("ci"):
        return f"{x['mean']:+.1f}{p}"
    lo, hi = x["ci"]
    return f"{x['mean']:+.1f} [{lo:+.1f}, {hi:+.1f}]{p}"


def _mse_text(rec: dict) -> str:
    m, f, p = rec.get("mse_ie_ib"), rec.get("mse_floor"), rec.get("mse_p")
    return "-" if m is None else (f"{m:.1f}" + ("" if f is None else f" [{f:.1f}]")
                                  + ("" if p is None else f" p={p_text(p)}"))


def p_text(p):
    from ropescale.evaluation.report.significance import p_text as text

    return text(p)


def table_row(d: Demo, r: Row, st: dict | None, cols: list[str], base_1x: float | None,
              bound: dict | None = None) -> dict:
    """One row of the demo table as its JSON record: the bound (``bound``: another record's, for the F.1 row of
    the same model), training length, answer losses, cells with n (eval samples) and intervals, effective length,
    retention, IE - IB per column with its paired sign-flip p, the MSE with its floor, permutation p and P(MSE >= 5)
    under no prompt effect, and every sample's score per column and prompt (``samples``: {column: {"IE": {id:
    score}, "IB": ...}})."""
    from rope_scaling import RopeSpec
    from ropescale.common.runs import TrainLength, read_train_record
    from ropescale.evaluation.report.significance import mse_sign_flip, paired_sign_flip
    from ropescale.evaluation.report.uncertainty import retention

    record = read_train_record(r.model) if r.train_dir is not None else None
    if bound is None:
        b = row_bound(str(d.model_dir), RopeSpec(r.method, scale=d.scale) if r.flags else None) \
            if r.train_dir is None else row_bound(r.model, None, record or {})
    else:
        b = {k: bound.get(k) for k in ("bound", "pretrain", "liu", "trained_length", "rule")}
    loss = train_losses(r.train_dir) if r.train_dir is not None else None
    tl = TrainLength.of((record or {}).get("length")) if r.train_dir is not None else None
    row = st["row"] if st else {"cells": {}, "estimates": {}, "effective": {}, "retention": None}
    est = row["estimates"]
    diffs = (st or {}).get("diffs", {})
    mse = (st or {}).get("mse")
    samples = {c: v for c, v in (st or {}).get("samples", {}).items() if v[0] or v[1]}
    flips = {c: paired_sign_flip(ie, ib) for c, (ie, ib) in samples.items() if ie and ib}
    mse_test = mse_sign_flip(samples) if samples else None
    return {"row": r.label, "key": r.key, "method": r.method, "fine_tuned": r.train_dir is not None, **b,
            "train_length": tl and tl.to_dict(), "train_length_text": tl and tl.text(),
            "loss_step1": loss and loss[0], "loss_last": loss and loss[1], "steps": loss and loss[2],
            "loss_above": loss is not None and loss[1] > LEARNED,
            "cells": {c: row["cells"].get(c) for c in cols},
            "n": {c: e.n for c, e in est.items() if e.mean is not None},
            "ci": {c: _ci(e) for c, e in est.items() if e.mean is not None},
            "effective_length": {k: v and v.to_dict() for k, v in row["effective"].items()},
            "retention": retention(_first(st, cols), base_1x),
            "ie_minus_ib": {c: x and {"mean": x.mean, "ci": _ci(x), "n_pairs": x.n_pairs,
                                      "p": flips[c].p if c in flips else None} for c, x in diffs.items()},
            "mse_ie_ib": mse and mse.mse, "mse_floor": mse and mse.floor, "mse_ci": _ci(mse),
            "mse_p": mse_test and mse_test.p, "mse_p_red": mse_test and mse_test.extra.get("p_red"),
            "samples": {c: {k: {str(key[-1]): v for key, v in g.items()} for k, g in zip(("IE", "IB"), pair) if g}
                        for c, pair in samples.items()},
            "prompts": "F.2"}

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo", help="where everything goes (default runs/demo)")
    ap.add_argument("--model", default="tiny", help="'tiny' (default) or an HF model directory")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help="RoPE methods to fine-tune (default ntk,yarn; none,pi,ntk,yarn adds the fine-tune without "
                         "scaling and PI's, about 5 minutes more on 2 CPU cores)")
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
                    help="skip the base model's runs with the F.1 baseline prompts (ie / ib; at 1x only)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the fine-tunes, the training pairs, the eval passages and their marks")
    ap.add_argument("--fresh", action="store_true", help="remove earlier demo outputs first")
    args = ap.parse_args(argv)
    from ropescale.common.cli import prepare_process
    from ropescale.common.io import InputError

    prepare_process()  # an entry point like the CLIs it calls in-process: their library warnings filtered alike

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

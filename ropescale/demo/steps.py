"""The demo's steps 1-5 (``python -m ropescale.demo``; :func:`ropescale.demo.run_demo` runs all six): the model,
the data, the fine-tunes, generation and the report; the demo's settings (:class:`DemoSettings`, every flag of its
command line), the :class:`Demo` the steps fill in, its :class:`Row` settings, and what the scripts built on the demo
share (echoed commands, a generation run reused when it is complete, a loop over seeds).

Importing it sets the process environment the demo's runs want (before torch loads; the fine-tune subprocesses
inherit it).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rope_scaling.formulas import PLAIN, REGISTRY
from ropescale.common.paths import REPO_ROOT as ROOT
from ropescale.common.settings import setting

# the demo's process settings (the imports above load neither torch nor transformers)
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
    from ropescale.common.process import DIST_DEFAULTS

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


def scaled(method: str) -> bool:
    """Whether ``method`` changes the model's RoPE (every registry row but the plain one)."""
    return not REGISTRY[method].plain


def tagged(prefix: str, method: str, s_txt: str) -> str:
    """A fine-tune's run or row name: PREFIX-METHOD, with -xS for a scaled method (tiny-none, ft-ntk-x8)."""
    return f"{prefix}-{method}-x{s_txt}" if scaled(method) else f"{prefix}-{method}"


@dataclass
class Row:
    """One evaluated setting: the model it loads, the RoPE flags given at load time, its fine-tune run (if any)."""

    key: str  # run-directory prefix: base, free-ntk-x8, ft-ntk-x8
    label: str  # how the demo table names it
    model: str  # 'tiny', a model dir, or a merged fine-tune
    method: str  # its RoPE method (a registry name; the plain one, none, for the unscaled model)
    flags: tuple = ()  # generate's RoPE flags (training-free rows)
    train_dir: Path | None = None  # fine-tuned rows


def numbers(v) -> list[float]:
    """A list of numbers: a YAML list or comma-separated (``1,2,4,8``)."""
    items = v if isinstance(v, (list, tuple)) else [x for x in re.split(r"[,\s]+", str(v)) if x]
    if any(isinstance(x, bool) for x in items):
        raise ValueError(f"expected numbers (comma-separated), got {v!r}")
    try:
        return [float(x) for x in items]
    except ValueError:
        raise ValueError(f"expected numbers (comma-separated), got {v!r}") from None


def arguments(v) -> list[str]:
    """Command-line words: a YAML list as it is, a string split as a shell does (``'--max-steps 4'``)."""
    return [str(x) for x in v] if isinstance(v, (list, tuple)) else shlex.split(str(v))


def at_least(n):
    """A setting's check: the value is at least ``n``."""
    return (lambda v: v >= n), f">= {n}"


POSITIVE = ((lambda v: v > 0), "> 0")


@dataclass
class DemoSettings:
    """What one demo run is asked: the flags of ``python -m ropescale.demo`` (``scripts/demo.py``), a ``--recipe``
    key each (train_lo, train_hi, chapters, heldout: recipes and callers only). Recorded in report/demo.json. The
    order is :class:`Demo`'s."""

    out: str = setting("runs/demo", "where everything goes (default runs/demo)")
    model: str = setting("tiny", "'tiny' (default) or an HF model directory")
    methods: list[str] = setting(list(METHODS), "RoPE methods to fine-tune (default ntk,yarn; none,pi,ntk,yarn adds "
                                 "the fine-tune without scaling and PI's, about 5 minutes more on 2 CPU cores)")
    free: list[str] = setting(list(FREE), "RoPE methods to evaluate applied at load time, without fine-tuning "
                              "(default pi,ntk,yarn; '' for none)")
    scale: float = setting(8.0, "scale factor of every method (default 8)", check=POSITIVE)
    factors: list[float] = setting([1.0, 2.0, 4.0, 8.0], "eval lengths as multiples of the original context",
                                   parse=numbers, check=POSITIVE, show_default=False)
    samples: int = setting(16, "eval samples per length (default 16)", check=at_least(1))
    max_new_tokens: int = setting(128, "the references are four marked sentences (~100 tokens), so 128 rather than "
                                  "400; the eval sets hold only references that fit (data_concat recall "
                                  "--max-answer-tokens)", check=at_least(1), show_default=False)
    train_lo: float = setting(2.0, "the shortest training sample, a multiple of the original context", cli=False,
                              check=POSITIVE)
    train_hi: float = setting(4.0, "the longest training sample, a multiple of the original context", cli=False,
                              check=POSITIVE)
    pairs: int = setting(256, "fine-tuning pairs (default 256)", check=at_least(1))
    launcher: str = setting("deepspeed", "how each fine-tune starts: the deepspeed launcher, or python finetune.py "
                            "(one process, no launcher)", choices=("deepspeed", "python"))
    finetune_args: list[str] = setting([], "extra finetune.py flags, e.g. '--max-steps 4'", parse=arguments,
                                       show_default=False)
    seed: int = setting(0, "seed of the fine-tunes, the training pairs, the eval passages and their marks",
                        show_default=False)
    chapters: str | None = setting(None, "the chapters file (default the shared novels' chapters.jsonl)", cli=False)
    heldout: int | None = setting(None, "held-out chapters per book of a model given (default "
                                  "ropescale.common.recall.HELDOUT); the tiny default's are those its build kept",
                                  cli=False)
    baseline_prompts: bool = setting(True, "the base model's runs with the F.1 baseline prompts (ie / ib; at 1x "
                                     "only)", negative="--no-baseline-prompts")
    fresh: bool = setting(False, "remove earlier demo outputs first", show_default=False)


@dataclass
class Demo(DemoSettings):
    """One demo run: its settings (:class:`DemoSettings`' fields, :meth:`of`; ``out`` a Path, ``chapters`` the
    file), then what each step adds for the next."""

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

    def __post_init__(self):
        from ropescale.common.paths import CHAPTERS_JSONL

        self.out = Path(self.out)
        self.chapters = str(self.chapters or CHAPTERS_JSONL)

    @classmethod
    def of(cls, settings: DemoSettings) -> Demo:
        """The run of these settings (nothing run yet)."""
        return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(DemoSettings)})

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
    d.rows = [Row("base", f"{name} (no fine-tune)", base_model, PLAIN)]
    d.rows += [Row(f"free-{m}-x{d.s_txt}", f"{name}, {m} x{d.s_txt} at load time", base_model, m,
                   ("--rope", m, "--scale", d.s_txt)) for m in d.free]
    for m in d.methods:
        train_dir = d.out / "train" / (tagged(name, m, d.s_txt) + (f"-s{d.seed}" if d.seed else ""))
        d.merged[m] = merged = train_dir / "merged"
        say(f"step 3/6: fine-tuning {f'with {m} x{d.s_txt}' if scaled(m) else 'without RoPE scaling'} "
            f"({d.launcher}), then merging into {rel(merged)}")
        d.rows.append(Row(tagged("ft", m, d.s_txt),
                          f"fine-tuned, {f'{m} x{d.s_txt}' if scaled(m) else 'no RoPE change'}", str(merged), m,
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
    ft = ["finetune.py"] + (["--rope", method, "--scale", d.s_txt] if scaled(method) else ["--allow-extrapolation"])
    ft += ["--data", str(d.packed), "--out", str(train_dir), "--seed", str(d.seed)]
    if d.model != "tiny":
        ft += ["--model", str(d.model_dir)]
    if train_dir.exists():  # an interrupted earlier demo run: continue it
        ft += ["--resume", "auto"]
    ft += list(d.finetune_args)
    if d.launcher == "deepspeed":  # a free rendezvous port: 29500 may be taken by another job
        from ropescale.common.process import free_port

        return [str(Path(py).parent / "deepspeed"), "-q", "--master_port", str(free_port())] + ft
    return [py] + ft


def generation(d: Demo) -> None:
    """Step 4: greedy generation of every row with both F.2 prompts at every length, and of the base model with the
    F.1 baseline prompts at 1x (:attr:`Demo.f1_targets`)."""
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
            generate_run(d, r.model, r.flags, pr, tg, where / f"{r.key}_{pr}_T{tg}")
    d.times["generation"] = time.time() - t
    say(f"generation done in {d.times['generation']:.0f}s")


def generate_run(d: Demo, model: str, flags, prompt: str, target: int, out: Path) -> Path:
    """``eval_summ.py generate``, greedy, of ``model`` (with the RoPE ``flags`` at load time) on the demo's eval set of
    length ``target`` with ``prompt``, into ``out`` (a run there is resumed); returns ``out``."""
    from ropescale.evaluation.cli import main as eval_main

    in_process("python eval_summ.py", eval_main, [
        "generate", "--model", model, *flags, "--data", str(d.evals[target]), "--prompt", prompt,
        "--max-new-tokens", str(d.max_new_tokens), "--out", str(out)])
    return out


def generate_once(d: Demo, model: str, flags, prompt: str, target: int, out: Path) -> Path:
    """:func:`generate_run` unless ``out`` holds a complete run already (then nothing runs or prints)."""
    run = out / "run.json"
    if (out / "predictions.jsonl").is_file() and run.is_file() and json.loads(
            run.read_text(encoding="utf-8")).get("status") == "complete":
        return out
    return generate_run(d, model, flags, prompt, target, out)


def reports(d: Demo) -> None:
    """Step 5: scores and the report of the F.2 runs (with Fig. 3), the F.1 runs in a report of their own."""
    from ropescale.evaluation.report.cli import make_report

    say("step 5/6: scoring (CNNSum ROUGE-L) and the report: extrapolation table (ROUGE-L x100 by eval length; rows: "
        "model, RoPE method, scale, training length), Table 2 (IE/IB averages, MSE), exact recall per mark, failure "
        "modes, Fig. 3; the F.1 (baseline prompt) runs in a report of their own")
    show(["python", "eval_summ.py", "report", str(d.gen), "--out", str(d.report), "--plot", str(d.fig)])
    make_report([d.gen], out_dir=d.report, plot=d.fig, overwrite=True)  # the demo's own runs/demo
    if d.baseline_prompts:
        show(["python", "eval_summ.py", "report", str(d.gen_f1), "--out", str(d.report / "baseline_prompts")])
        make_report([d.gen_f1], out_dir=d.report / "baseline_prompts", overwrite=True)
    for view in ("extrapolation", "recall"):
        p = d.report / f"{view}.md"
        if p.is_file():  # recall.md: the exact recall per mark, where the report writes it
            print()
            print(p.read_text(encoding="utf-8").strip())


def over_seeds(seeds: str, one: Callable[[int], dict], log: Callable[[str], None],
               then: Callable[[int, dict], None] | None = None) -> list[dict]:
    """``one(seed)`` for each of the comma-separated ``seeds``, its stdout to stderr (the demo's steps echo their
    commands: logs, not results); each record gets its ``seconds``, then ``then(seed, record)`` runs (writing it)
    and ``log`` says the seed's time."""
    recs = []
    for s in (int(x) for x in seeds.split(",") if x):
        t = time.time()
        with contextlib.redirect_stdout(sys.stderr):
            rec = one(s)
        rec["seconds"] = round(time.time() - t, 1)
        if then is not None:
            then(s, rec)
        log(f"seed {s}: {rec['seconds']:.0f} s")
        recs.append(rec)
    return recs

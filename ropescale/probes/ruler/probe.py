"""ruler: RULER's synthetic tasks (Hsieh et al. 2024, arXiv 2404.06654) and the needle depth x length grid, on any
model and RoPE method (the usual --rope/--scale flags).

Tasks (``--tasks``, RULER's configurations: ropescale.probes.ruler.tasks): niah_single_1 (noise haystack),
niah_single_2 (novel haystack), niah_multikey_1 (distractor needles), niah_multivalue, niah_multiquery, vt (variable
tracking), cwe (common words), fwe (frequent words), and niah_grid (niah_single_1 with the needle at each of
``--depths`` depths, 0..100 %). Texts in English or Chinese (``--lang auto``: Chinese for a tokenizer that spells
English letter by letter, as the tiny default's). A length counts every token the model reads: template, haystack,
question, answer prefix and the answer budget.

Each sample is scored teacher-forced (``(tf)`` rows: the share of its references whose every token is the argmax,
with the answer's log-probability) and by greedy generation (``(gen)`` rows: RULER's string_match_all; _part
recorded), both a share in [0, 1], from one prefill (ropescale.probes.ruler.score). items.jsonl has one record a
sample and way; summary.json adds the RULER average over the tasks per length and the effective lengths
(ropescale.probes.ruler.tables: ``python -m ropescale.probes.ruler.tables DIR...`` writes the tables and the
needle heatmaps of several runs); ruler-TASK.jsonl and ruler-average.jsonl, one a task, are the scores an experiment
reads (ropescale.probes.ruler.score_files).
"""
from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rope_scaling import RopeSpec
from rope_scaling.formulas import REGISTRY
from ropescale.common.io import InputError
from ropescale.common.paths import DATA_DIR
from ropescale.common.settings import setting

from ..command import register_probe
from ..common import POSITIVE, ProbeRun, ProbeSettings, progress
from ..data import load_docs
from .base import detect_lang, make_context
from .score import read_sample
from .score_files import write_score_files
from .tables import summary_extra
from .tasks import GRID, TASKS, check_tasks, make_sample

AUSTEN = DATA_DIR / "english" / "austen"
SCORES = ("both", "tf", "gen")


@dataclass(frozen=True)
class RulerSettings(ProbeSettings):
    lengths: list[int] | None = setting(None, "total lengths L (every token the model reads, the answer budget "
                                              "included), comma-separated; default: 1x, 2x, 4x, 8x the original "
                                              "context", check=POSITIVE, metavar="L,L,...")
    tasks: list[str] = setting(list(TASKS) + [GRID], "tasks, comma-separated", check=(
        lambda t: t in TASKS or t == GRID, f"among {', '.join(list(TASKS) + [GRID])}"))
    depths: int = setting(11, "niah_grid: needle depths, evenly from 0 to 1 (a share of the haystack)",
                          check=(lambda v: v >= 2, "at least 2"))
    grid_n: int = setting(0, "niah_grid: samples a depth x length cell (0: --n)", check=(lambda v: v >= 0,
                                                                                     "not be negative"))
    lang: str = setting("auto", "template language (auto: by the tokenizer)", choices=("auto", "en", "zh"))
    score: str = setting("both", "tf: teacher-forced; gen: generation with RULER's string_match_all; both",
                         choices=SCORES)
    english: str = setting(str(AUSTEN), "English novel haystack: a .txt file or a folder of them", metavar="PATH",
                           show_default=False)
    max_new_tokens: int = setting(0, "generation budget (0: RULER's per task: niah 128, vt 30, cwe 120, fwe 50); "
                                     "never below the answer's tokens", check=(lambda v: v >= 0, "not be negative"))
    share_prefill: bool = setting(True, "one prefill serves the teacher-forced answer and the generation (off: "
                                        "separate forwards, to measure the saving)", resume="ignore")


def english_texts(path: str) -> list[str]:
    p = Path(path)
    files = sorted(p.glob("*.txt")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise InputError("no English text (.txt) there", p)
    return [f.read_text(encoding="utf-8") for f in files]


def grid_depths(k: int) -> list[float]:
    """``k`` depths evenly from 0 to 1, rounded to 0.1 %."""
    return [round(i / (k - 1), 3) for i in range(k)]


def plan(s: RulerSettings, lengths: list[int]) -> list[tuple]:
    """(task, length, index, depth) of every sample, by length."""
    out = []
    for L in sorted(lengths):
        for t in s.tasks:
            if t == GRID:
                out += [(t, L, i, d) for d in grid_depths(s.depths) for i in range(s.grid_n or s.n)]
            else:
                out += [(t, L, i, None) for i in range(s.n)]
    return out


def item_id(task: str, L: int, i: int, depth, way: str) -> str:
    d = "" if depth is None else f":d{round(depth * 1000)}"
    return f"{task}:L{L}{d}:{i}:{way}"


def ruler_probe(loaded, docs, settings: RulerSettings | None = None, **fields) -> dict:
    """Run the ruler probe into ``settings.out``; returns the summary (cells: task (way) x length)."""
    from ..common import probe_settings

    s = probe_settings(RulerSettings, settings, fields)
    lengths = s.lengths or [loaded.orig_ctx * m for m in (1, 2, 4, 8)]
    check_tasks(s.tasks)
    lang = detect_lang(loaded.tokenizer) if s.lang == "auto" else s.lang
    texts = english_texts(s.english) if lang == "en" else [d.text for d in docs]
    s = dataclasses.replace(s, lengths=lengths, lang=lang)
    ctx = make_context(loaded.tokenizer, lang, texts)
    ways = ("tf", "gen") if s.score == "both" else (s.score,)
    by_length = REGISTRY[RopeSpec.from_record(loaded.rope).method].by_length
    metric = ("score (share of references): tf = references read teacher-forced, gen = RULER string_match_all of "
              "greedy generation")
    run = ProbeRun("ruler", loaded, s, lengths, metric=metric, column="length L (tokens, answer budget included)",
                   cell_kind="share")
    todo = [p for p in plan(s, lengths) if not all(run.done(item_id(*p, w)) for w in ways)]
    eos = loaded.tokenizer.eos_token_id
    t_read = c_read = 0.0
    for task, L, i, depth in progress(todo, "ruler"):
        sample = make_sample(ctx, task, L, i, s.seed, depth, s.max_new_tokens)
        t0, c0 = time.monotonic(), time.process_time()
        res = read_sample(loaded.model, sample, loaded.tokenizer, teacher="tf" in ways, generate="gen" in ways,
                          shared=s.share_prefill and not by_length, eos_id=eos)
        t_read += time.monotonic() - t0
        c_read += time.process_time() - c0
        base = {"task": task, "col": L, "index": i, "depth": depth, "tokens": sample.total,
                "prompt_tokens": len(sample.prompt), "budget": sample.budget, "refs": sample.refs,
                "info": {k: v for k, v in sample.info.items() if k not in ("keys",)}}
        for w in ways:
            value = res["tf_all"] if w == "tf" else res["match_all"]
            keep = ("tf_all", "tf_read", "answer_logprob", "answer_tokens", "ref_loss", "token_acc") if w == "tf" \
                else ("pred", "generated", "match_all", "match_part")
            run.add({"id": item_id(task, L, i, depth, w), "group": f"{task} ({w})", "value": value, "way": w,
                     **base, **{k: res[k] for k in keep}})
    if todo:
        how = "shared" if s.share_prefill and not by_length else "separate"
        print(f"[ruler] {len(todo)} samples read in {t_read:.1f} s, {c_read:.1f} s of CPU ({how} prefill)",
              file=sys.stderr)
    write_score_files(run.dir.path, run.log.records())  # before run.json says complete: a complete run has them
    return run.finish(summary_extra(run.log.records(), lengths, loaded.orig_ctx) | {"read_seconds": round(t_read, 2),
                                                                                "read_cpu_seconds": round(c_read, 2)})


def load_ruler(s: RulerSettings):
    """The Chinese novel haystack (``--data``; the tiny build's held-out chapters by default)."""
    return load_docs(s.data)


def register(sub) -> None:
    register_probe(sub, "ruler", RulerSettings, more="docs/ruler.md", description=__doc__, load=load_ruler,
                   help="RULER's synthetic tasks and the needle depth x length grid (Hsieh et al. 2024)",
                   run=ruler_probe)

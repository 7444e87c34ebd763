"""``python -m rope_scaling search`` (also ``ropescale rope search``): LongRoPE's evolutionary search of per-pair
rescale factors for a model, a scale and a target length, on your own text.

The fitness of a candidate is the ppl probe's measure: the mean loss (nats/token) of the last ``--score-tokens``
tokens of ``--windows`` windows of ``--target-len`` tokens (default: the original context x the scale) drawn once
from ``--data`` (default with the tiny default model: the chapters its build held out from training), scored by
the probes' scorer (``ropescale.probes.scorer``). The model is loaded once, unscaled; a candidate only changes the
rotary frequencies (the runtime rope hook, ``compat.install_length_rope``: every forward runs the candidate as
``--rope longrope`` would with those factors as its long factors: the registry's formula, attention factor
sqrt(1 + ln s / ln orig)). The search itself (seeds PI / NTK / YaRN, monotone candidates, mutation and crossover,
its settings) is ``rope_scaling.search``.

The run directory (``--out``): ``run.json`` (kind ``rope-search``: the settings, the windows drawn, the fitness
per generation, the seeds' and the best fitness), ``search_state.json`` (the whole search, resumable) and
``factors.json`` (the best candidate so far as a ``--longrope-factors`` file), all rewritten atomically after
every generation. ``--resume auto`` continues a stopped or finished run in the same directory with the same
settings (only the budget may change: ``--budget MINUTES`` / ``--evals N`` count over the whole search); another
setting is refused. Progress on stderr, the result on stdout (``--json``: one object).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rope_scaling import RopeSpec
from rope_scaling.search import SearchSettings, factors_of, initial_factors, run_search
from ropescale.common.cli import add_command, add_json, add_resume, print_result
from ropescale.common.io import InputError
from ropescale.common.settings import add_settings, check, from_args, given, nested, setting

from .common import data_setting

KIND = "rope-search"
STATE, FACTORS = "search_state.json", "factors.json"
_POSITIVE = (lambda v: v > 0, "positive")
_IGNORE = "ignore"
GROUP = "search: model, data and fitness"


@dataclass(frozen=True)
class SearchRunSettings:
    """What ``rope_scaling search`` takes: the model, the text, the fitness windows, and the search
    (:class:`~rope_scaling.search.SearchSettings`, nested: its flags sit beside these)."""

    model: str = setting("tiny", "HF model directory, or 'tiny' (the embedded default); searched unscaled",
                         resume="path", group=GROUP)
    out: str | None = setting(None, "run directory to write (--resume auto continues the run in it)", metavar="DIR",
                              required=True, resume=_IGNORE, group=GROUP)
    data: str = data_setting("the text whose loss is the fitness: documents JSONL ({text} or {context}) or "
                             "chapters JSONL (one document per book)")
    tail_chapters: int = setting(0, "chapters data: keep only each book's last N chapters",
                                 check=(lambda v: v >= 0, "not be negative"), group=GROUP)
    scale: float = setting(8.0, "the context extension factor s the factors are searched for (max factor: 1.25 s)",
                           check=(lambda v: v > 1, "> 1"), metavar="S", group=GROUP)
    target_len: int | None = setting(None, "tokens per fitness window; default: the original context x the scale",
                                     check=_POSITIVE, metavar="N", group=GROUP)
    windows: int = setting(2, "fitness windows, drawn once from the data (seeded by --window-seed)",
                           check=_POSITIVE, metavar="N", group=GROUP)
    score_tokens: int | None = setting(None, "the last K tokens of each window whose mean loss is the fitness; "
                                             "default: the original context", check=_POSITIVE, metavar="K",
                                       group=GROUP)
    window_seed: int = setting(0, "seed of the window draw (the search's own is --seed)", metavar="N", group=GROUP)
    batch_size: int = setting(1, "windows per forward pass", check=_POSITIVE, resume=_IGNORE, group=GROUP)
    threads: int = setting(0, "torch CPU threads (0: torch's default)", check=(lambda v: v >= 0, "not be negative"),
                           resume=_IGNORE, group=GROUP)
    search: SearchSettings = nested(SearchSettings)


# ---------------------------------------------------------------- the fitness
@dataclass
class Window:
    """A fitness window: ``target_len`` tokens of document ``doc`` ending at ``end``, the last ``k`` scored."""

    doc: str
    start: int
    prefix: list[int]
    target: list[int]

    def record(self) -> dict:
        return {"doc": self.doc, "start": self.start, "tokens": len(self.prefix) + len(self.target),
                "scored": len(self.target)}


def draw_windows(tokenizer, docs, n: int, target_len: int, k: int, seed: int) -> list[Window]:
    """``n`` windows of ``target_len`` tokens whose last ``k`` are scored: the ppl probe's target spans
    (``probes.targets.sample_targets``, the same seeded draw) with ``target_len - k`` tokens before each."""
    from .targets import sample_targets, tokenize_docs

    doc_ids = tokenize_docs(tokenizer, docs)
    out = []
    for t in sample_targets(doc_ids, docs, n, target_len - k, k, seed):
        ids = doc_ids[t.doc]
        out.append(Window(docs[t.doc].id, t.start - (target_len - k), ids[t.start - (target_len - k):t.start],
                          ids[t.start:t.start + k]))
    return out


def longrope_rule(state, scale: float, factors):
    """rule(L) -> (inv_freq, attention factor) of ``--rope longrope`` with ``factors`` (a candidate: its long
    factors) at the model's original context and ``scale``: the registry's formula, what a written config runs."""
    from rope_scaling.formulas import frequencies

    spec = RopeSpec("longrope", scale, orig_ctx=state.orig_ctx, longrope_factors=factors_of(factors))

    def rule(L: int):
        f = frequencies(spec, state.rotary_dim, state.base, L)
        return f.inv_freq, f.attention_factor

    return rule


def window_loss(loaded, windows: list[Window], batch_size: int) -> float:
    """The mean loss (nats/token) of the windows' scored tokens under the rope the model runs now (the probes'
    scorer)."""
    import torch

    from .scorer import score_continuations

    with torch.no_grad():
        scores = score_continuations(loaded.model, [w.prefix for w in windows], [w.target for w in windows],
                                     batch_size=batch_size, pad_id=loaded.pad_id)
    return sum(sc.loss for sc in scores) / len(scores)


def candidate_fitness(loaded, state, scale: float, windows: list[Window], batch_size: int, log):
    """fitness(factors): the windows' loss with the candidate's frequencies in every rotary module (no reload)."""
    from ropescale.common.compat import rope as compat

    count = [0]

    def fitness(factors) -> float:
        compat.install_length_rope(loaded.model, longrope_rule(state, scale, factors))
        t = time.monotonic()
        x = window_loss(loaded, windows, batch_size)
        count[0] += 1
        log(f"[search] evaluation {count[0]}: loss {x:.4f} ({time.monotonic() - t:.1f} s)")
        return x

    return fitness


# ---------------------------------------------------------------- the run
class SearchRun:
    """The run directory of one search (see module doc): checked before any work, written each generation."""

    def __init__(self, s: SearchRunSettings, loaded, windows: list[Window], *, resume: str):
        from ropescale.common.runs.identity import model_ref
        from ropescale.common.runs.record import RunDir, RunRecord, settings_record
        from ropescale.common.runs.resume import check_resume, check_resume_mode, open_run_dir

        out, old = open_run_dir(s.out, KIND)
        check_resume_mode(old, resume, hint="; --budget / --evals may change")
        self.dir, self.old = RunDir(out), old
        self.t0, self.before = time.time(), (old.seconds if old is not None else 0.0)
        model = model_ref(loaded.name, loaded.path)
        settings = dataclasses.replace(s, model=model)
        if old is not None:
            check_resume(old, _with_budget_of(old, settings), model_id=loaded.model_id, hint="use a new --out")
        self.rec = RunRecord(KIND, model=model, model_id=loaded.model_id, rope=RopeSpec().to_dict(),
                             context=loaded.orig_ctx, train=loaded.train, data=s.data,
                             settings=settings_record(settings), seconds=self.before,
                             info={"orig_ctx": loaded.orig_ctx, "windows": [w.record() for w in windows],
                                   "fitness": "mean loss (nats/token) of each window's last tokens"})
        if old is not None:
            self.rec.created = old.get("created", self.rec.created)

    def state(self) -> dict | None:
        """The search state to continue (None for a new run)."""
        from ropescale.common.io import read_json

        if self.old is None or not (self.dir.path / STATE).is_file():
            return None
        return read_json(self.dir.path / STATE, "search state")

    def checkpoint(self, state: dict) -> None:
        """Write the state, the best factors so far and run.json (each atomically)."""
        self.dir.path.mkdir(parents=True, exist_ok=True)
        self.dir.write_json(STATE, state)
        if state.get("best"):
            self.dir.write_json(FACTORS, factors_of(state["best"]["factors"]).to_json())
        self.rec.status = "complete" if state.get("done") else "running"
        self.rec.seconds = round(self.before + time.time() - self.t0, 2)
        self.rec.info.update(result_of(state))
        self.dir.write_record(self.rec)


def _with_budget_of(old, settings: SearchRunSettings) -> SearchRunSettings:
    """``settings`` with the budget ``old`` recorded: the one thing a resume may change (the nested search settings
    are compared as a whole, so their budget fields are matched here)."""
    rec = old.settings or {}
    return dataclasses.replace(settings, search=dataclasses.replace(
        settings.search, budget_evals=rec.get("budget_evals"), budget_minutes=rec.get("budget_minutes")))


def result_of(state: dict) -> dict:
    """What run.json and stdout say: the fitness per generation, the seeds' and the best fitness."""
    fit = {tuple(f): x for f, x in state["evaluated"]}
    seeds = {name: fit.get(tuple(f)) for name, f in state["init"].items()}
    best = state.get("best") or {}
    return {"curve": state["curve"], "evaluations": len(state["evaluated"]), "seed_fitness": seeds,
            "best_fitness": best.get("fitness"), "best_factors": best.get("factors"),
            "stopped_by": state.get("stopped_by"), "search_seconds": round(state["elapsed_s"], 2)}


def prepare(s: SearchRunSettings, log):
    """Check --out, read the data, load the model unscaled (a config that already carries scaling is refused), draw
    the windows. Returns (loaded, rope state, windows, target length)."""
    from rope_scaling.hf import rope_state
    from ropescale.common.io import check_output_dir
    from ropescale.common.runs.resume import claim_run_dir

    from .common import load_model, set_threads
    from .data import load_docs

    claim_run_dir(check_output_dir(s.out), KIND)  # a foreign --out is refused before the model loads
    set_threads(s.threads)
    docs = load_docs(s.data, s.tail_chapters)
    loaded = load_model(s.model, RopeSpec())
    state = rope_state(loaded.model.config)
    if state.spec.scaled:
        raise InputError(f"the search starts from an unscaled model; this one carries {state.spec.label()}",
                         Path(loaded.path) / "config.json")
    target = s.target_len or int(round(state.orig_ctx * s.scale))
    k = s.score_tokens or state.orig_ctx
    if target <= state.orig_ctx:
        raise InputError(f"--target-len {target} must exceed the original context {state.orig_ctx} (the long "
                         f"factors apply only past it)")
    if k >= target:
        raise InputError(f"--score-tokens {k} must be below --target-len {target}")
    windows = draw_windows(loaded.tokenizer, docs, s.windows, target, k, s.window_seed)
    log(f"[search] {loaded.name}: {len(windows)} window(s) of {target} tokens, the last {k} scored; "
        f"x{s.scale:g} over the original {state.orig_ctx}")
    return loaded, state, windows, target


def search(s: SearchRunSettings, *, resume: bool | str = False, log=None) -> dict:
    """Run (or continue) a search into ``s.out``; returns the result (:func:`result_of` plus the factor file)."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    check(s)
    s.search.check_budget()
    loaded, state, windows, _ = prepare(s, log)
    run = SearchRun(s, loaded, windows, resume=resume if isinstance(resume, str) else "auto" if resume else "never")
    init = initial_factors(state.rotary_dim, state.base, s.scale, state.orig_ctx)

    logged = [None]

    def checkpoint(st: dict) -> None:
        run.checkpoint(st)
        c = st["curve"][-1] if st["curve"] else None
        if c is not None and c != logged[0]:
            logged[0] = c
            log(f"[search] generation {c['generation']}: best {c['best']:.4f} after {c['evaluations']} evaluations "
                f"({c['elapsed_s']:.0f} s)")

    final = run_search(candidate_fitness(loaded, state, s.scale, windows, s.batch_size, log), init, s.search,
                       scale=s.scale, state=run.state(), checkpoint=checkpoint, where=run.dir.path / STATE)
    return {**result_of(final), "factors_file": str(run.dir.path / FACTORS), "run_dir": str(run.dir.path)}


def summary_text(r: dict) -> str:
    seeds = ", ".join(f"{k} {v:.4f}" for k, v in r["seed_fitness"].items() if v is not None and math.isfinite(v))
    return (f"best fitness {r['best_fitness']:.4f} (seeds: {seeds}) after {r['evaluations']} evaluations, "
            f"{len([c for c in r['curve'] if not c.get('partial')])} generation(s), {r['search_seconds']:.0f} s "
            f"(stopped by {r['stopped_by']})\nfactors: {r['factors_file']}  (--rope longrope --scale S "
            f"--longrope-factors FILE)")


# ---------------------------------------------------------------- CLI
def register(sub) -> None:
    p = add_command(sub, "search", help="LongRoPE search of per-pair factors for a model, a scale and a length",
                    description=__doc__.split("\n\n", 1)[1].strip())
    add_settings(p, SearchRunSettings)
    add_resume(p, "never")
    add_json(p, "the result")
    p.set_defaults(func=cmd_search)


def settings_from_args(args: argparse.Namespace) -> SearchRunSettings:
    """defaults < --recipe < flags; without --data, a tiny build reads the chapters it held out."""
    from .data import heldout_default

    return heldout_default(from_args(args, SearchRunSettings), "data" in given(args, SearchRunSettings),
                           log=lambda m: print(m.replace("[probes]", "[search]"), file=sys.stderr))


def cmd_search(args: argparse.Namespace) -> int:
    r = search(settings_from_args(args), resume=args.resume)
    return print_result(r, args.json, lambda: summary_text(r))

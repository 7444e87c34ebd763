"""The report's views as tables (``ropescale.common.tables.Table``): markdown (every view), CSV (one view) or JSON,
and the files ``--out`` writes (through the one table writer, ``tables.write_tables``). Every score cell of Table 2,
Table 7 and the extrapolation table carries its n and 95 % interval (``ropescale.common.stats.means``: Student's t
over the samples) in every format: markdown ``mean [lo, hi]`` with an n column
(``--no-intervals``: the means alone, :class:`Options`), CSV ``<col>_n, <col>_lo, <col>_hi`` beside each ``<col>``,
JSON ``n`` and ``ci``. The failure-mode and recall views give shares with their n and no interval."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ropescale.common.io import InputError
from ropescale.common.tables import FORMATS, Table, number, tables_text, write_tables

from .model import FLOOR, Report

VIEWS = ("all", "table2", "table7", "extrapolation", "failures", "recall")

_f = number(2, "-")


@dataclass(frozen=True)
class Options:
    """How the views are drawn: ``intervals``: markdown cells with their 95 % interval (the default; JSON and CSV
    always carry them); ``threshold``: the fixed score of the absolute effective length (``--effective-threshold``,
    RULER's rule; RULER's own effective length when it is a reference model's score on the task, as RULER's 85.6;
    None: only NoLiMa's relative one)."""

    intervals: bool = True
    threshold: Optional[float] = None


def _ci(e: Any) -> Optional[list]:
    return None if e is None or e.lo is None else [_r(e.lo), _r(e.hi)]


def _est_text(e: Any, intervals: bool, sign: bool = False) -> str:
    """A markdown cell: the mean (2 digits), with ``intervals`` its interval (1 digit); ``-`` for none."""
    if e is None or e.mean is None:
        return "-"
    m = f"{e.mean:+.2f}" if sign else f"{e.mean:.2f}"
    if not intervals or e.lo is None:
        return m
    return f"{m} [{e.lo:.1f}, {e.hi:.1f}]"


def _n_text(ests: list) -> str:
    ns = sorted({e.n for e in ests if e is not None and e.mean is not None})
    return "-" if not ns else str(ns[0]) if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"


def _r(v: Optional[float], nd: int = 4) -> Optional[float]:
    return None if v is None else round(v, nd)


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def table2(rep: Report, opts: Options = Options()) -> Table:
    """Table 2: per subset the average of the two prompts (n, interval), MSE(P-IE vs P-IB) with its noise floor and
    interval; beside each subset IE - IB with its paired t interval (markdown: with intervals)."""
    t2 = rep.table2()
    cols = rep.columns
    by_label = {rep.label(s): s for s in rep.series}
    diffs = {label: {c: rep.difference(by_label[label], c) for c in d["avg"]} for label, d in t2.items()}
    mses = {label: rep.mse(by_label[label]) for label in t2}
    avgs = {label: {c: rep.estimate(by_label[label], c) if d["avg"].get(c) is not None else None for c in cols}
            for label, d in t2.items()}
    header = (["model"] + cols + ["mse", "mse_floor", "mse_lo", "mse_hi"]
              + [f"{c}_{x}" for c in cols for x in ("n", "lo", "hi")]
              + [f"{c}_{x}" for c in cols for x in ("ie_minus_ib", "ie_minus_ib_lo", "ie_minus_ib_hi")])
    rows = []
    for label, d in t2.items():
        m = mses[label]
        dd = [diffs[label].get(c) for c in cols]
        ee = [avgs[label][c] for c in cols]
        rows.append([label] + [_r(d["avg"].get(c)) for c in cols] + [_r(d["mse"]), _r(m.floor), _r(m.lo), _r(m.hi)]
                    + [x for e in ee for x in ((e.n or None, _r(e.lo), _r(e.hi)) if e is not None else (None,) * 3)]
                    + [_r(getattr(x, a, None)) for x in dd for a in ("mean", "lo", "hi")])
    md_header = ["model"] + (cols if not opts.intervals else [h for c in cols for h in (c, f"{c} IE-IB")]) + [
        "mse", "mse floor", "n"]
    md_rows = []
    for label, d in t2.items():
        cells = []
        for c in cols:
            e = avgs[label][c]
            cells.append(_est_text(e, opts.intervals) if e is not None else "-")
            if opts.intervals:
                cells.append(_est_text(diffs[label].get(c), True, sign=True))
        md_rows.append([label] + cells + [_f(d["mse"]), _f(mses[label].floor),
                                          _n_text([e for e in avgs[label].values() if e is not None])])
    note = ""
    if any(x is None for d in t2.values() for x in d["avg"].values()):
        note = ("'-': a subset scored with only one of the two prompts has no average (and the model no MSE); the "
                "Table 7 view shows the single prompt's score.")
    note += (" MSE floor: the MSE(P-IE vs P-IB) expected with no prompt effect, from the cells' standard errors; an "
             "MSE near it is what noise alone gives." if any(m.floor is not None for m in mses.values()) else "")
    js = {label: {"avg": {c: _r(v) for c, v in d["avg"].items()}, "mse": _r(d["mse"]),
                  "n": {c: e.n for c, e in avgs[label].items() if e is not None},
                  "ci": {c: _ci(e) for c, e in avgs[label].items() if e is not None},
                  "mse_floor": _r(mses[label].floor), "mse_ci": _ci(mses[label]),
                  "IE": {c: _r(v) for c, v in d["IE"].items()}, "IB": {c: _r(v) for c, v in d["IB"].items()},
                  "ie_minus_ib": {c: _diff_json(x) for c, x in diffs[label].items()}}
          for label, d in t2.items()}
    return Table("table2", "Table 2 view: average of Prompt-IE and Prompt-IB (ROUGE-L) and MSE (P-IE vs P-IB)",
                 header, rows, _f, (md_header, md_rows), js, note.strip())


def _diff_json(x: Any) -> Optional[dict]:
    if x is None:
        return None
    return {"mean": _r(x.mean), "ci": _ci(x), "se": _r(x.se), "n_pairs": x.n_pairs,
            "unpaired_ie": list(x.unpaired_ie), "unpaired_ib": list(x.unpaired_ib)}


def table7(rep: Report, opts: Options = Options()) -> Table:
    """Table 7: Prompt-IE and Prompt-IB side by side; each cell's n and interval (markdown: the interval unless
    ``--no-intervals``, the n in its own column)."""
    md_header = ["model"] + [f"{c} (IE / IB)" for c in rep.columns] + ["n"]  # one row per model, "IE / IB" a cell
    md_rows = [[rep.label(s)] + [" / ".join(_est_text(rep.estimate(s, c, k), opts.intervals) if opts.intervals
                                            else _f(rep.value(s, k, c)) for k in ("IE", "IB")) for c in rep.columns]
               + [_n_text([rep.estimate(s, c, k) for c in rep.columns for k in ("IE", "IB")])]
               for s in rep.series]
    rows, js = [], []
    for r in rep.table7():
        s, k = r["series"], r["kind"]
        est = {c: rep.estimate(s, c, k) for c in rep.columns}
        rows.append([rep.label(s), k] + [_r(r["values"][c]) for c in rep.columns]
                    + [x for c in rep.columns for x in (est[c].n or None, _r(est[c].lo), _r(est[c].hi))])
        js.append({"model": rep.label(s), "prompt": k,
                   "values": {c: _r(v) for c, v in r["values"].items() if v is not None},
                   "n": {c: e.n for c, e in est.items() if e.mean is not None},
                   "ci": {c: _ci(e) for c, e in est.items() if e.mean is not None}})
    header = ["model", "prompt"] + rep.columns + [f"{c}_{x}" for c in rep.columns for x in ("n", "lo", "hi")]
    return Table("table7", "Table 7 view: Prompt-IE and Prompt-IB side by side (ROUGE-L)", header, rows, _f,
                 (md_header, md_rows), js)


def extrapolation(rep: Report, opts: Options = Options()) -> Table:
    """The extrapolation table: rows = settings, columns = lengths; per row the cells (n and 95 % interval each),
    the effective context length (NoLiMa: >= 85 % of the row's first column; a fixed threshold, RULER's rule: >=
    ``--effective-threshold``)
    and short-context retention (the row's first column / its base model's)."""
    cols, rows_ = rep.extrapolation(opts.threshold)
    styles = any(r["label"].style or r["label"].variant for r in rows_)
    eff_cols = ["effective length (85% of 1x)"] + ([f"effective length (>= {opts.threshold:g})"]
                                                   if opts.threshold is not None else [])
    md_header = (["model", "rope", "train length (mean, range)"] + (["prompts"] if styles else []) + ["n"] + cols
                 + eff_cols + ["retention"])
    md_rows, rows, js = [], [], []
    for r in rows_:
        s, lab, est, eff = r["setting"], r["label"], r["estimates"], r["effective"]
        tl = s.train_length if s.train is not None else None
        effs = [eff["relative"].text()] + ([eff["absolute"].text()] if opts.threshold is not None else [])
        md_rows.append([lab.model, lab.rope or "none", "-" if tl is None else tl.text()]
                       + ([" ".join(p for p in (lab.style, lab.variant) if p) or "-"] if styles else [])
                       + [_n_text(list(est.values()))] + [_est_text(est[c], opts.intervals) for c in cols] + effs
                       + [_pct(r["retention"])])
        rope = s.rope
        rows.append([lab.text, lab.model, lab.rope or "none", None if rope is None or not rope.scaled else
                     rope.scale] + ([None] * 3 if tl is None else [_r(tl.mean, 1), tl.min, tl.max])
                    + [x for c in cols for x in (_r(est[c].mean), est[c].n or None, _r(est[c].lo), _r(est[c].hi))]
                    + [eff["relative"].length, None if eff["absolute"] is None else eff["absolute"].length,
                       _r(r["retention"])])
        js.append({"label": lab.text, "model": lab.model, "rope": None if rope is None else rope.to_dict(),
                   "rope_label": lab.rope or "none", "train": s.train,
                   "train_length": None if tl is None else tl.to_dict(), "prompt_style": s.prompt_style,
                   "cells": {c: _r(v) for c, v in r["cells"].items()},
                   "n": {c: e.n for c, e in est.items() if e.mean is not None},
                   "ci": {c: _ci(e) for c, e in est.items() if e.mean is not None},
                   "se": {c: _r(e.se) for c, e in est.items() if e.mean is not None},
                   "effective_length": {k: None if v is None else v.to_dict() for k, v in eff.items()},
                   "retention": _r(r["retention"])})
    header = (["label", "model", "rope", "scale", "train_length", "train_length_min", "train_length_max"]
              + [x for c in cols for x in (c, f"{c}_n", f"{c}_lo", f"{c}_hi")]
              + ["effective_length_85", "effective_length_abs", "retention"])
    by = "input-length bucket (tokens)" if rep.buckets else "subset"
    return Table("extrapolation", f"Extrapolation: ROUGE-L by {by}", header, rows, _f, (md_header, md_rows),
                 {"columns": cols, "by": "buckets" if rep.buckets else "subset", "threshold": opts.threshold,
                  "rows": js}, _extrapolation_note(rep, rows_, cols, opts))


def _extrapolation_note(rep: Report, rows_: list, cols: list, opts: Options) -> str:
    parts = []
    if any(r["setting"].train is not None for r in rows_):
        parts.append("Train length: the mean length of the fine-tuning samples of the data set (the paper's Train "
                     "Len.), with their range; '-': not fine-tuned (the RoPE method applied at load time).")
    parts.append("n: eval samples per cell (each scored under every prompt present); "
                 + ("cells: mean [95% t interval over the samples, "
                                                           "a sample's prompts averaged first]."
                                                           if opts.intervals else "cells: the mean of the prompts' "
                                                           "means (--no-intervals: without their intervals)."))
    first = cols[0] if cols else "the first column"
    parts.append(f"Effective length: the longest length up to which the row keeps >= 85% of its own {first} score "
                 "(NoLiMa)" + (f", and up to which it scores >= {opts.threshold:g} (a fixed threshold, RULER's "
                               f"rule); a row below {opts.threshold:g} at {first} has no 85% length"
                               if opts.threshold is not None
                               else "") + f"; '>{cols[-1] if cols else ''}': holds at every length evaluated, "
                 f"'<{first}': fails at the first. Retention: the row's {first} score / its base model's (the same "
                 "model unscaled and not fine-tuned).")
    return " ".join(parts)


def failures(rep: Report) -> Table:
    header = ["model", "prompt", "subset", "n", "rouge_l", "empty", "copy", "repetition", "echo", "run"]
    modes = ("empty", "copy", "repetition", "echo")
    md_rows, rows = [], []
    for r in rep.failures():
        lead = [r["label"], r["kind"], r["subset"], r["n"]]
        md_rows.append([str(x) for x in lead] + [_f(r["rouge_l"])] + [_pct(r[m]) for m in modes] + [r["run"]])
        rows.append(lead + [_r(r["rouge_l"])] + [_r(r[m]) for m in modes] + [r["run"]])
    js = [{k: (_r(v) if isinstance(v, float) else v) for k, v in r.items()} for r in rep.failures()]
    return Table("failure_modes", "Failure modes per run (share of predictions; copy needs the contexts)", header,
                 rows, _f, (header, md_rows), js)


def recall(rep: Report) -> Table:
    k, rows_ = rep.recall()
    marks = [f"mark {i}" for i in range(1, k + 1)]
    header = ["model", "length"] + marks + ["mean", "rouge_l", "n"]
    rows, js = [], []
    for r in rows_:
        name = FLOOR if r["label"] is None else r["label"].text
        rows.append([name, r["subset"]] + [_r(v, 2) for v in r["marks"]] + [_r(r["mean"], 2), _r(r["rouge_l"], 2),
                                                                           r["n"]])
        js.append({"model": name, "floor": r["label"] is None, "length": r["subset"],
                   "marks": [_r(v, 2) for v in r["marks"]], "mean": _r(r["mean"], 2),
                   "rouge_l": _r(r["rouge_l"], 2), "n": r["n"]})
    note = (f"Mark k is the k-th of the {k} marked sentences, one in each of {k} equal stretches of the context (mark "
            "1 nearest its start): a cell is the share of samples (x100) whose marked sentence came back verbatim "
            "under its mark. "
            f"'{FLOOR}': a prediction of the marks alone (exact recall 0) -- the ROUGE-L that marks and layout "
            "score without any recall.")
    return Table("recall", "Recall task: exact recall per mark (x100) and ROUGE-L", header, rows, _f, None,
                 {"marks": k, "rows": js}, note)


_VIEW_TABLES = {"table2": table2, "table7": table7, "extrapolation": extrapolation, "failures": failures,
                "recall": recall}


def _table(rep: Report, view: str, opts: Options) -> Table:
    fn = _VIEW_TABLES[view]
    return fn(rep, opts) if view in ("table2", "table7", "extrapolation") else fn(rep)


def view_json(rep: Report, view: str, opts: Options = Options()) -> Any:
    if view not in _VIEW_TABLES:
        raise ValueError(view)
    return _table(rep, view, opts).json


def available_views(rep: Report) -> list[str]:
    views = ["table2", "table7"]
    if rep.runs or any(s.rope is not None or s.train is not None for s in rep.series):
        views.append("extrapolation")
    if rep.runs:
        views.append("failures")
        if rep.recall()[1]:
            views.append("recall")
    return views


def render(rep: Report, fmt: str = "markdown", view: str = "all", opts: Options = Options()) -> str:
    """The report as text: markdown (all views by default), csv (one view) or json."""
    if fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    if view not in VIEWS:
        raise InputError(f"unknown view {view!r} (choose from {', '.join(VIEWS)})")
    views = available_views(rep) if view == "all" else [view]
    tables = [_table(rep, v, opts) for v in views]
    if view != "all" and fmt != "markdown":
        return tables[0].text(fmt)
    if fmt == "csv":
        raise InputError("--format csv prints one table: choose a --view (" + ", ".join(VIEWS[1:]) + ")")
    return tables_text(tables, fmt, keys=views if fmt == "json" else None)


def write_report(rep: Report, out_dir: str | os.PathLike, opts: Options = Options()) -> list[Path]:
    """Write every available view as .md, .csv and .json into ``out_dir`` (atomically); returns the paths."""
    return write_tables([_table(rep, v, opts) for v in available_views(rep)], out_dir)

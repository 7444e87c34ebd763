"""The report's views as tables (``ropescale.common.tables.Table``): markdown (every view), CSV (one view) or JSON,
and the files ``--out`` writes (through the one table writer, ``tables.write_tables``)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from ropescale.common.io import InputError
from ropescale.common.tables import FORMATS, Table, number, tables_text, write_tables

from .model import FLOOR, Report

VIEWS = ("all", "table2", "table7", "extrapolation", "failures", "recall")

_f = number(2, "-")


def _r(v: Optional[float], nd: int = 4) -> Optional[float]:
    return None if v is None else round(v, nd)


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def table2(rep: Report) -> Table:
    t2 = rep.table2()
    header = ["model"] + rep.columns + ["mse"]
    rows = [[label] + [d["avg"].get(c) for c in rep.columns] + [d["mse"]] for label, d in t2.items()]
    note = ""
    if any(x is None for d in t2.values() for x in d["avg"].values()):
        note = ("'-': a subset scored with only one of the two prompts has no average (and the model no MSE); the "
                "Table 7 view shows the single prompt's score.")
    js = {label: {"avg": {c: _r(v) for c, v in d["avg"].items()}, "mse": _r(d["mse"]),
                  "IE": {c: _r(v) for c, v in d["IE"].items()}, "IB": {c: _r(v) for c, v in d["IB"].items()}}
          for label, d in t2.items()}
    return Table("table2", "Table 2 view: average of Prompt-IE and Prompt-IB (ROUGE-L) and MSE (P-IE vs P-IB)",
                 header, [[r[0]] + [_r(v) for v in r[1:]] for r in rows], _f, (header, rows), js, note)


def table7(rep: Report) -> Table:
    md_header = ["model"] + [f"{c} (IE / IB)" for c in rep.columns]  # one row per model, "IE / IB" in each cell
    md_rows = [[rep.label(s)] + [f"{_f(rep.value(s, 'IE', c))} / {_f(rep.value(s, 'IB', c))}" for c in rep.columns]
               for s in rep.series]
    rows = [[rep.label(r["series"]), r["kind"]] + [_r(r["values"][c]) for c in rep.columns] for r in rep.table7()]
    js = [{"model": rep.label(r["series"]), "prompt": r["kind"],
           "values": {c: _r(v) for c, v in r["values"].items() if v is not None}} for r in rep.table7()]
    return Table("table7", "Table 7 view: Prompt-IE and Prompt-IB side by side (ROUGE-L)",
                 ["model", "prompt"] + rep.columns, rows, _f, (md_header, md_rows), js)


def extrapolation(rep: Report) -> Table:
    cols, rows_ = rep.extrapolation()
    styles = any(r["label"].style or r["label"].variant for r in rows_)
    md_header = ["model", "rope", "train length (mean, range)"] + (["prompts"] if styles else []) + cols
    md_rows, rows, js = [], [], []
    for r in rows_:
        s, lab = r["setting"], r["label"]
        tl = s.train_length if s.train is not None else None
        vals = [r["cells"][c] for c in cols]
        md_rows.append([lab.model, lab.rope or "none", "-" if tl is None else tl.text()]
                       + ([" ".join(p for p in (lab.style, lab.variant) if p) or "-"] if styles else []) + vals)
        rope = s.rope
        rows.append([lab.text, lab.model, lab.rope or "none", None if rope is None or rope.method == "none" else
                     rope.scale] + ([None] * 3 if tl is None else [_r(tl.mean, 1), tl.min, tl.max])
                    + [_r(v) for v in vals])
        js.append({"label": lab.text, "model": lab.model, "rope": None if rope is None else rope.to_dict(),
                   "rope_label": lab.rope or "none", "train": s.train,
                   "train_length": None if tl is None else tl.to_dict(), "prompt_style": s.prompt_style,
                   "cells": {c: _r(v) for c, v in r["cells"].items()}})
    header = ["label", "model", "rope", "scale", "train_length", "train_length_min", "train_length_max"] + cols
    by = "input-length bucket (tokens)" if rep.buckets else "subset"
    note = ("Train length: the mean length of the fine-tuning samples (the paper's Train Len.), with their range; "
            "'-': not fine-tuned (the RoPE method applied at load time).") if any(
        r["setting"].train is not None for r in rows_) else ""
    return Table("extrapolation", f"Extrapolation: ROUGE-L by {by}", header, rows, _f, (md_header, md_rows),
                 {"columns": cols, "by": "buckets" if rep.buckets else "subset", "rows": js}, note)


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


def view_json(rep: Report, view: str) -> Any:
    if view not in _VIEW_TABLES:
        raise ValueError(view)
    return _VIEW_TABLES[view](rep).json


def available_views(rep: Report) -> list[str]:
    views = ["table2", "table7"]
    if rep.runs or any(s.rope is not None or s.train is not None for s in rep.series):
        views.append("extrapolation")
    if rep.runs:
        views.append("failures")
        if rep.recall()[1]:
            views.append("recall")
    return views


def render(rep: Report, fmt: str = "markdown", view: str = "all") -> str:
    """The report as text: markdown (all views by default), csv (one view) or json."""
    if fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    if view not in VIEWS:
        raise InputError(f"unknown view {view!r} (choose from {', '.join(VIEWS)})")
    views = available_views(rep) if view == "all" else [view]
    tables = [_VIEW_TABLES[v](rep) for v in views]
    if view != "all" and fmt != "markdown":
        return tables[0].text(fmt)
    if fmt == "csv":
        raise InputError("--format csv prints one table: choose a --view (" + ", ".join(VIEWS[1:]) + ")")
    return tables_text(tables, fmt, keys=views if fmt == "json" else None)


def write_report(rep: Report, out_dir: str | os.PathLike) -> list[Path]:
    """Write every available view as .md, .csv and .json into ``out_dir`` (atomically); returns the paths."""
    return write_tables([_VIEW_TABLES[v](rep) for v in available_views(rep)], out_dir)

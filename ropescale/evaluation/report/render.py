"""The report's views as text: markdown (every view), CSV (one view) or JSON, and the files ``--out`` writes."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from ropescale.common.io import InputError, write_text_atomic
from ropescale.common.tables import csv_text, json_text, markdown, number

from .model import Report, _num

VIEWS = ("all", "table2", "table7", "extrapolation", "failures")
FORMATS = ("markdown", "csv", "json")


_f = number(2, "-")


def _r(v: Optional[float], nd: int = 4) -> Optional[float]:
    return None if v is None else round(v, nd)


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def table2_tabular(rep: Report, fmt: str) -> tuple[list[str], list[list]]:
    t2 = rep.table2()
    header = ["model"] + rep.columns + ["mse"]
    rows = []
    for label, d in t2.items():
        vals = [d["avg"].get(c) for c in rep.columns] + [d["mse"]]
        rows.append([label] + ([_f(v) for v in vals] if fmt == "markdown" else [_r(v) for v in vals]))
    return header, rows


def table7_tabular(rep: Report, fmt: str) -> tuple[list[str], list[list]]:
    if fmt == "markdown":  # one row per model, "IE / IB" in each subset cell
        header = ["model"] + [f"{c} (IE / IB)" for c in rep.columns]
        rows = []
        for s in rep.series:
            cells = [f"{_f(rep.value(s, 'IE', c))} / {_f(rep.value(s, 'IB', c))}" for c in rep.columns]
            rows.append([s.label] + cells)
        return header, rows
    header = ["model", "prompt"] + rep.columns
    rows = []
    for row in rep.table7():
        vals = [row["values"][c] for c in rep.columns]
        rows.append([row["series"].label, row["kind"]]
                    + ([_f(v) for v in vals] if fmt == "markdown" else [_r(v) for v in vals]))
    return header, rows


def extrapolation_tabular(rep: Report, fmt: str) -> tuple[list[str], list[list]]:
    cols, rows_ = rep.extrapolation()
    header = ["model", "rope", "scale", "train_length"] + cols
    rows = []
    for r in rows_:
        vals = [r["cells"][c] for c in cols]
        lead = [r["model"], r["rope"] or "-", _num(r["scale"]) if r["scale"] is not None else "-",
                "-" if r["train_length"] is None else str(r["train_length"])]
        if fmt == "markdown":
            rows.append(lead + [_f(v) for v in vals])
        else:
            rows.append([r["model"], r["rope"], r["scale"], r["train_length"]] + [_r(v) for v in vals])
    return header, rows


def failures_tabular(rep: Report, fmt: str) -> tuple[list[str], list[list]]:
    header = ["model", "prompt", "subset", "n", "rouge_l", "empty", "copy", "repetition", "echo", "run"]
    rows = []
    for r in rep.failures():
        rates = [r[m] for m in ("empty", "copy", "repetition", "echo")]
        if fmt == "markdown":
            rows.append([r["label"], r["kind"], str(r["subset"]), str(r["n"]), _f(r["rouge_l"])]
                        + [_pct(v) for v in rates] + [r["run"]])
        else:
            rows.append([r["label"], r["kind"], r["subset"], r["n"], _r(r["rouge_l"])]
                        + [_r(v) for v in rates] + [r["run"]])
    return header, rows


_TABULAR = {"table2": table2_tabular, "table7": table7_tabular, "extrapolation": extrapolation_tabular,
            "failures": failures_tabular}
_TITLES = {
    "table2": "Table 2 view: average of Prompt-IE and Prompt-IB (ROUGE-L) and MSE (P-IE vs P-IB)",
    "table7": "Table 7 view: Prompt-IE and Prompt-IB side by side (ROUGE-L)",
    "extrapolation": "Extrapolation: ROUGE-L by {cols}",
    "failures": "Failure modes per run (share of predictions; copy needs the contexts)",
}


def view_json(rep: Report, view: str) -> Any:
    if view == "table2":
        return {label: {"avg": {c: _r(v) for c, v in d["avg"].items()}, "mse": _r(d["mse"]),
                        "IE": {c: _r(v) for c, v in d["IE"].items()}, "IB": {c: _r(v) for c, v in d["IB"].items()}}
                for label, d in rep.table2().items()}
    if view == "table7":
        return [{"model": r["series"].label, "prompt": r["kind"],
                 "values": {c: _r(v) for c, v in r["values"].items() if v is not None}} for r in rep.table7()]
    if view == "extrapolation":
        cols, rows = rep.extrapolation()
        return {"columns": cols, "by": "buckets" if rep.buckets else "subset",
                "rows": [{**{k: r[k] for k in ("model", "rope", "scale", "train_length", "label")},
                          "cells": {c: _r(v) for c, v in r["cells"].items()}} for r in rows]}
    if view == "failures":
        return [{k: (_r(v) if isinstance(v, float) else v) for k, v in r.items()} for r in rep.failures()]
    raise ValueError(view)


def available_views(rep: Report) -> list[str]:
    views = ["table2", "table7"]
    if rep.runs or any(s.rope or s.train_length is not None for s in rep.series):
        views.append("extrapolation")
    if rep.runs:
        views.append("failures")
    return views


def render(rep: Report, fmt: str = "markdown", view: str = "all") -> str:
    """The report as text: markdown (all views by default), csv (one view) or json."""
    if fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    if view not in VIEWS:
        raise InputError(f"unknown view {view!r} (choose from {', '.join(VIEWS)})")
    views = available_views(rep) if view == "all" else [view]
    if fmt == "json":
        if view == "all":
            return json_text({v: view_json(rep, v) for v in views})
        return json_text(view_json(rep, view))
    if fmt == "csv":
        if len(views) != 1:
            raise InputError("--format csv prints one table: choose a --view (table2, table7, extrapolation, "
                             "failures)")
        header, rows = _TABULAR[views[0]](rep, "csv")
        return csv_text(header, rows)
    parts = []
    for v in views:
        header, rows = _TABULAR[v](rep, "markdown")
        title = _TITLES[v].format(cols="input-length bucket (tokens)" if rep.buckets else "subset")
        note = ""
        if v == "table2" and any(x is None for d in rep.table2().values() for x in d["avg"].values()):
            note = ("\n'-': a subset scored with only one of the two prompts has no average (and the model no MSE);"
                    " the Table 7 view shows the single prompt's score.\n")
        parts.append(f"### {title}\n\n{markdown(header, rows)}\n{note}")
    return "\n".join(parts)


def write_report(rep: Report, out_dir: str | os.PathLike) -> list[Path]:
    """Write every available view as .md, .csv and .json into ``out_dir`` (atomically); returns the paths."""
    out_dir = Path(out_dir)
    written = []
    for v in available_views(rep):
        name = "failure_modes" if v == "failures" else v
        for ext, fmt in (("md", "markdown"), ("csv", "csv"), ("json", "json")):
            p = out_dir / f"{name}.{ext}"
            write_text_atomic(p, render(rep, fmt, v))
            written.append(p)
    return written

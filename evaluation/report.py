"""``eval_summ.py report``: the paper's tables from scores — Table 2 / Table 7 views, extrapolation, failure modes.

Inputs (any mix):
- ``--scores FILE.csv`` with columns ``model,prompt,subset,rouge_l`` (prompt IE or IB — ie/ib/ft-ie/ft-ib/
  Prompt-IE are accepted too; subset L, XL, 2XL, 3XL or any name such as T2048; a ``-`` or empty rouge_l is a
  missing cell) and optional ``rope,scale,train_length`` columns;
- run directories written by ``eval_summ.py generate`` (a folder is searched for them), scored on the fly when
  their ``scores.json`` is missing or stale (and the scores saved into them, unless ``--no-save-scores``).

Views:
- Table 2 (CNNSum Table 2): per model and subset the average of the Prompt-IE and Prompt-IB scores, and
  ``MSE(P-IE vs P-IB)`` = the mean over the model's subsets of (IE - IB)^2. A subset scored with only one of the
  prompts shows no average (``-``) and leaves the model without an MSE: one prompt's score is not the average.
- Table 7 (CNNSum Appendix C): IE and IB side by side.
- Extrapolation (CNNSum Table 8): rows = (model, rope method, scale, train length), columns = subsets or
  ``--buckets`` of input length (from each sample's ``input_tokens``), cells = ROUGE-L (the mean over the
  prompts present of each prompt's mean over samples).
- Failure modes (CNNSum Sec 4.4): per run, the share of empty / copied / repetitive / prompt-echoing outputs.

A model evaluated with several RoPE settings appears once per setting ("model · rope xS · train N").
Importable: :func:`make_report` (the whole command as one call), :func:`build_report` (paths and/or rows ->
:class:`Report`), :func:`render`, :func:`write_report`, :func:`plot_report`.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from common.io import InputError, write_text_atomic
from common.prompts import prompt_kind
from common.runs import find_run_dirs
from common.subsets import ORDER, get as get_subset

from .rouge import DEFAULT_METRIC, METRICS, check_metric
from .score import PREDICTIONS, load_run_scores, rope_fields, write_run_scores

KINDS = ("IE", "IB")
VIEWS = ("all", "table2", "table7", "extrapolation", "failures")
FORMATS = ("markdown", "csv", "json")
CSV_REQUIRED = ("model", "prompt", "subset", "rouge_l")
NO_SUBSET = "all"  # the column of runs generated without a subset (``generate --max-new-tokens`` only)


@dataclass(frozen=True)
class Series:
    """One evaluated configuration: a model under one RoPE setting and training length."""
    model: str
    rope: Optional[str] = None
    scale: Optional[float] = None
    train_length: Optional[int] = None

    @property
    def label(self) -> str:
        parts = [self.model]
        if self.rope and self.rope != "none":
            parts.append(f"{self.rope} x{_num(self.scale)}" if self.scale is not None else self.rope)
        if self.train_length is not None:
            parts.append(f"train {self.train_length}")
        return " · ".join(parts)


@dataclass
class RunResult:
    path: Path
    series: Series
    kind: str
    summary: dict
    samples: list
    fresh: bool = False


@dataclass
class Report:
    series: list  # [Series] in first-seen order
    columns: list  # subsets, ordered
    cells: dict  # (Series, kind, subset) -> [sum, count]
    runs: list = field(default_factory=list)  # [RunResult]
    buckets: Optional[list] = None  # bucket edges (ints) when the extrapolation view uses length buckets

    # ---- views
    def value(self, s: Series, kind: str, col: str) -> Optional[float]:
        c = self.cells.get((s, kind, col))
        return c[0] / c[1] if c and c[1] else None

    def table7(self) -> list[dict]:
        """[{series, kind, values: {subset: v}}] — IE and IB rows per series."""
        rows = []
        for s in self.series:
            for k in KINDS:
                vals = {c: self.value(s, k, c) for c in self.columns}
                if any(v is not None for v in vals.values()):
                    rows.append({"series": s, "kind": k, "values": vals})
        return rows

    def table2(self) -> dict:
        """{label: {"avg": {subset: mean of IE and IB}, "mse": MSE(P-IE vs P-IB), "IE", "IB": {subset: score}}}
        over the subsets scored with at least one prompt; a prompt missing on such a subset is None in its own
        dict, in avg, and makes the MSE None (a subset scored with neither prompt is simply absent)."""
        out = {}
        for s in self.series:
            ie = {c: v for c in self.columns if (v := self.value(s, "IE", c)) is not None}
            ib = {c: v for c in self.columns if (v := self.value(s, "IB", c)) is not None}
            cols = [c for c in self.columns if c in ie or c in ib]
            out[s.label] = {"avg": {c: prompt_average(ie.get(c), ib.get(c)) for c in cols},
                            "mse": mse_ie_ib(ie, ib), "IE": {c: ie.get(c) for c in cols},
                            "IB": {c: ib.get(c) for c in cols}}
        return out

    def extrapolation(self) -> tuple[list[str], list[dict]]:
        """(columns, rows): rows {model, rope, scale, train_length, label, cells {column: v}}."""
        if self.buckets is None:
            cols = list(self.columns)
            get = self.value
        else:
            cols, bucket_cells = self._bucket_cells()

            def get(s, k, c):
                v = bucket_cells.get((s, k, c))
                return v[0] / v[1] if v and v[1] else None
        rows = []
        for s in self.series:
            cells = {}
            for c in cols:
                per_kind = [v for v in (get(s, k, c) for k in KINDS) if v is not None]
                cells[c] = sum(per_kind) / len(per_kind) if per_kind else None
            if any(v is not None for v in cells.values()):
                rows.append({"model": s.model, "rope": s.rope, "scale": s.scale, "train_length": s.train_length,
                             "label": s.label, "cells": cells})
        return cols, rows

    def _bucket_cells(self) -> tuple[list[str], dict]:
        labels = bucket_labels(self.buckets)
        cells: dict = {}
        for r in self.runs:
            for smp in r.samples:
                t = smp.get("input_tokens")
                if not isinstance(t, (int, float)):
                    continue
                c = cells.setdefault((r.series, r.kind, labels[bucket_index(self.buckets, t)]), [0.0, 0])
                c[0] += smp["rouge_l"]
                c[1] += 1
        used = [lab for lab in labels if any(k[2] == lab for k in cells)]
        return used, cells

    def failures(self) -> list[dict]:
        """Per run: label, prompt kind, subset, n and the failure-mode rates."""
        rows = []
        for r in self.runs:
            fm = r.summary.get("failure_modes") or {}
            rows.append({"run": str(r.path), "label": r.series.label, "kind": r.kind,
                         "subset": r.summary.get("subset") or _run_subsets(r), "n": r.summary.get("n"),
                         "rouge_l": r.summary.get("rouge_l"),
                         **{m: fm.get(m) for m in ("empty", "copy", "repetition", "echo")}})
        return rows


# ----------------------------------------------------------------------------------------------- formulas
def prompt_average(ie: Optional[float], ib: Optional[float]) -> Optional[float]:
    """CNNSum Table 2 cell: the mean of the Prompt-IE and Prompt-IB scores; None (a missing cell) unless both are
    present — one prompt's score is not the average of two (the Table 7 view shows it)."""
    if ie is None or ib is None:
        return None
    return (ie + ib) / 2


def mse_ie_ib(ie: dict, ib: dict) -> Optional[float]:
    """CNNSum Table 2 'MSE (P-IE vs P-IB)' (Sec 4.3): the mean over the model's subsets of (IE - IB)^2; None when a
    subset has only one of the two prompts (a subset with neither, like GPT-4o's 3XL, is not one of its subsets)."""
    ie = {c: v for c, v in ie.items() if v is not None}
    ib = {c: v for c, v in ib.items() if v is not None}
    if not ie or set(ie) != set(ib):
        return None
    return sum((ie[c] - ib[c]) ** 2 for c in ie) / len(ie)


# ------------------------------------------------------------------------------------------------ helpers
def _num(x: Any) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _run_subsets(r: RunResult) -> str:
    subs = sorted({str(s.get("subset")) for s in r.samples if s.get("subset") is not None}, key=subset_key)
    return ",".join(subs) if subs else "-"


def subset_key(name: str) -> tuple:
    """Order: L, XL, 2XL, 3XL, then scaled subsets T<n> by n, then anything else by name."""
    if name in ORDER:
        return (0, ORDER.index(name), "")
    m = re.fullmatch(r"T(\d+)", name)
    if m:
        return (1, int(m.group(1)), "")
    return (2, 0, name)


def canon_subset(name: str) -> str:
    """L/XL/2XL/3XL (XXL, XXXL and lower case accepted); other names (T2048, ...) kept as given."""
    name = str(name).strip()
    try:
        return get_subset(name).name
    except InputError:
        return name


def canon_kind(prompt: str, where: tuple = (None, None)) -> str:
    p = str(prompt).strip().lower()
    p = re.sub(r"^(p|prompt)[-_ ]?", "", p)
    if p in ("ie", "ib", "ft-ie", "ft-ib", "ft_ie", "ft_ib"):
        return prompt_kind(p)
    raise InputError(f"unknown prompt {prompt!r} (IE or IB)", *where)


def parse_buckets(spec: str) -> list[int]:
    """'1024,2048,4096' -> sorted edges; buckets are [0,e1), [e1,e2), ..., [ek, inf)."""
    try:
        edges = sorted({int(x) for x in spec.replace(" ", "").split(",") if x})
    except ValueError:
        raise InputError(f"--buckets: expected comma-separated token counts, got {spec!r}") from None
    if not edges or edges[0] <= 0:
        raise InputError(f"--buckets: expected positive token counts, got {spec!r}")
    return edges


def bucket_labels(edges: Sequence[int]) -> list[str]:
    labels = [f"<{edges[0]}"]
    labels += [f"{a}-{b}" for a, b in zip(edges, edges[1:])]
    labels.append(f">={edges[-1]}")
    return labels


def bucket_index(edges: Sequence[int], t: float) -> int:
    i = 0
    while i < len(edges) and t >= edges[i]:
        i += 1
    return i


# --------------------------------------------------------------------------------------------------- intake
def read_scores_csv(path: str | os.PathLike) -> list[dict]:
    """Rows {model, kind, subset, rouge_l, rope, scale, train_length, _line} of a scores CSV (file:line errors)."""
    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", path)
    raw = path.read_bytes()
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"not valid UTF-8 (byte {e.start})", path, lineno) from None
    text = raw.decode("utf-8-sig")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in CSV_REQUIRED if c not in header]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)} (need {','.join(CSV_REQUIRED)})", path, 1)
    reader.fieldnames = header
    rows, seen = [], {}
    try:
        for rec in reader:
            ln = reader.line_num
            if None in rec or any(rec.get(c) is None for c in CSV_REQUIRED):
                raise InputError("wrong number of fields", path, ln)
            model = rec["model"].strip()
            if not model:
                raise InputError("empty model", path, ln)
            kind = canon_kind(rec["prompt"], (path, ln))
            subset = canon_subset(rec["subset"])
            if not subset:
                raise InputError("empty subset", path, ln)
            v = rec["rouge_l"].strip()
            if v in ("", "-"):
                continue
            try:
                val = float(v)
            except ValueError:
                raise InputError(f"rouge_l is not a number: {v!r}", path, ln) from None
            if not math.isfinite(val):
                raise InputError(f"rouge_l is not finite: {v!r}", path, ln)
            rope = (rec.get("rope") or "").strip() or None
            scale = _opt_float(rec.get("scale"), "scale", path, ln)
            tl = _opt_float(rec.get("train_length"), "train_length", path, ln)
            row = {"model": model, "kind": kind, "subset": subset, "rouge_l": val, "rope": rope,
                   "scale": scale, "train_length": None if tl is None else int(tl), "_line": ln}
            key = (model, rope, scale, row["train_length"], kind, subset)
            if key in seen:
                raise InputError(f"duplicate row for {model} {kind} {subset} (first at line {seen[key]})", path, ln)
            seen[key] = ln
            rows.append(row)
    except csv.Error as e:
        raise InputError(f"malformed CSV: {e}", path, reader.line_num) from None
    return rows


def _opt_float(v, name, path, ln) -> Optional[float]:
    if v is None or not str(v).strip() or str(v).strip() in ("-", "none", "null"):
        return None
    try:
        return float(v)
    except ValueError:
        raise InputError(f"{name} is not a number: {v!r}", path, ln) from None


def display_model(model: str) -> str:
    """A model path is shown by its last two components (run.json stores absolute paths: /x/Qwen/Qwen1.5-7B ->
    Qwen/Qwen1.5-7B, /x/runs/ft-ntk8/merged -> ft-ntk8/merged); names (tiny) stay as they are."""
    if "/" in model or os.sep in model:
        parts = [p for p in Path(model).parts if p not in ("/", os.sep)]
        return "/".join(parts[-2:]) or model
    return model


def load_runs(paths: Iterable[str | os.PathLike], metric: str = DEFAULT_METRIC) -> list[RunResult]:
    """Every generation run under ``paths`` (run dirs or folders), with scores (stored or recomputed)."""
    found = []
    for rd in find_run_dirs(paths):
        pj = rd.path / PREDICTIONS
        if not pj.is_file() or not pj.read_bytes().strip():
            meta = rd.read_meta()
            if meta.get("kind") in (None, "generate"):
                print(f"note: {rd.path}: no predictions yet, skipped", file=sys.stderr)
            continue
        summary, samples, fresh = load_run_scores(rd.path, metric)
        model = summary.get("model")
        if not model:
            raise InputError("run.json has no model", rd.meta_path)
        method, scale = summary.get("rope") or "none", summary.get("scale")
        if "rope" not in summary:  # scores written by another tool: read the run's metadata
            method, scale = rope_fields(rd.read_meta())
        prompt = summary.get("prompt")
        if not isinstance(prompt, str):
            raise InputError("run.json has no prompt (ie/ib/ft-ie/ft-ib)", rd.meta_path)
        tl = summary.get("train_length")
        kind = canon_kind(prompt, (rd.meta_path, None))
        found.append((rd, str(model), method, scale, int(tl) if isinstance(tl, (int, float)) else None, kind,
                      summary, samples, fresh))
    # show a model path by its last two components unless two different paths would then look the same
    short: dict = {}
    for f in found:
        short.setdefault(display_model(f[1]), set()).add(f[1])
    runs = []
    for rd, model, method, scale, tl, kind, summary, samples, fresh in found:
        name = display_model(model)
        series = Series(name if len(short[name]) == 1 else model, method, scale, tl)
        runs.append(RunResult(rd.path, series, kind, summary, samples, fresh))
    return runs


def build_report(sources: Iterable[Any] = (), *, scores_csv: Iterable[str | os.PathLike] = (),
                 metric: str = DEFAULT_METRIC, buckets: Optional[Sequence[int]] = None) -> Report:
    """Build every view from run directories / folders (paths), score rows (dicts with model, prompt|kind,
    subset, rouge_l[, rope, scale, train_length]) and scores CSV files. Nothing is written here."""
    check_metric(metric)
    paths, rows = [], []
    for src in sources:
        if isinstance(src, dict):
            rows.append({**src, "kind": canon_kind(src.get("kind") or src.get("prompt")),
                         "subset": canon_subset(src["subset"])})
        elif Path(src).is_file() and str(src).lower().endswith(".csv"):
            rows.extend(read_scores_csv(src))
        else:
            paths.append(src)
    for p in scores_csv:
        rows.extend(read_scores_csv(p))
    runs = load_runs(paths, metric) if paths else []
    if not rows and not runs:
        raise InputError("nothing to report: give --scores FILE.csv and/or run directories with predictions")

    series: list = []
    cells: dict = {}

    def add(s: Series, kind: str, subset: str, value: float) -> None:
        if s not in series:
            series.append(s)
        c = cells.setdefault((s, kind, subset), [0.0, 0])
        c[0] += value
        c[1] += 1

    for r in rows:
        tl = r.get("train_length")
        sc = r.get("scale")
        s = Series(str(r["model"]), r.get("rope"), None if sc is None else float(sc),
                   None if tl is None else int(tl))
        add(s, r["kind"], r["subset"], float(r["rouge_l"]))
    for run in runs:
        for smp in run.samples:
            sub = smp.get("subset") or run.summary.get("subset") or NO_SUBSET
            add(run.series, run.kind, canon_subset(sub), float(smp["rouge_l"]))
    columns = sorted({k[2] for k in cells}, key=subset_key)
    return Report(series=series, columns=columns, cells=cells, runs=runs,
                  buckets=list(buckets) if buckets else None)


def save_fresh_scores(report: Report) -> list[Path]:
    """Write scores.json + sample_scores.jsonl into the runs whose scores were recomputed."""
    written = []
    for r in report.runs:
        if r.fresh:
            try:
                written.append(write_run_scores(r.path, r.summary, r.samples))
            except OSError as e:
                print(f"note: could not save scores into {r.path}: {e}", file=sys.stderr)
    return written


# -------------------------------------------------------------------------------------------------- render
def _f(v: Optional[float], nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _r(v: Optional[float], nd: int = 4) -> Optional[float]:
    return None if v is None else round(v, nd)


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _csv_text(header: list[str], rows: list[list[Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        w.writerow(["" if v is None else v for v in r])
    return buf.getvalue()


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
            return json.dumps({v: view_json(rep, v) for v in views}, ensure_ascii=False, indent=2) + "\n"
        return json.dumps(view_json(rep, view), ensure_ascii=False, indent=2) + "\n"
    if fmt == "csv":
        if len(views) != 1:
            raise InputError("--format csv prints one table: choose a --view (table2, table7, extrapolation, "
                             "failures)")
        header, rows = _TABULAR[views[0]](rep, "csv")
        return _csv_text(header, rows)
    parts = []
    for v in views:
        header, rows = _TABULAR[v](rep, "markdown")
        title = _TITLES[v].format(cols="input-length bucket (tokens)" if rep.buckets else "subset")
        note = ""
        if v == "table2" and any(x is None for d in rep.table2().values() for x in d["avg"].values()):
            note = ("\n'-': a subset scored with only one of the two prompts has no average (and the model no MSE);"
                    " the Table 7 view shows the single prompt's score.\n")
        parts.append(f"### {title}\n\n{_md_table(header, rows)}\n{note}")
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


def plot_report(rep: Report, path: str | os.PathLike, window: int = 15) -> Path:
    """The Fig. 3 PNG of the report's runs (per-sample ROUGE-L vs input length, moving median)."""
    from .plot import plot_fig3, series_from_runs

    if not rep.runs:
        raise InputError("--plot needs run directories (per-sample scores with input lengths)")
    return plot_fig3(series_from_runs(rep.runs), path, window=window)


# ------------------------------------------------------------------------------------------------------ CLI
def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report", help="Table 2 / Table 7 / extrapolation / failure-mode tables (+ Fig. 3 PNG)",
        description=__doc__.split("Importable:")[0].replace("``", ""),
        epilog="examples:\n"
               "  eval_summ.py report --scores scores.csv                   # Table 2 + Table 7 views (markdown)\n"
               "  eval_summ.py report --scores scores.csv --format json     # {model: {avg: {subset: v}, mse: v}}\n"
               "  eval_summ.py report runs/ --plot fig3.png --out tables/   # every view + Fig. 3 from run dirs\n"
               "  eval_summ.py report runs/ --buckets 1024,2048,4096 --view extrapolation --format csv",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", metavar="RUN_DIR|FILE.csv",
                   help="run directories (or folders holding them) and/or scores CSV files")
    p.add_argument("--scores", action="append", default=[], metavar="FILE.csv",
                   help="CSV with columns model,prompt,subset,rouge_l (repeatable)")
    p.add_argument("--format", choices=FORMATS, default="markdown", help="output format (default: markdown)")
    p.add_argument("--view", choices=VIEWS, default=None,
                   help="which table to print (default: all for markdown, table2 for csv and json)")
    p.add_argument("--buckets", metavar="EDGES", default=None,
                   help="extrapolation columns by input length: comma-separated token edges, e.g. 512,1024,2048")
    p.add_argument("--metric", choices=METRICS, default=DEFAULT_METRIC,
                   help="metric for runs that must be scored (default: cnnsum)")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="write the Fig. 3 plot: per-sample ROUGE-L vs input length, moving median (window 15)")
    p.add_argument("--window", type=int, default=15, help="moving-median window of --plot (default: 15)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="also write every view as DIR/<view>.{md,csv,json}")
    p.add_argument("--no-save-scores", action="store_true",
                   help="do not write scores.json / sample_scores.jsonl into runs scored on the fly")
    p.set_defaults(func=main)
    return p


def check_report_out(out_dir=None, plot=None) -> None:
    """Where the report goes must be usable before anything is written: ``out_dir`` a directory or nothing yet,
    ``plot`` a file path, not a directory."""
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise InputError("exists and is not a directory (the report's tables go there)", out_dir)
    if plot is not None and Path(plot).is_dir():
        raise InputError("is a directory (--plot takes a .png file path)", plot)


def make_report(sources: Iterable[Any] = (), *, scores_csv: Iterable[str | os.PathLike] = (),
                metric: str = DEFAULT_METRIC, buckets: Optional[Sequence[int]] = None, fmt: str = "markdown",
                view: Optional[str] = None, out_dir: Optional[str | os.PathLike] = None,
                plot: Optional[str | os.PathLike] = None, window: int = 15, save_scores: bool = True) -> str:
    """Everything ``eval_summ.py report`` does, as one call (``eval_summ.py run`` uses it): build the views,
    validate every input, then save recomputed run scores, write ``out_dir`` tables and the ``plot`` PNG, and
    return the text to print. Bad input raises InputError before anything is written."""
    if window < 1:
        raise InputError("--window must be >= 1")
    check_report_out(out_dir, plot)
    rep = build_report(sources, scores_csv=scores_csv, metric=metric, buckets=buckets)
    if buckets and not rep.runs:
        raise InputError("--buckets needs run directories (per-sample input lengths)")
    if plot:
        from .plot import series_from_runs

        if not rep.runs:
            raise InputError("--plot needs run directories (per-sample scores with input lengths)")
        if not series_from_runs(rep.runs):
            raise InputError("--plot: no sample of these runs has input_tokens")
    view = view or ("all" if fmt == "markdown" else "table2")
    text = render(rep, fmt, view)  # every check before the first write
    if save_scores:
        save_fresh_scores(rep)
    if out_dir:
        for p in write_report(rep, out_dir):
            print(f"wrote {p}", file=sys.stderr)
    if plot:
        print(f"wrote {plot_report(rep, plot, window)}", file=sys.stderr)
    return text


def main(args: argparse.Namespace) -> int:
    text = make_report(args.paths, scores_csv=args.scores, metric=args.metric,
                       buckets=parse_buckets(args.buckets) if args.buckets else None, fmt=args.format,
                       view=args.view, out_dir=args.out, plot=args.plot, window=args.window,
                       save_scores=not args.no_save_scores)
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0

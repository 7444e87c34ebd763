"""What a report reads: scores CSV files (the paper's tables) and run directories (scored on the fly when their
scores.json is missing or stale)."""
from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from ropescale.common.io import InputError
from ropescale.common.prompts import prompt_kind
from ropescale.common.runs import RunMeta, find_run_dirs
from ropescale.common.subsets import get as get_subset
from ropescale.common.tables import model_labels
from rope_scaling import RopeSpec

from ropescale.common.rouge import DEFAULT_METRIC, check_metric
from ..score import PREDICTIONS, load_run_scores, write_run_scores
from .model import Report, RunResult, Series, assemble

CSV_REQUIRED = ("model", "prompt", "subset", "rouge_l")


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


def load_runs(paths: Iterable[str | os.PathLike], metric: str = DEFAULT_METRIC) -> list[RunResult]:
    """Every generation run under ``paths`` (run dirs or folders), with scores (stored or recomputed)."""
    found = []
    for rd in find_run_dirs(paths):
        pj = rd.path / PREDICTIONS
        if not pj.is_file() or not pj.read_bytes().strip():
            if RunMeta.read(rd.path).kind in (None, "generate"):
                print(f"note: {rd.path}: no predictions yet, skipped", file=sys.stderr)
            continue
        summary, samples, fresh = load_run_scores(rd.path, metric)
        if not summary.get("model"):
            raise InputError("run.json has no model", rd.meta_path)
        prompt = summary.get("prompt")
        if not isinstance(prompt, str):
            raise InputError("run.json has no prompt (ie/ib/ft-ie/ft-ib)", rd.meta_path)
        if "rope" in summary:
            method, scale = summary["rope"] or "none", summary.get("scale")
        else:  # scores written by another tool: the rope the run recorded
            rope = RopeSpec.from_record(RunMeta.read(rd.path).rope, rd.meta_path)
            method, scale = rope.method, None if rope.method == "none" else rope.scale
        tl = summary.get("train_length")
        found.append(RunResult(rd.path, Series(str(summary["model"]), method, scale,
                                               int(tl) if isinstance(tl, (int, float)) else None),
                               canon_kind(prompt, (rd.meta_path, None)), summary, samples, fresh))
    labels = model_labels(r.series.model for r in found)
    for r in found:
        r.series = dataclasses.replace(r.series, model=labels[r.series.model])
    return found


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

    return assemble(rows, runs, buckets)


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



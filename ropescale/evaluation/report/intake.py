"""What a report reads: scores CSV files (the paper's tables), generation run directories (scored on the fly when
their scores.json is missing or stale) and probe run directories (their cells: :func:`load_probe_runs`). A run's
row is its full setting as its run.json records it (``tables.Setting``: model and model id, the full RoPE spec,
the model's training record, the prompt wording or the probe's variant), never the method and scale alone."""
from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from rope_scaling import RopeSpec
from rope_scaling.formulas import PLAIN, owners
from ropescale.common.io import InputError
from ropescale.common.prompts import prompt_kind
from ropescale.common.rouge import DEFAULT_METRIC, check_metric
from ropescale.common.runs.identity import TrainLength
from ropescale.common.runs.record import ITEMS, SUMMARY, RunMeta, find_run_dirs, summarize
from ropescale.common.subsets import get as get_subset
from ropescale.common.tables import Setting

from ..score import PREDICTIONS, load_run_scores, write_run_scores
from .model import Report, RunResult, assemble
from .probes import with_intervals

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


def csv_setting(model: str, rope: str | None, scale: float | None, train_length: float | None,
                where: tuple = (None, None), factors: str | os.PathLike | None = None) -> Setting:
    """The setting of a scores CSV row: its model, its rope method and scale (none when absent), LongRoPE's factors
    (``factors``: a factor file, read here, so the row is keyed -- and labelled -- by their content hash), and its
    training length (the paper's mean; a row with one counts as fine-tuned)."""
    spec = None
    if rope is not None or scale is not None:
        rec = {"method": rope or PLAIN, "scale": 1.0 if scale is None else scale}
        if factors is not None:
            rec["longrope_factors"] = str(factors)
        elif rope in owners("longrope_factors"):  # a method that reads a factor file (LongRoPE)
            raise InputError(f"rope {rope!r} needs its factors: a longrope_factors column naming the factor file "
                             "(a path relative to the CSV), as --longrope-factors takes it", *where)
        try:
            spec = RopeSpec.from_record(rec)
        except InputError as e:
            raise InputError(f"rope {rope!r} scale {scale!r}: {e}", *where) from None
    tl = None if train_length is None else TrainLength(float(train_length))
    return Setting(model, spec, None if tl is None else f"length {tl.text()}", tl)


def read_scores_csv(path: str | os.PathLike) -> list[dict]:
    """Rows {model, setting, kind, subset, rouge_l, _line} of a scores CSV (file:line errors)."""
    path = Path(path)
    reader = _csv_reader(path)
    rows, seen = [], {}
    try:
        for rec in reader:
            row = _score_row(rec, path, reader.line_num)
            if row is None:  # a missing cell ("-" or empty)
                continue
            key = (row["setting"], row["kind"], row["subset"])
            if key in seen:
                raise InputError(f"duplicate row for {row['model']} {row['kind']} {row['subset']} (first at line "
                                 f"{seen[key]})", path, row["_line"])
            seen[key] = row["_line"]
            rows.append(row)
    except csv.Error as e:
        raise InputError(f"malformed CSV: {e}", path, reader.line_num) from None
    return rows


def _csv_reader(path: Path) -> csv.DictReader:
    """A scores CSV's reader: the file UTF-8 throughout (the first bad line named), the required columns present."""
    if not path.is_file():
        raise InputError("no such file", path)
    raw = path.read_bytes()
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"not valid UTF-8 (byte {e.start})", path, lineno) from None
    reader = csv.DictReader(io.StringIO(raw.decode("utf-8-sig"), newline=""))
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in CSV_REQUIRED if c not in header]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)} (need {','.join(CSV_REQUIRED)})", path, 1)
    reader.fieldnames = header
    return reader


def _score_row(rec: dict, path: Path, ln: int) -> dict | None:
    """One CSV record as a score row; None for a missing cell; an InputError naming the line otherwise."""
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
        return None
    try:
        val = float(v)
    except ValueError:
        raise InputError(f"rouge_l is not a number: {v!r}", path, ln) from None
    if not math.isfinite(val):
        raise InputError(f"rouge_l is not finite: {v!r}", path, ln)
    rope = (rec.get("rope") or "").strip() or None
    scale = _opt_float(rec.get("scale"), "scale", path, ln)
    tl = _opt_float(rec.get("train_length"), "train_length", path, ln)
    factors = (rec.get("longrope_factors") or "").strip() or None
    factors = None if factors is None else path.parent / factors
    return {"model": model, "setting": csv_setting(model, rope, scale, tl, (path, ln), factors), "kind": kind,
            "subset": subset, "rouge_l": val, "_line": ln}


def _opt_float(v, name, path, ln) -> Optional[float]:
    if v is None or not str(v).strip() or str(v).strip() in ("-", "none", "null"):
        return None
    try:
        return float(v)
    except ValueError:
        raise InputError(f"{name} is not a number: {v!r}", path, ln) from None


def load_runs(paths: Iterable[str | os.PathLike], metric: str = DEFAULT_METRIC) -> list[RunResult]:
    """Every generation run under ``paths`` (run dirs or folders), with scores (stored or recomputed), each keyed
    by its full setting (read from run.json by RunMeta)."""
    found = []
    for rd in find_run_dirs(paths):
        meta = RunMeta.read(rd.path)
        pj = rd.path / PREDICTIONS
        if not pj.is_file() or not pj.read_bytes().strip():
            if meta.kind in (None, "generate"):
                print(f"note: {rd.path}: no predictions yet, skipped", file=sys.stderr)
            continue
        summary, samples, fresh = load_run_scores(rd.path, metric)
        if not meta.model:
            raise InputError("run.json has no model", rd.meta_path)
        prompt = summary.get("prompt")
        if not isinstance(prompt, str):
            raise InputError("run.json has no prompt (ie/ib/ft-ie/ft-ib)", rd.meta_path)
        setting = Setting.of_run(meta, RopeSpec.from_record(meta.rope, rd.meta_path))
        files = meta.settings.get("data_files")  # a dataset's file(s): part of which eval set was read
        data = meta.data if not files or meta.data is None else f"{meta.data} [{files}]"
        found.append(RunResult(rd.path, setting, canon_kind(prompt, (rd.meta_path, None)), summary, samples, fresh,
                               data=data))
    return found


def load_probe_runs(paths: list[str]) -> list[dict]:
    """Summaries of the probe runs under ``paths`` (recomputed from items.jsonl when summary.json is missing,
    e.g. for an interrupted run), each with the run's meta fields (probe, model, rope, metric, column), its
    row key (``_setting``: a tables.Setting) and each cell's interval over its items (``probes.with_intervals``)."""
    out, owner = [], {}
    for rd in find_run_dirs(paths):
        meta = RunMeta.read(rd.path)
        if meta.kind != "probe":
            continue
        items = rd.log(ITEMS).records() if (rd.path / ITEMS).is_file() else None
        if (rd.path / SUMMARY).is_file():
            s = rd.read_json(SUMMARY)
        elif items is not None:
            s = summarize(items)
        else:
            continue
        for k in ("probe", "model", "rope", "metric", "column", "cell_kind"):
            s.setdefault(k, meta.get(k))
        if items is not None:
            with_intervals(s, items)
        s["run_dir"] = str(rd.path)
        s["setting"] = probe_variant(meta)
        setting = Setting.of_run(meta, RopeSpec.from_record(meta.rope, meta.meta_path), variant=s["setting"])
        if owner.setdefault((s.get("probe"), setting), rd.path) != rd.path:
            setting = dataclasses.replace(setting, tag=rd.path.name)  # the same setting twice: by run directory
        s["_setting"] = setting
        out.append(s)
    if not out:
        raise InputError("no probe run directories found", ", ".join(map(str, paths)))
    return out


ProbeVariant = Callable[[RunMeta], str]
PROBE_VARIANTS: dict[str, ProbeVariant] = {}  # probe name -> its variant reader, declared by the probe's module


def declare_variant(probe: str) -> Callable[[ProbeVariant], ProbeVariant]:
    """A probe module's variant reader (``@declare_variant("copy")``): from a run's record, what tells apart runs
    of the probe beyond the model, its RoPE spec and training (empty for the defaults). A run records the answer in
    run.json (``info.variant_label``); the reader answers for a run.json written before that field."""

    def put(reader: ProbeVariant) -> ProbeVariant:
        PROBE_VARIANTS[probe] = reader
        return reader

    return put


def probe_variant(meta: RunMeta) -> str:
    """A probe run's variant: the label its run.json records, else (an older run.json) the probe's own reader
    (:data:`PROBE_VARIANTS`); a probe that declares none has one variant."""
    recorded = meta.info.get("variant_label") if meta.new_layout else None
    if isinstance(recorded, str):
        return recorded
    reader = PROBE_VARIANTS.get(str(meta.get("probe")))
    return reader(meta) if reader is not None else ""


def build_report(sources: Iterable[Any] = (), *, scores_csv: Iterable[str | os.PathLike] = (),
                 metric: str = DEFAULT_METRIC, buckets: Optional[Sequence[int]] = None,
                 resamples: Optional[int] = None) -> Report:
    """Build every view from run directories / folders (paths), score rows (dicts with model, prompt|kind,
    subset, rouge_l[, rope, scale, train_length, longrope_factors] -- or a ``setting``) and scores CSV files.
    Nothing is written here."""
    check_metric(metric)
    paths, rows = [], []
    for src in sources:
        if isinstance(src, dict):
            setting = src.get("setting") or csv_setting(str(src["model"]), src.get("rope"), src.get("scale"),
                                                        src.get("train_length"), factors=src.get("longrope_factors"))
            rows.append({**src, "setting": setting, "kind": canon_kind(src.get("kind") or src.get("prompt")),
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

    return assemble(rows, runs, buckets, resamples)


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



"""``eval_summ.py score``: ROUGE-L of predictions against references (CNNSum-exact by default).

Importable:
- :func:`score_records` (records -> dict), :func:`score_file` (a JSONL file -> dict),
- :func:`score_run_data` / :func:`score_run` (a run directory -> dict; ``score_run`` also writes
  ``scores.json`` and ``sample_scores.jsonl`` there, atomically),
- :func:`load_run_scores` (a run's scores, recomputed when ``scores.json`` is missing or stale).

A score is ROUGE-L F x 100; a file's or run's ``rouge_l`` is the mean over its samples (CLongEval eval.py). A
run's ``scores.json`` carries the run's full setting as run.json records it (model, model_id, the full RoPE spec,
the model's training record and length, prompt and its wording), never the method and scale alone. Samples of the
recall task (references in ``ropescale.common.recall``'s format) also get ``marks`` (exact recall per mark, 1/0)
and ``marks_only_rouge_l`` (the floor: the score of a prediction of the marks alone).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Iterable, Optional

from rope_scaling import RopeSpec
from ropescale.common.io import (
    InputError,
    read_jsonl,
    sha256_file,
    writable_dir,
    write_json_atomic,
    write_jsonl_atomic,
)
from ropescale.common.prompts import prompt_kind
from ropescale.common.recall import mark_recall, marks_only
from ropescale.common.rouge import DEFAULT_METRIC, METRICS, check_metric, rouge_l
from ropescale.common.runs.record import RunDir, RunMeta, now

from . import failure_modes

PRED_FIELDS = ("prediction", "reference")
ALIASES = {"summary": "reference"}
SCORES_JSON = "scores.json"
SAMPLE_SCORES = "sample_scores.jsonl"
PREDICTIONS = "predictions.jsonl"
SCORES_VERSION = 2  # 2: the full setting (rope spec, train record, model_id), per-mark recall


def _text(rec: dict, field: str) -> str:
    v = rec[field]
    if v is None:
        return ""
    if not isinstance(v, str):
        raise InputError(f"field {field!r} must be a string, got {type(v).__name__}", rec.get("_file"),
                         rec.get("_line"))
    return v


def score_records(records: Iterable[dict], metric: str = DEFAULT_METRIC) -> dict:
    """Score records with ``prediction`` and ``reference`` (or ``summary``).

    Returns ``{"metric", "rouge_l" (mean x 100), "n", "n_empty", "scores" (per record, x 100)}``; ``n_empty`` counts
    predictions with no letter, digit or CJK character (they score 0 in practice).
    """
    check_metric(metric)
    scores, n_empty = [], 0
    for rec in records:
        if "reference" not in rec and "summary" in rec:
            rec = {**rec, "reference": rec["summary"]}
        for f in PRED_FIELDS:
            if f not in rec:
                raise InputError(f"missing field {f!r}", rec.get("_file"), rec.get("_line"))
        pred, ref = _text(rec, "prediction"), _text(rec, "reference")
        n_empty += failure_modes.is_empty(pred)
        scores.append(100.0 * rouge_l(pred, ref, metric))
    n = len(scores)
    return {"metric": metric, "rouge_l": (sum(scores) / n) if n else None, "n": n, "n_empty": n_empty,
            "scores": scores}


def read_records(path: str | os.PathLike, required: tuple = PRED_FIELDS) -> list[dict]:
    """All records of a predictions JSONL; one InputError naming file:line for the first bad line, or the file and
    the ids that occur more than once (two runs written into one file: each sample would count twice)."""
    recs, seen, dups = [], set(), []
    for rec in read_jsonl(path, required, aliases=ALIASES):
        rec["_file"] = str(path)
        rid = rec.get("id")
        if rid is not None and not isinstance(rid, (dict, list)):
            if rid in seen and rid not in dups:
                dups.append(rid)
            seen.add(rid)
        recs.append(rec)
    if dups:
        more = f" and {len(dups) - 5} more" if len(dups) > 5 else ""
        raise InputError(f"{len(dups)} id(s) occur more than once ({', '.join(map(str, dups[:5]))}{more}): two runs "
                         "written into one file? Each sample must be scored once", path)
    return recs


def score_file(path: str | os.PathLike, metric: str = DEFAULT_METRIC) -> dict:
    """Score a JSONL file of ``{prediction, reference|summary}`` lines; adds ``file`` and failure-mode rates
    (copying is checked where a line carries its ``context``)."""
    recs = read_records(path)
    if not recs:
        raise InputError("no predictions (the file is empty)", path)
    out = score_records(recs, metric)
    out["failure_modes"] = failure_modes.rates(
        failure_modes.detect(r["prediction"] or "", r.get("context")) for r in recs)
    out["file"] = str(path)
    return out


# --------------------------------------------------------------------------------------------- run directories
def _data_path(meta: RunMeta) -> Optional[Path]:
    """The local eval data a run was generated from (a file or a directory), if run.json names one that exists."""
    cand = meta.settings.get("data")
    if isinstance(cand, str) and cand:
        for p in (Path(cand), meta.path / cand):
            if p.is_file() or p.is_dir():
                return p
    return None


def load_contexts(meta: RunMeta) -> dict:
    """id -> context from the local data named in run.json (a JSONL file, or what :mod:`ropescale.evaluation.data`
    reads with ``datasets``), or {} if unknown (a dataset name is not fetched again).

    A data line's id is its ``id`` field, else its 1-based line (row) number (as ``eval_summ.py generate`` numbers
    it)."""
    from .data import iter_rows, open_source

    p = _data_path(meta)
    if p is None:
        return {}
    out = {}
    try:
        src = open_source(p, meta.settings.get("data_files"), meta.settings.get("data_split"))
        for rec in iter_rows(src):
            ctx = rec.get("context")
            rid = rec.get("id", rec["_line"])
            if isinstance(ctx, str) and isinstance(rid, (str, int)):
                out[rid] = ctx
    except InputError:
        return {}  # the context only feeds the copy detector; a data file that moved on is not fatal
    return out


def score_run_data(run_dir: str | os.PathLike, metric: str = DEFAULT_METRIC) -> tuple[dict, list[dict]]:
    """Score a run directory without writing: (summary for scores.json, per-sample rows)."""
    rd = RunDir(run_dir)
    meta = RunMeta.read(run_dir)
    pred_path = rd.path / PREDICTIONS
    if not pred_path.is_file():
        raise InputError(f"no {PREDICTIONS}", rd.path)
    recs = read_records(pred_path, ("id",) + PRED_FIELDS)
    if not recs:
        raise InputError(f"no predictions yet ({PREDICTIONS} is empty)", rd.path)
    res = score_records(recs, metric)
    contexts = load_contexts(meta)
    samples, flags = [], []
    for rec, sc in zip(recs, res["scores"]):
        ctx = rec.get("context")
        if ctx is None:
            ctx = contexts.get(rec["id"])
        fl = failure_modes.detect(rec["prediction"] or "", ctx)
        flags.append(fl)
        smp = {
            "id": rec["id"], "subset": rec.get("subset", meta.settings.get("subset")),
            "input_tokens": rec.get("input_tokens"), "rouge_l": sc,
            **{m: fl[m] for m in failure_modes.MODES},
            "copy_share": fl["copy_share"], "repetition_share": fl["repetition_share"],
        }
        marks = mark_recall(rec["prediction"] or "", rec["reference"])
        if marks is not None:  # the recall task: which marked sentences came back, and the marks-only floor
            smp["marks"] = [int(m) for m in marks]
            smp["marks_only_rouge_l"] = 100.0 * rouge_l(marks_only(rec["reference"]), rec["reference"], metric)
        samples.append(smp)
    rope = RopeSpec.from_record(meta.rope, meta.meta_path)
    st = meta.settings
    prompt = st.get("prompt") or (recs[0].get("prompt") if recs else None)
    tl = meta.train_length
    summary = {
        "version": SCORES_VERSION,
        "metric": metric, "rouge_l": res["rouge_l"], "n": res["n"], "n_empty": res["n_empty"],
        "failure_modes": failure_modes.rates(flags),
        "model": meta.model, "model_id": meta.model_id, "rope": rope.to_dict(), "train": meta.train,
        "train_length": None if tl is None else tl.to_dict(),
        "prompt": prompt, "prompt_kind": prompt_kind(prompt) if isinstance(prompt, str) else None,
        "prompt_style": st.get("prompt_style"), "subset": st.get("subset"), "backend": st.get("backend"),
        "predictions_sha256": sha256_file(pred_path), "scored": now(),
    }
    return summary, samples


def write_run_scores(run_dir: str | os.PathLike, summary: dict, samples: list[dict]) -> Path:
    """Write sample_scores.jsonl, then scores.json (the latter last: it marks the pair complete)."""
    d = Path(run_dir)
    write_jsonl_atomic(d / SAMPLE_SCORES, samples)
    write_json_atomic(d / SCORES_JSON, summary)
    return d / SCORES_JSON


def score_run(run_dir: str | os.PathLike, metric: str = DEFAULT_METRIC) -> dict:
    """Score a run directory and write ``scores.json`` + ``sample_scores.jsonl`` into it; returns the summary."""
    summary, samples = score_run_data(run_dir, metric)
    write_run_scores(run_dir, summary, samples)
    return summary


def load_run_scores(run_dir: str | os.PathLike, metric: str = DEFAULT_METRIC) -> tuple[dict, list[dict], bool]:
    """(summary, samples, fresh): the stored scores when they match the metric and predictions.jsonl, else
    recomputed (``fresh`` True: the caller may save them with :func:`write_run_scores`)."""
    d = Path(run_dir)
    sj, ss, pj = d / SCORES_JSON, d / SAMPLE_SCORES, d / PREDICTIONS
    if sj.is_file() and ss.is_file() and pj.is_file():
        try:
            summary = json.loads(sj.read_text(encoding="utf-8"))
            if (summary.get("version") == SCORES_VERSION and summary.get("metric") == metric
                    and summary.get("predictions_sha256") == sha256_file(pj)):
                samples = [json.loads(line) for line in ss.read_text(encoding="utf-8").splitlines() if line.strip()]
                if len(samples) == summary.get("n"):
                    return summary, samples, False
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            pass  # stale or damaged derived files: recompute from the predictions
    summary, samples = score_run_data(d, metric)
    return summary, samples, True


# ------------------------------------------------------------------------------------------------------- CLI
def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "score", help="ROUGE-L of predictions (CNNSum-exact by default)",
        description="Score predictions against references with ROUGE-L x 100, averaged over samples.\n\n"
                    "metric cnnsum (default): the official CNNSum / CLongEval-LStSum score, PyPI rouge 1.0.1\n"
                    "  ROUGE-L F on jieba tokens joined by spaces (empty or all-'.' prediction = 0), reproduced\n"
                    "  exactly and fast. metric standard: textbook ROUGE-L F1 (rouge-score) on jieba tokens.\n\n"
                    "--pred takes a JSONL file (one {prediction, reference} object a line; CNNSum's 'summary'\n"
                    "is accepted as the reference) or a run directory of `eval_summ.py generate` (then\n"
                    "scores.json and sample_scores.jsonl are written into it; a run directory that cannot be\n"
                    "written is scored all the same, without saving them).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pred", required=True, metavar="FILE.jsonl|RUN_DIR", help="predictions to score")
    p.add_argument("--metric", choices=METRICS, default=DEFAULT_METRIC, help="ROUGE-L flavour (default: cnnsum)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: rouge_l (x100), n, n_empty, metric, failure_modes")
    p.add_argument("--per-sample", action="store_true", help="with --json: include the per-sample scores")
    p.set_defaults(func=cmd_score)
    return p


def cmd_score(args: argparse.Namespace) -> int:
    path = Path(args.pred)
    if path.is_dir():
        summary, samples = score_run_data(path, args.metric)
        if writable_dir(path):  # the scores are saved into the run; a run read from a read-only place is only read
            write_run_scores(path, summary, samples)
        else:
            print(f"note: {path} cannot be written here: scored without saving {SCORES_JSON} / {SAMPLE_SCORES}",
                  file=sys.stderr)
        out = dict(summary)
        if args.per_sample:
            out["scores"] = [s["rouge_l"] for s in samples]
    else:
        out = score_file(path, args.metric)
        if not args.per_sample:
            out.pop("scores")
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
    else:
        mean = out["rouge_l"]
        mean_s = "n/a" if mean is None else f"{mean:.4f}"
        print(f"ROUGE-L ({out['metric']}) {mean_s}  n={out['n']}  empty={out['n_empty']}  [{path}]")
    sys.stdout.flush()
    return 0

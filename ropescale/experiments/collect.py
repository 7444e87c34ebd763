"""Collecting an experiment's runs: each run directory's per-sample scores (the file and field each score names),
as {score: {arm: {seed: {length: {sample id: score}}}}} (a score with ``length:``: each record at the length its
field holds), and the row facts of the arms' run.json. Only what is there and finished: a run not made yet, or
not finished (its run.json not ``complete``), is absent, not an error."""
from __future__ import annotations

import math
from pathlib import Path

from ropescale.common.io import InputError, read_jsonl

from .runner import finished, lengths_of, run_dir
from .spec import Experiment, Score


def number(v, kind: str, where: str, path: Path) -> float:
    """A record's score as a float (a proportion's 0 / 1, or false / true, as 0 / 100: percent); else an error
    naming the file and record."""
    if kind == "proportion":
        if v not in (0, 1):  # True / False compare equal to 1 / 0
            raise InputError(f"{where} is {v!r}; a proportion's score is 0 or 1", path)
        return 100.0 * float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InputError(f"{where} is {v!r}, not a number", path)
    return float(v)


def scores(path: Path, field: str, key: str, kind: str = "mean", length: str | None = None,
           group: str | None = None, partial: bool = False) -> dict:
    """{id (as a string): float} of one score file; with ``length`` (a record field): {length: {id: float}}; with
    ``group``, only the records whose ``group`` field is it (the others are another arm's); ``partial``: a record
    without ``field`` is skipped (a measure made for some records only). A record without a finite number in
    ``field`` (or an integer ``length``), a proportion's score that is not 0 or 1, or an id repeated (within a
    length), is an error naming the file and record."""
    out: dict = {}
    need = (key,) + ((length,) if length else ()) + (() if group or partial else (field,))  # a group's: checked in it
    for k, rec in enumerate(read_jsonl(path, need), 1):
        if partial and field not in rec:
            continue
        if group is not None:
            if rec.get("group") != group:
                continue
            if field not in rec:
                raise InputError(f"record {k}: no {field!r} in a record of group {group!r}", path)
        v = number(rec[field], kind, f"record {k}: {field}", path)
        i = str(rec[key])
        if length is None:
            if i in out:
                raise InputError(f"record {k}: {key} {i!r} is repeated (one record an id)", path)
            out[i] = v
            continue
        t = rec[length]
        if isinstance(t, bool) or not isinstance(t, int):
            raise InputError(f"record {k}: {length} is {t!r}, not an integer length", path)
        if i in out.get(t, {}):
            raise InputError(f"record {k}: {key} {i!r} is repeated at {length} {t} (one record an id a length)", path)
        out.setdefault(t, {})[i] = v
    return out


def collect_score(exp: Experiment, sc: Score, work: Path, arms, seeds) -> dict:
    """{arm: {seed: {length: {id: score}}}} of one score, from the finished runs that have its file (an arm that
    ``reads:`` another: that arm's runs, its own field)."""
    out: dict = {}
    for a in arms:
        arm = exp.arms[a]
        if not arm.has(sc.key):
            continue
        for s in seeds:
            for t in lengths_of(exp, a):
                p = run_dir(work, arm.reads or a, s, t) / sc.file
                if not p.is_file() or not finished(p.parent):
                    continue
                got = scores(p, arm.field_of(sc), sc.id, sc.kind, sc.length, arm.group, sc.partial)
                by = out.setdefault(a, {}).setdefault(s, {})
                if sc.length is None:
                    by[t if t is not None else 0] = got
                else:
                    for length, ids in got.items():
                        by.setdefault(length, {}).update(ids)
    return out


def collect(exp: Experiment, work: Path, arms, seeds) -> dict:
    """{score: {arm: {seed: {length: {id: score}}}}} of every score."""
    return {k: collect_score(exp, sc, work, arms, seeds) for k, sc in exp.scores.items()}


def dotted(record: dict, key: str):
    """``record["train"]["coverage"]`` for ``train.coverage``; None where a part is missing."""
    v = record
    for part in key.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v


def facts(exp: Experiment, work: Path, arms, seeds) -> dict:
    """{arm: {fact: [distinct values over its runs' run.json, in run order]}} of the arms with ``facts:``."""
    import json

    out: dict = {}
    for a in arms:
        arm = exp.arms[a]
        for name, key in arm.facts.items():
            seen = out.setdefault(a, {}).setdefault(name, [])
            for s in seeds:
                for t in lengths_of(exp, a):
                    p = run_dir(work, arm.reads or a, s, t) / "run.json"
                    if p.is_file() and finished(p.parent):
                        try:
                            v = dotted(json.loads(p.read_text(encoding="utf-8")), key)
                        except (OSError, ValueError) as e:
                            raise InputError(f"unreadable run record: {e}", p) from None
                        if v is not None and v not in seen:
                            seen.append(v)
    return out

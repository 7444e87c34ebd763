"""Collecting an experiment's runs: each run directory's per-sample scores (the file and field ``score:`` names),
as {arm: {seed: {length: {sample id: score}}}}. Only what is there: a run not made yet is absent, not an error."""
from __future__ import annotations

import math
from pathlib import Path

from ropescale.common.io import InputError, read_jsonl

from .runner import run_dir
from .spec import Experiment


def scores(path: Path, field: str, key: str, kind: str = "mean") -> dict:
    """{id (as a string): float} of one score file (a proportion's 0 / 1 (or false / true) as 0 / 100: percent); a
    record without a finite number in ``field``, or a proportion's score that is not 0 or 1, is an error naming
    the file and record."""
    out = {}
    for k, rec in enumerate(read_jsonl(path, (key, field)), 1):
        v = rec[field]
        if kind == "proportion":
            if v not in (0, 1):  # True / False compare equal to 1 / 0
                raise InputError(f"record {k}: {field} is {v!r}; a proportion's score is 0 or 1", path)
            v = 100.0 * float(v)
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InputError(f"record {k}: {field} is {v!r}, not a number", path)
        out[str(rec[key])] = float(v)
    return out


def collect(exp: Experiment, work: Path, arms, seeds) -> dict:
    """{arm: {seed: {length: {id: score}}}} of the runs that have their score file (an arm that ``reads:``
    another: that arm's runs, its own field)."""
    out: dict = {}
    sc = exp.score
    for a in arms:
        arm = exp.arms[a]
        for s in seeds:
            for t in exp.lengths:
                p = run_dir(work, arm.reads or a, s, t) / sc.file
                if p.is_file():
                    out.setdefault(a, {}).setdefault(s, {})[t] = scores(p, arm.field or sc.field, sc.id, sc.kind)
    return out

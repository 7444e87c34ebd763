"""Whose directory, and the one resume check: a directory holding a run record belongs to that run
(:func:`claim_run_dir`), ``--resume auto|never`` says the same in every stage (:data:`RESUME_HELP`,
:func:`check_resume_mode`), :func:`open_run_dir` checks an output directory before any work and takes its lock,
and :func:`check_resume` refuses to continue a run with other settings, rope or model (one line, the diff).
``auto`` continues the run --out holds or starts one where there is none, ``never`` starts only a new run; without
the flag generate, run and the probes continue (auto), a fine-tune and a factor search refuse (never: they say how to
continue)."""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Iterable

from ..io import InputError, check_output_dir, foreign_entries
from ..settings import fmt, from_record, nested_fields, specs, value_of
from .locks import lock_run_dir
from .record import RUN_JSON, RunMeta


# ---------------------------------------------------------------- whose directory, and the one resume check
def claim_run_dir(path: str | os.PathLike, kind: str, *, what: str = "--out") -> RunMeta | None:
    """The run already in ``path`` (None when there is none): a directory holding a run record is that run's, so
    a record of another kind (or an unreadable one) is an InputError whatever the flags, and so is a non-empty
    directory that holds no run (``ropescale.common.io.foreign_entries``: files no command of this tool wrote); the
    caller decides what a run of its own kind may do (:func:`check_resume`)."""
    p = Path(path)
    if not (p / RUN_JSON).exists():
        foreign = foreign_entries(p) if p.is_dir() else []
        if foreign:
            more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
            raise InputError(f"a non-empty directory that holds no run (it holds {foreign[0]}{more}): a {kind} run "
                             f"is written only into a new or empty directory or its own run directory; use another "
                             f"{what}", p)
        return None
    meta = RunMeta.read(p)
    if meta.kind != kind:
        raise InputError(f"holds a {meta.kind or 'unknown'} run (run.json), not a {kind} run: a {kind} run is never "
                         f"written into another run's directory; use another {what}", meta.meta_path)
    return meta


RESUME_MODES = ("auto", "never")
RESUME_HELP = ("auto: continue the run in --out (same settings and model only) or start one; never: refuse an --out "
               "that holds a run")


def check_resume_mode(old: "RunMeta | None", resume: str | None, *, what: str = "--out", hint: str = "") -> None:
    """``--resume never`` (or a stage's default never, ``resume`` None there): an InputError when ``old`` (the run
    --out holds) exists, saying how to continue it; ``auto`` lets the caller continue it (:func:`check_resume`)."""
    if resume not in RESUME_MODES:
        raise ValueError(f"resume mode {resume!r}")
    if old is not None and resume == "never":
        status = f" ({old.status})" if old.status else ""
        raise InputError(f"already holds a {old.kind} run{status}: --resume auto continues it (the same settings "
                         f"only){hint}, or use another {what}", old.meta_path.parent)


def open_run_dir(path: str | os.PathLike, kind: str, *, what: str = "--out",
                 resume: str | None = None) -> tuple[Path, RunMeta | None]:
    """Where a run of ``kind`` writes, checked before any work: ``path`` is a directory or does not exist yet (no
    parent of it is a file), can be written, holds no run of another kind (:func:`claim_run_dir`) nor, with
    ``resume`` "never", one of this kind (:func:`check_resume_mode`), and no other process is writing it
    (:func:`lock_run_dir`, held until the process ends or :func:`release_run_dirs`). Returns (the path, the run
    already there or None); the caller decides whether that run may continue (:func:`check_resume`)."""
    p = check_output_dir(path, what)
    old = claim_run_dir(p, kind, what=what)
    if resume is not None:
        check_resume_mode(old, resume, what=what)
    lock_run_dir(p, what=what)
    return p, old


def resume_diffs(old: RunMeta, settings, *, rope=None, model_id: str | None = None,
                 also: Iterable[tuple[str, Any, Any]] = ()) -> list[str]:
    """``key old -> new`` for what differs between the run recorded in ``old`` and the resolved ``settings`` (a
    stage's settings dataclass, compared by each field's resume rule), the ``rope`` the model runs with (a
    ``RopeSpec``), the model's identity, and the ``also`` items (key, old, new); empty when it may continue."""
    diffs = []
    if rope is not None:
        was_rope = type(rope).from_record(old.rope, old.meta_path)
        if not was_rope.same_rope(rope):
            a, b = was_rope.label(), rope.label()
            if a == b:  # the label hides the field that differs (e.g. orig_ctx): name it
                da, db = was_rope.to_dict(), rope.to_dict()
                b += " (" + ", ".join(f"{k} {fmt(da.get(k))} -> {fmt(db.get(k))}" for k in sorted({*da, *db})
                                      if da.get(k) != db.get(k)) + ")"
            diffs.append(f"rope {a} -> {b}")
    if model_id is not None and old.model_id is not None and model_id != old.model_id:
        diffs.append(f"model_id {old.model_id} -> {model_id} (not the model this run read)")
    cls = type(settings)
    without = tuple(n for n in ("rope",) if n in nested_fields(cls))
    was = from_record(cls, old.settings, where=old.meta_path, without=without)
    diffs += settings_diff(was, settings, only=recorded_keys(cls, old.settings))
    diffs += [f"{k} {fmt(a)} -> {fmt(b)}" for k, a, b in also if a != b]
    return diffs


def refuse_resume(diffs: list[str], where: str | os.PathLike, *, note: str = "",
                  hint: str = "use another --out") -> InputError:
    """The one message of a refused resume: ``RUN.JSON: holds a run made with different settings: a 1 -> 2, ...``."""
    return InputError(f"holds a run made with different settings: {', '.join(diffs)}{note}; {hint}", where)


def check_resume(old: RunMeta, settings, *, rope=None, model_id: str | None = None,
                 also: Iterable[tuple[str, Any, Any]] = (), note: str = "", hint: str = "use another --out") -> None:
    """Refuse (InputError, one line) to continue ``old`` with other settings, rope or model (:func:`resume_diffs`)."""
    diffs = resume_diffs(old, settings, rope=rope, model_id=model_id, also=also)
    if diffs:
        raise refuse_resume(diffs, old.meta_path, note=note, hint=hint)


# ---------------------------------------------------------------- settings compared by their resume rules
def recorded_keys(cls, record: dict | None) -> set[str]:
    """The keys of ``cls`` a record holds (under any accepted spelling, or as a nested dict's field)."""
    record = record or {}
    out = set()
    for s in specs(cls):
        if any(k in record for k in s.accepted_keys) or (len(s.path) > 1 and isinstance(record.get(s.path[0]), dict)
                                                        and s.path[-1] in record[s.path[0]]):
            out.add(s.key)
    return out


def _same_path(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return Path(str(a)).expanduser().resolve() == Path(str(b)).expanduser().resolve()


def _same_value(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return a == b or math.isclose(a, b, rel_tol=1e-12)
    return a == b


def settings_diff(old, new, *, only: Iterable[str] | None = None) -> list[str]:
    """``key old -> new`` for every setting whose resume rule says the two differ (``same``: equal values;
    ``path``: the same file once resolved; ``grow``: may only increase; ``ignore``: never compared). Nested
    settings follow their field's rule. ``only``: compare just these keys (e.g. those a run recorded)."""
    cls = type(new)
    rules = {name: f.metadata.get("resume", "same") for name, f in
             ((f.name, f) for f in dataclasses.fields(cls)) if f.metadata.get("nested")}
    only = None if only is None else set(only)
    out = []
    for s in specs(cls):
        rule = rules.get(s.path[0], s.meta.resume) if len(s.path) > 1 else s.meta.resume
        if rule == "ignore" or (only is not None and s.key not in only):
            continue
        a, b = value_of(old, s), value_of(new, s)
        if rule == "path":
            same = _same_path(a, b)
        elif rule == "grow":
            same = a is None or b is None or b >= a
        else:
            same = _same_value(a, b)
        if not same:
            out.append(f"{s.key} {fmt(a)} -> {fmt(b)}")
    return out

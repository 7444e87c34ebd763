"""Tables and row labels the reports share (``eval_summ report``, ``probes report``): one table type written one way
(markdown / CSV / JSON, and ``DIR/<name>.{md,csv,json}``), one way to key and name a row.

A table is a header and rows of cells (str, int, float or None = missing). Markdown cells are formatted by the
table's ``cell`` function (each report picks its digits and its missing mark), or the table carries its own
markdown form (``md``); CSV writes missing cells empty and numbers as they are; JSON is ``{title, header, rows}``
unless the table carries its own JSON form (``json``).

A report row is one full setting (:class:`Setting`): the model (and its identity), the full RoPE spec, the
training record (or none: the method applied at load time), the prompt wording and whatever else a stage tells
apart. :func:`setting_labels` names every row by what differs between the rows shown (``abf x1 base=8e4`` vs
``abf x1 base=5e5``, ``yarn x8 (ft 1536)`` vs ``yarn x8 (no fine-tune)``), so no two rows read the same.
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .runs.identity import TrainLength

FORMATS = ("markdown", "csv", "json")
_NO_JSON = object()


def number(nd: int = 2, missing: str = "-") -> Callable[[Any], str]:
    """A markdown cell formatter: floats with ``nd`` digits, None as ``missing``, anything else as str."""

    def cell(v: Any) -> str:
        if v is None:
            return missing
        if isinstance(v, float):
            return f"{v:.{nd}f}"
        return str(v)

    return cell


@dataclass
class Table:
    """One table of a report, in every format (see module doc)."""

    name: str  # the file stem --out writes: DIR/<name>.{md,csv,json}
    title: str
    header: list[str]
    rows: list[list[Any]]  # values (None = missing): CSV and the default JSON
    cell: Callable[[Any], str] = str  # markdown cell formatter
    md: tuple[list[str], list[list[Any]]] | None = None  # a markdown form of its own (header, rows)
    json: Any = _NO_JSON  # a JSON form of its own
    note: str = ""  # markdown text under the table

    def text(self, fmt: str) -> str:
        if fmt == "json":
            return json_text({"title": self.title, "header": self.header, "rows": self.rows}
                             if self.json is _NO_JSON else self.json)
        if fmt == "csv":
            return csv_text(self.header, self.rows)
        header, rows = self.md if self.md is not None else (self.header, self.rows)
        note = f"\n{self.note.strip()}\n" if self.note else ""
        return f"### {self.title}\n\n{markdown(header, rows, self.cell)}\n{note}"


def markdown(header: Sequence[str], rows: Iterable[Sequence[Any]], cell: Callable[[Any], str] = str) -> str:
    """A GitHub markdown table (no trailing newline)."""
    out = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """CSV with a header line; missing cells empty."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        w.writerow(["" if v is None else v for v in r])
    return buf.getvalue()


def json_text(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, indent=2) + "\n"


def tables_text(tables: Sequence[Table], fmt: str, keys: Sequence[str] | None = None) -> str:
    """Several tables as one text, the way every report prints them: markdown, each table with a blank line
    between; CSV, one after the other; JSON, the list of their JSON objects, or with ``keys`` an object
    ``{key: table}``. ``fmt``: markdown (``md``), csv or json; another is an InputError."""
    from .io import InputError

    fmt = {"md": "markdown"}.get(fmt, fmt)
    if fmt == "json":
        return json_text({k: t.json for k, t in zip(keys, tables)} if keys is not None else [t.json for t in tables])
    if fmt == "csv":
        return "".join(t.text("csv") for t in tables)
    if fmt != "markdown":
        raise InputError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    return "\n".join(t.text("markdown") for t in tables)


def write_tables(tables: Iterable[Table], out_dir: str | os.PathLike) -> list[Path]:
    """The one table writer: each table as ``out_dir/<name>.{md,csv,json}``, atomically; returns the paths."""
    from .io import write_text_atomic

    written = []
    for t in tables:
        for ext, fmt in (("md", "markdown"), ("csv", "csv"), ("json", "json")):
            p = Path(out_dir) / f"{t.name}.{ext}"
            write_text_atomic(p, t.text(fmt))
            written.append(p)
    return written


# ---------------------------------------------------------------- rows: one full setting, one label
@dataclass(frozen=True)
class Setting:
    """What one report row stands for. Two results are pooled into a row only when every field is equal."""

    model: str  # as recorded: tiny, a model directory's path, or a name (a scores CSV)
    rope: Any = None  # the full RoPE spec (a rope_scaling.RopeSpec); None: not recorded (a scores CSV)
    train: str | None = None  # the training (runs.train_key); None: not fine-tuned by this project (or unknown)
    train_length: TrainLength | None = None
    model_id: str | None = None
    prompt_style: str | None = None  # the baseline prompts' wording (release | paper); None for the F.2 prompts
    variant: str = ""  # what else a stage tells apart (a probe's input length, variant, score)
    tag: str = field(default="", compare=True)  # a last resort: a run directory's name

    @classmethod
    def of_run(cls, meta, rope, *, variant: str = "", tag: str = "") -> "Setting":
        """The setting of a run (a runs.RunMeta) whose rope the caller read (``RopeSpec.from_record``)."""
        from .runs.identity import train_key

        train = meta.train
        key = train_key(train)
        length = meta.train_length
        if key is None and length is not None:
            key = f"length {length.text()}"  # an older record: its length is all it says
        style = meta.settings.get("prompt_style")
        return cls(str(meta.model), rope, key, length, meta.model_id, style if isinstance(style, str) else None,
                   variant, tag)


def model_labels(models: Iterable[str]) -> dict[str, str]:
    """How each model is named in a report: a path by its last two components (run.json stores absolute paths:
    /x/Qwen/Qwen1.5-7B -> Qwen/Qwen1.5-7B, /x/runs/ft-ntk8/merged -> ft-ntk8/merged), unless two different paths
    would then look the same (then the full path); names (tiny) as they are."""
    models = list(dict.fromkeys(str(m) for m in models))
    short = {m: _short(m) for m in models}
    seen: dict[str, set] = {}
    for m, s in short.items():
        seen.setdefault(s, set()).add(m)
    return {m: (s if len(seen[s]) == 1 else m) for m, s in short.items()}


def _short(model: str) -> str:
    if "/" in model or os.sep in model:
        parts = [p for p in Path(model).parts if p not in ("/", os.sep)]
        return "/".join(parts[-2:]) or model
    return model


@dataclass(frozen=True)
class Label:
    """A row's name, in parts (a table may show them as columns) and whole (``text``)."""

    model: str  # the model's name (+ a tag telling apart rows that would otherwise read the same)
    rope: str  # the RoPE spec as it differs between the rows (RopeSpec.label), "" when every row has none
    train: str  # "ft 1536" / "no fine-tune", "" when no row is fine-tuned
    style: str  # "paper prompts" / "release prompts" when the rows differ in it, else ""
    variant: str

    @property
    def method(self) -> str:
        """The RoPE part with the training: ``yarn x8 (ft 1536)``."""
        if self.rope and self.train:
            return f"{self.rope} ({self.train})"
        return self.rope or self.train

    @property
    def text(self) -> str:
        return " · ".join(p for p in (self.model, self.method, self.style, self.variant) if p)


def setting_labels(settings: Iterable[Setting]) -> dict[Setting, Label]:
    """The one label function: every setting's :class:`Label`, showing what differs between ``settings`` -- the
    model, the RoPE spec (the fields that differ between rows of one method, e.g. ``base=8e4`` vs ``base=5e5``,
    ``a=1`` vs ``a=0.1``), the training (``ft`` + the mean training length, or ``no fine-tune``), the prompt
    wording, the stage's variant -- and, should two rows still read the same, a tag (their training run's or
    model's id, or the run directory's name)."""
    settings = list(dict.fromkeys(settings))
    names = model_labels(s.model for s in settings)
    ropes = [s.rope for s in settings if s.rope is not None]
    show_rope = any(r.scaled for r in ropes)  # rope_scaling.RopeSpec: any method but the model's own
    by_method: dict[str, list[dict]] = {}
    for r in ropes:
        by_method.setdefault(r.method, []).append(r.to_dict())
    shown = {m: {k for k in ds[0] if k != "replace" and len({repr(d.get(k)) for d in ds}) > 1}
             for m, ds in by_method.items()}
    any_train = any(s.train is not None for s in settings)
    styles = {s.prompt_style for s in settings if s.prompt_style is not None}
    labels = {}
    for s in settings:
        rope = "" if not show_rope else ("-" if s.rope is None else s.rope.label(shown.get(s.rope.method, ())))
        train = "" if not any_train else ("no fine-tune" if s.train is None else
                                          f"ft {s.train_length.short() if s.train_length else '?'}")
        style = f"{s.prompt_style} prompts" if len(styles) > 1 and s.prompt_style else ""
        model = names[s.model] + (f" ({s.tag})" if s.tag else "")
        labels[s] = Label(model, rope, train, style, s.variant)
    # rows that still read the same: tell them apart by what does differ
    for attempt in ("train", "model_id", "index"):
        groups: dict[str, list[Setting]] = {}
        for s in settings:
            groups.setdefault(labels[s].text, []).append(s)
        clashes = [g for g in groups.values() if len(g) > 1]
        if not clashes:
            break
        for g in clashes:
            for i, s in enumerate(g):
                extra = {"train": _short_key(s.train), "model_id": (s.model_id or "")[:8], "index": str(i + 1)}[attempt]
                if extra:
                    lab = labels[s]
                    labels[s] = Label(f"{lab.model} #{extra}", lab.rope, lab.train, lab.style, lab.variant)
    return labels


def _short_key(train: str | None) -> str:
    """A training's key as a tag: the run id's first 6 digits and the step (``3fa9c1@24``)."""
    if not train or train.startswith("length "):
        return ""
    rid, _, step = train.partition("@")
    return rid[:6] + (f"@{step}" if step else "")

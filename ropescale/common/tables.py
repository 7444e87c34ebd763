"""Tables and labels the reports share (``eval_summ report``, ``probes report``): one markdown / CSV / JSON shape,
one way to name a model.

A table is a header and rows of cells (str, int, float or None = missing). Markdown cells are formatted by the
caller's ``cell`` function (each report picks its digits and its missing mark); CSV writes missing cells empty
and numbers as they are; JSON keeps the values.
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

FORMATS = ("markdown", "csv", "json")


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[Any]]
    extra: dict = field(default_factory=dict)  # what the JSON form carries beside header and rows (e.g. counts)


def number(nd: int = 2, missing: str = "-") -> Callable[[Any], str]:
    """A markdown cell formatter: floats with ``nd`` digits, None as ``missing``, anything else as str."""

    def cell(v: Any) -> str:
        if v is None:
            return missing
        if isinstance(v, float):
            return f"{v:.{nd}f}"
        return str(v)

    return cell


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

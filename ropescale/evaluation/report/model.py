"""The report's data model: a Series (a model under one RoPE setting and training length), the runs, the cells, and
the paper's formulas over them (Table 2 average and MSE, Table 7, extrapolation by subset or length bucket,
failure modes). Nothing here reads files or prints."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ropescale.common.io import InputError
from ropescale.common import subsets

KINDS = ("IE", "IB")
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


# ---------------------------------------------------------------- formulas
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


# ---------------------------------------------------------------- helpers
def _num(x: Any) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _run_subsets(r: RunResult) -> str:
    subs = sorted({str(s.get("subset")) for s in r.samples if s.get("subset") is not None}, key=subset_key)
    return ",".join(subs) if subs else "-"


subset_key = subsets.order_key  # L, XL, 2XL, 3XL, then T<n> by n (common.subsets)


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



def assemble(rows: Sequence[dict], runs: Sequence[RunResult], buckets: Optional[Sequence[int]] = None) -> Report:
    """The report of score ``rows`` ({model, kind, subset, rouge_l[, rope, scale, train_length]}) and ``runs``."""
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
            add(run.series, run.kind, sub, float(smp["rouge_l"]))
    columns = sorted({k[2] for k in cells}, key=subset_key)
    return Report(series=series, columns=columns, cells=cells, runs=runs,
                  buckets=list(buckets) if buckets else None)



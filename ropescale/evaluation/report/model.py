"""The report's data model: a row is one full setting (``ropescale.common.tables.Setting``: model and its id, full
RoPE spec, training record, prompt wording), the runs, the cells, and the paper's formulas over them (Table 2
average and MSE, Table 7, extrapolation by subset or length bucket, failure modes, exact recall per mark). Every
view keys its rows by the same settings and names them with the same labels (``tables.setting_labels``). Nothing
here reads files or prints."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ropescale.common.io import InputError
from ropescale.common.subsets import order_key
from ropescale.common.tables import Setting, setting_labels

KINDS = ("IE", "IB")
NO_SUBSET = "all"  # the column of runs generated without a subset (``generate --max-new-tokens`` only)
FLOOR = "marks only (floor)"  # the recall view's floor row: a prediction of the marks alone


@dataclass
class RunResult:
    path: Path
    series: Setting
    kind: str
    summary: dict
    samples: list
    fresh: bool = False
    label: str = ""  # the series' label in this report (set by assemble)


@dataclass
class Report:
    series: list  # [tables.Setting] in first-seen order
    columns: list  # subsets, ordered
    cells: dict  # (Setting, kind, subset) -> [sum, count]
    runs: list = field(default_factory=list)  # [RunResult]
    buckets: Optional[list] = None  # bucket edges (ints) when the extrapolation view uses length buckets
    labels: dict = field(default_factory=dict)  # Setting -> tables.Label

    def label(self, s: Setting) -> str:
        return self.labels[s].text

    # ---- views
    def value(self, s: Setting, kind: str, col: str) -> Optional[float]:
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
            out[self.label(s)] = {"avg": {c: prompt_average(ie.get(c), ib.get(c)) for c in cols},
                            "mse": mse_ie_ib(ie, ib), "IE": {c: ie.get(c) for c in cols},
                            "IB": {c: ib.get(c) for c in cols}}
        return out

    def extrapolation(self) -> tuple[list[str], list[dict]]:
        """(columns, rows): rows {setting, label (a tables.Label), cells {column: v}}."""
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
                rows.append({"setting": s, "label": self.labels[s], "cells": cells})
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
            rows.append({"run": str(r.path), "label": r.label, "kind": r.kind,
                         "subset": r.summary.get("subset") or _run_subsets(r), "n": r.summary.get("n"),
                         "rouge_l": r.summary.get("rouge_l"),
                         **{m: fm.get(m) for m in ("empty", "copy", "repetition", "echo")}})
        return rows


    def recall(self) -> tuple[int, list[dict]]:
        """Exact recall per mark (ropescale.common.recall.mark_recall) of the runs whose references are the recall
        task's: (K marks, rows {label (a tables.Label, None for the floor), subset, marks: [share of samples whose
        k-th marked sentence came back exactly, x100], mean, rouge_l, n}). A cell is the mean over the prompts
        present of each prompt's mean over samples (as the extrapolation view). Per subset, a floor row: a
        prediction of the marks alone (recall 0 by construction; its ROUGE-L is what marks and layout score)."""
        acc: dict = {}  # (setting, subset, kind) -> [(marks, rouge_l) per sample]
        floor: dict = {}  # subset -> {sample id: marks-only ROUGE-L}
        k_max = 0
        for r in self.runs:
            for smp in r.samples:
                marks = smp.get("marks")
                if not isinstance(marks, list) or not marks:
                    continue
                k_max = max(k_max, len(marks))
                sub = smp.get("subset") or r.summary.get("subset") or NO_SUBSET
                acc.setdefault((r.series, sub, r.kind), []).append((marks, float(smp["rouge_l"])))
                if isinstance(smp.get("marks_only_rouge_l"), (int, float)):
                    floor.setdefault(sub, {})[smp.get("id")] = float(smp["marks_only_rouge_l"])

        def mean(xs):
            return sum(xs) / len(xs)

        rows = []
        subsets = sorted({k[1] for k in acc}, key=order_key)
        for s in self.series:
            for sub in subsets:
                per_kind = [acc[(s, sub, k)] for k in KINDS if (s, sub, k) in acc]
                if not per_kind:
                    continue
                marks = [100 * mean([mean([float(i < len(m) and bool(m[i])) for m, _ in smp]) for smp in per_kind])
                         for i in range(k_max)]
                rows.append({"label": self.labels[s], "subset": sub, "marks": marks, "mean": mean(marks),
                             "rouge_l": mean([mean([rl for _, rl in smp]) for smp in per_kind]),
                             "n": sum(len(smp) for smp in per_kind)})
        for sub in subsets:
            vals = list(floor.get(sub, {}).values())
            if vals:
                rows.append({"label": None, "subset": sub, "marks": [0.0] * k_max, "mean": 0.0,
                             "rouge_l": mean(vals), "n": len(vals)})
        return k_max, rows


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
    subs = sorted({str(s.get("subset")) for s in r.samples if s.get("subset") is not None}, key=order_key)
    return ",".join(subs) if subs else "-"




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
    """The report of score ``rows`` ({setting (a tables.Setting), kind, subset, rouge_l}) and ``runs``: each
    setting one row in every view, named by ``tables.setting_labels``."""
    series: list = []
    cells: dict = {}

    def add(s: Setting, kind: str, subset: str, value: float) -> None:
        if s not in series:
            series.append(s)
        c = cells.setdefault((s, kind, subset), [0.0, 0])
        c[0] += value
        c[1] += 1

    for r in rows:
        add(r["setting"], r["kind"], r["subset"], float(r["rouge_l"]))
    for run in runs:
        for smp in run.samples:
            sub = smp.get("subset") or run.summary.get("subset") or NO_SUBSET
            add(run.series, run.kind, sub, float(smp["rouge_l"]))
    labels = setting_labels(series)
    for run in runs:
        run.label = labels[run.series].text
    columns = sorted({k[2] for k in cells}, key=order_key)
    return Report(series=series, columns=columns, cells=cells, runs=list(runs),
                  buckets=list(buckets) if buckets else None, labels=labels)

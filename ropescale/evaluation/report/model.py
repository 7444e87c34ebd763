"""The report's data model: a row is one full setting (``ropescale.common.tables.Setting``: model and its id, full
RoPE spec, training record, prompt wording), the runs, the cells, and the paper's formulas over them (Table 2
average and MSE, Table 7, extrapolation by subset or length bucket, failure modes, exact recall per mark), and
beside every cell what its uncertainty needs: the per-sample scores, keyed by the eval set the run read and the
sample's id (so a sample scored under Prompt-IE and Prompt-IB pairs; ``ropescale.common.stats`` computes the
intervals, the effective context length and retention from them). Every view keys its rows by the same settings and
names them with the same labels (``tables.setting_labels``). Nothing here reads files or prints."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ropescale.common.io import InputError
from ropescale.common.stats import lengths, means
from ropescale.common.stats import mse as mse_stats
from ropescale.common.stats.mse import mse_ie_ib
from ropescale.common.stats.resampling import RESAMPLES
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
    data: Optional[str] = None  # the eval set the run read (run.json's data): with a sample's id, the pairing key

    def sample_key(self, smp: dict, subset: str) -> tuple:
        """A sample's identity across runs: (the eval set, the sample's id). IE and IB runs of one eval set share
        it; without a recorded eval set, the subset stands in for it."""
        return (self.data if self.data is not None else f"subset {subset}", smp.get("id"))


@dataclass
class Report:
    series: list  # [tables.Setting] in first-seen order
    columns: list  # subsets, ordered
    cells: dict  # (Setting, kind, subset) -> [sum, count]
    runs: list = field(default_factory=list)  # [RunResult]
    buckets: Optional[list] = None  # bucket edges (ints) when the extrapolation view uses length buckets
    labels: dict = field(default_factory=dict)  # Setting -> tables.Label
    samples: dict = field(default_factory=dict)  # (Setting, kind, subset) -> {(eval set, sample id): score}
    base_ids: dict = field(default_factory=dict)  # Setting -> the id of the model it was fine-tuned from
    resamples: Optional[int] = None  # bootstrap resamples of the MSE's interval (None: stats.resampling.RESAMPLES)
    _memo: dict = field(default_factory=dict, repr=False)

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

    def extrapolation(self, threshold: Optional[float] = None) -> tuple[list[str], list[dict]]:
        """(columns, rows): rows {setting, label (a tables.Label), cells {column: v}, estimates {column:
        stats.means.Estimate: the cell with n, standard error and interval}, effective {"relative": NoLiMa's
        effective length (85 % of the row's own first-column score), "absolute": a fixed threshold's, RULER's rule (>=
        ``threshold``; None without one)}, retention (the row's first-column score / its base model's,
        :meth:`base_of`; None without a base)}. The first column is the row's "1x": the shortest length evaluated.
        With a threshold, a row whose first column is below it has no relative effective length (85 % of a score
        that fails the task measures nothing)."""
        cols, _ = self._columns()
        rows = []
        for s in self.series:
            est = {c: self.estimate(s, c) for c in cols}
            cells = {c: e.mean for c, e in est.items()}
            if all(v is None for v in cells.values()):
                continue
            ivs = {c: (e.lo, e.hi) for c, e in est.items()}
            first = cells[cols[0]] if cols else None
            rel = lengths.effective_length_relative(cells, columns=cols, intervals=ivs)
            if threshold is not None and (first is None or first < threshold):
                rel = lengths.EffectiveLength(None, "undefined", None, "relative")
            ab = None if threshold is None else lengths.effective_length(cells, threshold, columns=cols, intervals=ivs)
            base = self.base_of(s)
            ret = None if base is None or not cols else lengths.retention(first, self.estimate(base, cols[0]).mean)
            rows.append({"setting": s, "label": self.labels[s], "cells": cells, "estimates": est,
                         "effective": {"relative": rel, "absolute": ab}, "retention": ret})
        return cols, rows

    def _columns(self) -> tuple[list[str], dict]:
        """The extrapolation view's columns and their per-sample scores {(Setting, kind, column): {key: score}}:
        the subsets, or the ``--buckets`` of input length (each sample in the bucket of its own input_tokens)."""
        if self.buckets is None:
            return list(self.columns), self.samples
        if "buckets" not in self._memo:
            labels = bucket_labels(self.buckets)
            samples: dict = {}
            for r in self.runs:
                for smp in r.samples:
                    t = smp.get("input_tokens")
                    if not isinstance(t, (int, float)):
                        continue
                    sub = smp.get("subset") or r.summary.get("subset") or NO_SUBSET
                    col = labels[bucket_index(self.buckets, t)]
                    key = (sub, *r.sample_key(smp, sub))  # the subset too: a bucket may span several
                    samples.setdefault((r.series, r.kind, col), {})[key] = float(smp["rouge_l"])
            used = [lab for lab in labels if any(k[2] == lab for k in samples)]
            self._memo["buckets"] = (used, samples)
        return self._memo["buckets"]

    def prompt_samples(self, s: Setting, col: str) -> list[dict]:
        """Each prompt's samples of one cell of the extrapolation view ({(eval set, id): score}, IE then IB, the
        prompts present)."""
        _, samples = self._columns()
        return [samples[(s, k, col)] for k in KINDS if (s, k, col) in samples]

    def estimate(self, s: Setting, col: str, kind: Optional[str] = None) -> Any:
        """A cell as a ``stats.means.Estimate`` (mean, n, standard error, interval: Student's t): the
        extrapolation view's cell (the mean of the prompts' means, pairs resampled together) or, with ``kind``,
        one prompt's (Table 7). A cell from a scores CSV has one number per prompt: its mean, n the numbers, no
        interval."""
        key = ("estimate", s, col, kind, self.buckets is not None)
        if key in self._memo:
            return self._memo[key]
        kinds = KINDS if kind is None else (kind,)
        _, samples = self._columns()
        groups = [samples[(s, k, col)] for k in kinds if (s, k, col) in samples]
        if self.buckets is None and any((s, k, col) in self.cells and (s, k, col) not in samples for k in kinds):
            vals = [v for v in (self.value(s, k, col) for k in kinds) if v is not None]  # scores CSV cells
            est = means.Estimate(sum(vals) / len(vals), len(vals))
        else:
            est = means.cell_of_prompts(groups, resamples=self._resamples())
        self._memo[key] = est
        return est

    def difference(self, s: Setting, col: str) -> Any:
        """IE - IB of one subset as a ``stats.means.Difference`` (paired interval, ids scored under one
        prompt only listed); a scores CSV's cell: the difference alone; None without both prompts."""
        ie, ib = self.samples.get((s, "IE", col)), self.samples.get((s, "IB", col))
        if ie and ib:
            return means.ie_minus_ib(ie, ib, resamples=self._resamples())
        a, b = self.value(s, "IE", col), self.value(s, "IB", col)
        return None if a is None or b is None else means.Difference(a - b, 2, n_pairs=1)

    def mse(self, s: Setting) -> Any:
        """MSE(P-IE vs P-IB) of a row as a ``stats.mse.MSE``: the Table 2 value over its subsets, its noise
        floor and interval from the per-sample scores (a scores CSV's row: the MSE alone)."""
        cols = [c for c in self.columns if any((s, k, c) in self.cells for k in KINDS)]
        pairs = {c: (self.samples.get((s, "IE", c), {}), self.samples.get((s, "IB", c), {})) for c in cols}
        if cols and all(ie and ib for ie, ib in pairs.values()):
            return mse_stats.mse_with_floor(pairs, resamples=self._resamples())
        vals = mse_ie_ib({c: self.value(s, "IE", c) for c in cols}, {c: self.value(s, "IB", c) for c in cols})
        return mse_stats.MSE(vals, None, cells=len(cols) if vals is not None else 0)

    def base_of(self, s: Setting) -> Optional[Setting]:
        """The row that is ``s``'s base model: unscaled (no RoPE method), not fine-tuned, the same prompt wording and
        variant, and the model ``s`` is (or was fine-tuned from: its training record's ``base_model_id``; by name
        where no id is recorded). None when the report has no such row."""
        want = self.base_ids.get(s) or s.model_id
        for t in self.series:
            if t.train is not None or (t.rope is not None and t.rope.scaled):
                continue
            if (t.prompt_style, t.variant) != (s.prompt_style, s.variant):
                continue
            if (want is not None and t.model_id == want) or (want is None and t.model == s.model):
                return t
        return None

    def floor(self, col: str) -> Any:
        """The recall task's marks-only floor of one subset as a ``stats.means.Estimate``: the ROUGE-L of an answer
        holding the marks alone, one value per eval sample (the runs' ``marks_only_rouge_l``); None without it."""
        vals = {}
        for r in self.runs:
            for smp in r.samples:
                sub = smp.get("subset") or r.summary.get("subset") or NO_SUBSET
                if sub == col and isinstance(smp.get("marks_only_rouge_l"), (int, float)):
                    vals[r.sample_key(smp, sub)] = float(smp["marks_only_rouge_l"])
        return means.cell(vals, resamples=self._resamples()) if vals else None

    def _resamples(self) -> int:
        return RESAMPLES if self.resamples is None else self.resamples

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
        k-th marked sentence came back exactly, x100], mean, rouge_l, n (eval samples: one scored under two
        prompts counts once)}). A cell is the mean over the prompts present of each prompt's mean over samples (as
        the extrapolation view). Per subset, a floor row: a
        prediction of the marks alone (recall 0 by construction; its ROUGE-L is what marks and layout score)."""
        acc: dict = {}  # (setting, subset, kind) -> [(marks, rouge_l, sample key) per sample]
        floor: dict = {}  # subset -> {sample id: marks-only ROUGE-L}
        k_max = 0
        for r in self.runs:
            for smp in r.samples:
                marks = smp.get("marks")
                if not isinstance(marks, list) or not marks:
                    continue
                k_max = max(k_max, len(marks))
                sub = smp.get("subset") or r.summary.get("subset") or NO_SUBSET
                acc.setdefault((r.series, sub, r.kind), []).append((marks, float(smp["rouge_l"]),
                                                                    r.sample_key(smp, sub)))
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
                marks = [100 * mean([mean([float(i < len(m) and bool(m[i])) for m, _, _ in smp])
                                     for smp in per_kind]) for i in range(k_max)]
                rows.append({"label": self.labels[s], "subset": sub, "marks": marks, "mean": mean(marks),
                             "rouge_l": mean([mean([rl for _, rl, _ in smp]) for smp in per_kind]),
                             "n": len({key for smp in per_kind for _, _, key in smp})})
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



def assemble(rows: Sequence[dict], runs: Sequence[RunResult], buckets: Optional[Sequence[int]] = None,
             resamples: Optional[int] = None) -> Report:
    """The report of score ``rows`` ({setting (a tables.Setting), kind, subset, rouge_l}) and ``runs``: each
    setting one row in every view, named by ``tables.setting_labels``; every run sample kept under its pairing key
    (:meth:`RunResult.sample_key`). The same sample of one setting and prompt in two runs (one eval set pooled
    twice) is an InputError naming both run directories."""
    series: list = []
    cells: dict = {}
    samples: dict = {}
    owner: dict = {}  # (setting, kind, subset, sample key) -> the run directory it came from

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
            key = run.sample_key(smp, sub)
            first = owner.setdefault((run.series, run.kind, sub, key), run.path)
            if (run.series, run.kind, sub) in samples and key in samples[(run.series, run.kind, sub)]:
                where = "twice in this run" if first == run.path else f"also in {first}"
                raise InputError(f"sample {key[1]!r} of {key[0]} under prompt {run.kind} is {where}: the same "
                                 "setting, prompt and eval set pooled twice (give one of the two runs)", run.path)
            add(run.series, run.kind, sub, float(smp["rouge_l"]))
            samples.setdefault((run.series, run.kind, sub), {})[key] = float(smp["rouge_l"])
    labels = setting_labels(series)
    base_ids = {}
    for run in runs:
        run.label = labels[run.series].text
        train = run.summary.get("train")
        if isinstance(train, dict) and train.get("base_model_id"):
            base_ids[run.series] = train["base_model_id"]
    columns = sorted({k[2] for k in cells}, key=order_key)
    return Report(series=series, columns=columns, cells=cells, runs=list(runs),
                  buckets=list(buckets) if buckets else None, labels=labels, samples=samples, base_ids=base_ids,
                  resamples=resamples)

"""The evaluation report's figure, CNNSum Fig. 3 (:func:`plot_fig3`), written as every figure is
(``ropescale.common.plot``: headless, atomic, its text drawable).

Fig. 3: per-sample ROUGE-L against input length, IE and IB together, drawn so that it cannot contradict the
report's tables: one figure, two panels (Prompt-IE left, Prompt-IB right; a panel is drawn only if it has data).
Every row of the report (one setting) is one colour: its samples as faint dots, and at each column of the tables
(a subset, or a ``--buckets`` length bucket) the column's mean -- the Table 7 cell, the same number -- at the
mean input length of its samples, with the cell's 95 % t interval as an error bar; the legend gives each
row's n per point. CNNSum Fig. 3's moving median (a centred window of ``window`` samples sorted by input length,
truncated at the ends) is drawn through the dots only where every column of the row has at least ``window``
samples, so no window is wider than the points it smooths and a median never mixes lengths a column keeps apart
(with few samples a row shows its means alone, and the caption says so). Headless (matplotlib's Agg backend); the
PNG is written atomically. Text the default font cannot draw (Chinese) gets a font that can, or '?' where none is
installed (``common.plot.fit_text``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

from ropescale.common.io import InputError
from ropescale.common.plot import fit_text, save_png

KIND_TITLES = {"IE": "Prompt-IE", "IB": "Prompt-IB"}


def moving_median(values: Sequence[float], window: int = 15) -> list[float]:
    """Centred moving median (CNNSum Fig. 3, window size 15): median of values[i-w//2 : i+w//2+1], clipped."""
    import statistics

    if window < 1:
        raise ValueError("window must be >= 1")
    h = window // 2
    n = len(values)
    return [statistics.median(values[max(0, i - h): min(n, i + h + 1)]) for i in range(n)]


def series_from_runs(runs: Iterable, report=None) -> list[dict]:
    """[{label, kind, points: [(input_tokens, rouge_l)], cells: [{col, x, mean, lo, hi, n}]}] from
    report.RunResult objects (runs of one series and prompt kind are pooled; samples without input_tokens are left
    out). With the ``report`` (a ``model.Report``) each series gets its cells: per column of the report's tables
    (a subset, or a length bucket), the cell's estimate (``Report.estimate``: mean, n, 95 % interval; what Table 7
    shows) at ``x``, the mean input length of the column's samples."""
    from .model import NO_SUBSET, bucket_index, bucket_labels

    out: dict = {}
    xs: dict = {}  # (label, kind) -> {column: [input tokens]}
    for r in runs:
        key = (r.label, r.kind)  # the report's row label: one full setting
        d = out.setdefault(key, {"label": r.label, "kind": r.kind, "points": [], "cells": [], "_series": r.series})
        for s in r.samples:
            t = s.get("input_tokens")
            if not isinstance(t, (int, float)):
                continue
            d["points"].append((float(t), float(s["rouge_l"])))
            if report is not None:
                sub = s.get("subset") or r.summary.get("subset") or NO_SUBSET
                col = sub if report.buckets is None else bucket_labels(report.buckets)[bucket_index(report.buckets, t)]
                xs.setdefault(key, {}).setdefault(col, []).append(float(t))
    for key, d in out.items():
        series = d.pop("_series")
        for col, ts in sorted(xs.get(key, {}).items(), key=lambda kv: sum(kv[1]) / len(kv[1])):
            e = report.estimate(series, col, d["kind"])
            if e.mean is not None:
                d["cells"].append({"col": col, "x": sum(ts) / len(ts), "mean": e.mean, "lo": e.lo, "hi": e.hi,
                                   "n": e.n})
    return [d for d in out.values() if d["points"]]


def _n_text(ns: Sequence[int]) -> str:
    lo, hi = min(ns), max(ns)
    return f"n={lo}" if lo == hi else f"n={lo}-{hi}"


def smoothing_window(s: dict, window: int) -> int | None:
    """The moving median's window for one series: ``window`` when every column of the series has at least that many
    samples (or, a series without columns, when it has that many points), else None (no median: it would be wider
    than the points it smooths)."""
    counts = [c["n"] for c in s.get("cells") or []] or [len(s["points"])]
    return window if min(counts) >= window else None


def fig3_figure(series: Sequence[dict], window: int = 15):
    """The Fig. 3 figure (matplotlib ``Figure``) of the series (:func:`series_from_runs`): per panel (prompt kind),
    each series' samples as dots, its cells' means with their intervals as error bars (the legend names the n per
    point), and the moving median where :func:`smoothing_window` allows it; the caption says which were drawn."""
    series = [s for s in series if s.get("points")]
    if not series:
        raise InputError("nothing to plot: no sample has input_tokens and a score")
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    kinds = [k for k in ("IE", "IB") if any(s["kind"] == k for s in series)]
    kinds += sorted({s["kind"] for s in series} - set(kinds))
    fig = Figure(figsize=(6.0 * len(kinds), 4.9), dpi=110)
    axes = fig.subplots(1, len(kinds), squeeze=False)[0]
    labels = list(dict.fromkeys(s["label"] for s in series))
    cmap = matplotlib.colormaps["tab10"]
    colors = {lab: cmap(i % 10) for i, lab in enumerate(labels)}
    smoothed, unsmoothed = False, False
    for ax, kind in zip(axes, kinds):
        for s in (s for s in series if s["kind"] == kind):
            c = colors[s["label"]]
            pts = sorted(s["points"])
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=6, alpha=0.25, color=c, linewidths=0)
            cells = s.get("cells") or []
            if cells:
                ys = [x["mean"] for x in cells]
                err = [[m - (x["lo"] if x["lo"] is not None else m) for m, x in zip(ys, cells)],
                       [(x["hi"] if x["hi"] is not None else m) - m for m, x in zip(ys, cells)]]
                ax.errorbar([x["x"] for x in cells], ys, yerr=err, color=c, marker="o", ms=4, lw=1.6, capsize=3,
                            label=f"{s['label']} ({_n_text([x['n'] for x in cells])} per point)")
            w = smoothing_window(s, window)
            if w is not None:
                smoothed = True
                ax.plot([p[0] for p in pts], moving_median([p[1] for p in pts], w), color=c, lw=1.0, ls="--",
                        alpha=0.8, **({} if cells else {"label": f"{s['label']} (moving median of {w}, "
                                                                   f"n={len(pts)})"}))
            else:
                unsmoothed = True
                if not cells:
                    ax.plot([], [], color=c, label=f"{s['label']} (n={len(pts)})")
        ax.set_title(KIND_TITLES.get(kind, kind))
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel("ROUGE-L")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("ROUGE-L vs input length", fontsize=10)
    import textwrap

    fig.text(0.5, 0.01, textwrap.fill(caption(window, smoothed, unsmoothed), 100 * len(kinds)), ha="center",
             va="bottom", fontsize=7)
    fit_text(fig)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def caption(window: int, smoothed: bool, unsmoothed: bool) -> str:
    """What Fig. 3 draws, in one or two lines under it."""
    text = ("Dots: samples. Markers: each column's mean ROUGE-L (the tables' cells) with its 95% t interval, "
            "n per point in the legend.")
    if smoothed:
        text += f" Dashed: moving median of {window} samples."
    if unsmoothed:
        text += f" No moving median where a column has fewer than {window} samples."
    return text


def plot_fig3(series: Sequence[dict], path: str | os.PathLike, window: int = 15) -> Path:
    """Draw the series (:func:`series_from_runs`: {label, kind 'IE'|'IB', points [(input_tokens, rouge_l)], cells
    [...]}) into a PNG at ``path`` (:func:`fig3_figure`)."""
    return save_png(fig3_figure(series, window), path)

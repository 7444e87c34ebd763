"""The reports' figures, written one way (:func:`save_png`: headless, atomic): CNNSum Fig. 3 for the evaluation
report (:func:`plot_fig3`) and the probes' extrapolation panels (``probes.plot_probes``).

Fig. 3: per-sample ROUGE-L against input length, IE and IB together, drawn so that it cannot contradict the
report's tables: one figure, two panels (Prompt-IE left, Prompt-IB right; a panel is drawn only if it has data).
Every row of the report (one setting) is one colour: its samples as faint dots, and at each column of the tables
(a subset, or a ``--buckets`` length bucket) the column's mean -- the Table 7 cell, the same number -- at the
mean input length of its samples, with the cell's 95 % bootstrap interval as an error bar; the legend gives each
row's n per point. CNNSum Fig. 3's moving median (a centred window of ``window`` samples sorted by input length,
truncated at the ends) is drawn through the dots only where every column of the row has at least ``window``
samples, so no window is wider than the points it smooths and a median never mixes lengths a column keeps apart
(with few samples a row shows its means alone, and the caption says so). Headless (matplotlib's Agg backend); the
PNG is written atomically. Text the default font cannot draw (Chinese) gets a font that can, or '?' where none is
installed (:func:`fit_text`).
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Iterable, Sequence

from ropescale.common.io import InputError, atomic_open

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
    text = ("Dots: samples. Markers: each column's mean ROUGE-L (the tables' cells) with its 95% bootstrap interval, "
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


_charmaps: dict[str, set] = {}
NO_FONT_NOTE = ("[report] note: no installed font has the glyphs of {chars} (Chinese, say): drawn as '?' (with a CJK "
                "font installed, e.g. apt install fonts-noto-cjk, they are drawn as they are)")


def _charmap(path: str) -> set:
    from matplotlib.ft2font import FT2Font

    if path not in _charmaps:
        _charmaps[path] = set(FT2Font(path).get_charmap())
    return _charmaps[path]


def font_with(chars: set[str]) -> str | None:
    """The name of an installed font that has a glyph for each of ``chars`` (matplotlib ships DejaVu, which has
    Latin, Greek and Cyrillic but no Chinese), or None."""
    from matplotlib import font_manager

    need = {ord(c) for c in chars}
    for f in font_manager.fontManager.ttflist:
        if f.name.startswith("Last Resort"):  # matplotlib's own: every code point, each drawn as a box
            continue
        try:
            if need <= _charmap(f.fname):
                return f.name
        except (OSError, RuntimeError):  # an unreadable font file
            continue
    return None


def fit_text(fig) -> None:
    """Every text of ``fig`` drawable with real glyphs, called before layout: characters the default font lacks
    (Chinese in a run's label) are drawn with an installed font that has them (matplotlib's font fallback), or --
    no such font, as on a bare machine -- replaced by '?', with one note on stderr instead of a box per glyph and a
    warning per character."""
    import sys

    from matplotlib import font_manager
    from matplotlib.text import Text

    texts = [t for t in fig.findobj(Text) if t.get_text()]
    base = font_manager.findfont(font_manager.FontProperties(family=["sans-serif"]))
    have = _charmap(base)
    missing = {c for t in texts for c in t.get_text() if not c.isspace() and ord(c) not in have}
    if not missing:
        return
    font = font_with(missing)
    for t in texts:
        if any(c in missing for c in t.get_text()):
            if font:
                t.set_fontfamily([font_manager.FontProperties(fname=base).get_name(), font])
            else:
                t.set_text("".join("?" if c in missing else c for c in t.get_text()))
    if font is None:
        print(NO_FONT_NOTE.format(chars="".join(sorted(missing))[:20]), file=sys.stderr)


def save_png(fig, path: str | os.PathLike, dpi: int | None = None) -> Path:
    """Write a matplotlib figure as a PNG at ``path`` atomically (rendered in memory, then renamed into place;
    the mode a plain write gets)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **({"dpi": dpi} if dpi else {}))
    path = Path(path)
    with atomic_open(path, "wb") as f:
        f.write(buf.getvalue())
    return path

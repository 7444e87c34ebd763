"""The reports' figures, written one way (:func:`save_png`: headless, atomic): CNNSum Fig. 3 for the evaluation
report (:func:`plot_fig3`) and the probes' extrapolation panels (``probes.plot_probes``).

Fig. 3: per-sample ROUGE-L against input length with a moving median (window 15), IE and IB together.

One figure, two panels (Prompt-IE left, Prompt-IB right; a panel is drawn only if it has data). Every run
series is one colour: its samples as faint dots and, through them, the moving median of ROUGE-L over the
samples sorted by input length (a centred window of ``window`` samples, truncated at the ends). Headless
(matplotlib's Agg backend); the PNG is written atomically. Text the default font cannot draw (Chinese) gets a
font that can, or '?' where none is installed (:func:`fit_text`).
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


def series_from_runs(runs: Iterable) -> list[dict]:
    """[{label, kind, points: [(input_tokens, rouge_l)]}] from report.RunResult objects (runs of one series and
    prompt kind are pooled; samples without input_tokens are left out)."""
    out: dict = {}
    for r in runs:
        key = (r.label, r.kind)  # the report's row label: one full setting
        d = out.setdefault(key, {"label": r.label, "kind": r.kind, "points": []})
        for s in r.samples:
            t = s.get("input_tokens")
            if isinstance(t, (int, float)):
                d["points"].append((float(t), float(s["rouge_l"])))
    return [d for d in out.values() if d["points"]]


def plot_fig3(series: Sequence[dict], path: str | os.PathLike, window: int = 15,
              title: str = "Moving median ROUGE-L (window {window}) vs input length") -> Path:
    """Draw the series ({label, kind 'IE'|'IB', points [(input_tokens, rouge_l)]}) into a PNG at ``path``."""
    series = [s for s in series if s.get("points")]
    if not series:
        raise InputError("nothing to plot: no sample has input_tokens and a score")
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    kinds = [k for k in ("IE", "IB") if any(s["kind"] == k for s in series)]
    kinds += sorted({s["kind"] for s in series} - set(kinds))
    fig = Figure(figsize=(6.0 * len(kinds), 4.5), dpi=110)
    axes = fig.subplots(1, len(kinds), squeeze=False)[0]
    labels = list(dict.fromkeys(s["label"] for s in series))
    cmap = matplotlib.colormaps["tab10"]
    colors = {lab: cmap(i % 10) for i, lab in enumerate(labels)}
    for ax, kind in zip(axes, kinds):
        for s in (s for s in series if s["kind"] == kind):
            pts = sorted(s["points"])
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            c = colors[s["label"]]
            ax.scatter(xs, ys, s=6, alpha=0.25, color=c, linewidths=0)
            ax.plot(xs, moving_median(ys, window), color=c, lw=1.8, label=s["label"])
        ax.set_title(KIND_TITLES.get(kind, kind))
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel("ROUGE-L")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(title.format(window=window), fontsize=10)
    fit_text(fig)
    fig.tight_layout()
    return save_png(fig, path)


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

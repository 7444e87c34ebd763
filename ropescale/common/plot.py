"""Figures written one way: headless (matplotlib's Agg backend), the PNG rendered in memory and renamed into place
(:func:`save_png`), and every text drawable with real glyphs (:func:`fit_text`: text the default font cannot draw,
Chinese say, gets an installed font that can, or '?' and one note where none is installed). Used by the evaluation
report's Fig. 3, the probes' panels and a training run's loss curves."""
from __future__ import annotations

import io
import os
import sys
from pathlib import Path

from .io import atomic_open

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

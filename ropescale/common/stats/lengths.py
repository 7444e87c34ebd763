"""A row's effective context length (NoLiMa's relative rule; the absolute rule of a fixed threshold, RULER's, which is
RULER's effective length only with RULER's kind of threshold -- a reference model's score -- and the above-floor length
with a floor's) and short-context retention (LongRoPE2). Pure functions of cell values."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from .resampling import finite

NOLIMA_KEEP = 0.85  # NoLiMa: the effective length keeps >= 85 % of the base score


@dataclass(frozen=True)
class EffectiveLength:
    """The effective context length of a row under one convention (see :func:`effective_length`).

    ``length``: the longest evaluated column of the passing run that starts at the first column (None: none passes);
    ``stop``: what ended that run -- ``"fail"`` (the next column scores below the threshold), ``"missing"`` (the next
    column has no finite score: the claim stops where the measurements do) or ``"end"`` (every column passed: the
    row holds past the longest length evaluated, RULER's ">128K"); ``later_passes``: columns past the stop that pass
    again (shown, never counted); ``straddles``: columns up to the stop whose interval contains the threshold (the
    pass/fail there is inside the noise); ``threshold``: the score a column must reach (None: undefined, e.g. the
    relative rule without a positive 1x score)."""

    length: Optional[str]
    stop: str  # "fail", "missing", "end" or "undefined" (no threshold)
    threshold: Optional[float]
    rule: str  # "relative" (NoLiMa's rule) or "absolute" (a fixed threshold: RULER's rule)
    stopped_at: Optional[str] = None  # the column that failed or was missing (None: "end", "undefined")
    later_passes: tuple = ()
    straddles: tuple = ()

    def text(self) -> str:
        """RULER's and NoLiMa's notation: ``T2048``; ``<T512`` (fails at the first length, T512); ``>T4096`` (holds
        at every length evaluated, the longest being T4096); ``T1024 (T2048 missing)``; ``-`` (undefined)."""
        if self.stop in ("undefined", "end") or self.length is None and self.stop == "fail":
            return {"undefined": "-", "end": f">{self.length}", "fail": f"<{self.stopped_at}"}[self.stop]
        if self.stop == "missing":
            return f"{self.length or '-'} ({self.stopped_at} missing)"
        return str(self.length)

    def to_dict(self) -> dict:
        return {"length": self.length, "text": self.text(), "stop": self.stop, "stopped_at": self.stopped_at,
                "threshold": self.threshold, "rule": self.rule, "later_passes": list(self.later_passes),
                "straddles": list(self.straddles)}


def effective_length(cells: Mapping[str, Optional[float]], threshold: Optional[float], *, rule: str = "absolute",
                     columns: Optional[Sequence[str]] = None,
                     intervals: Optional[Mapping[str, tuple[Optional[float], Optional[float]]]] = None
                     ) -> EffectiveLength:
    """The longest evaluated length up to which a row keeps its score >= ``threshold`` (RULER, arXiv 2404.06654,
    github.com/NVIDIA/RULER README: a model handles a length when its score there exceeds a fixed threshold,
    Llama-2-7B's 85.6 at 4K, and its "Effective Length" is the longest such length; a score equal to the threshold
    counts, as RULER's table underlines Qwen3-32B's 85.6 at 128K).

    ``cells``: {column: score}; ``columns``: the evaluated lengths in order, the 1x column first (default: the
    keys of ``cells``; a column absent from ``cells`` is a missing cell). The walk starts at the first column and stops
    at the first column that fails (score < threshold) or has no finite score (absent, None, NaN: not measured, so no
    claim past it); the effective length is the last column before the stop. Neither paper's table has a row that
    fails and then passes again, and both define the length as the longest one the model *maintains*, so a pass
    after a failure is not counted: it is listed in ``later_passes``. ``intervals`` ({column: (lo, hi)}) marks the
    columns up to the stop whose interval contains the threshold (``straddles``)."""
    cols = list(cells if columns is None else columns)
    if not cols or threshold is None or not math.isfinite(threshold):
        return EffectiveLength(None, "undefined", None, rule)
    scores = [finite(cells.get(c)) for c in cols]
    k = next((k for k, v in enumerate(scores) if v is None or v < threshold), len(cols))  # where the walk stops
    length = cols[k - 1] if k else None
    stop = "end" if k == len(cols) else ("missing" if scores[k] is None else "fail")
    later = tuple(c for c, v in zip(cols[k + 1:], scores[k + 1:]) if v is not None and v >= threshold)
    straddles = ()
    if intervals:
        straddles = tuple(c for c in cols[:k + 1] if (iv := intervals.get(c)) and None not in iv
                          and iv[0] <= threshold <= iv[1])
    return EffectiveLength(length, stop, float(threshold), rule, None if stop == "end" else cols[k], later,
                           straddles)


def effective_length_relative(cells: Mapping[str, Optional[float]], *, keep: float = NOLIMA_KEEP,
                              base: Optional[float] = None, columns: Optional[Sequence[str]] = None,
                              intervals: Optional[Mapping[str, tuple[Optional[float], Optional[float]]]] = None
                              ) -> EffectiveLength:
    """NoLiMa's effective length (arXiv 2502.05167; README: "the longest context where a model maintains at least
    85% of its base score"): :func:`effective_length` with the threshold ``keep`` x the base score: ``base`` when
    given, else the row's own score at its first column (1x). NoLiMa's base score is the model's score at short
    contexts (250-1K tokens), below its shortest column; here the first column is inside the original window.
    Undefined (``-``) when the base is missing, not finite or <= 0 (every score keeps 85 % of nothing)."""
    cols = list(cells if columns is None else columns)
    ref = finite(base) if base is not None else (finite(cells.get(cols[0])) if cols else None)
    threshold = keep * ref if ref is not None and ref > 0 else None
    return effective_length(cells, threshold, rule="relative", columns=cols, intervals=intervals)


def retention(row_1x: Optional[float], base_1x: Optional[float]) -> Optional[float]:
    """Short-context retention (LongRoPE2, arXiv 2502.20082, abstract: the extended model "retaining over 98.5% of
    short-context performance", its short-context score as a share of the original model's): the row's 1x score /
    the unscaled base model's 1x score; None when either is missing or not finite, or the base's is <= 0."""
    r, b = finite(row_1x), finite(base_1x)
    if r is None or b is None or b <= 0:
        return None
    return r / b

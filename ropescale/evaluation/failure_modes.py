"""Failure modes of long-context summaries (CNNSum Sec 4.4 and Appendix E), per prediction and as rates per run.

The paper's bad cases and the rule that flags each one here. Texts are compared after NFKC normalization (so
full-width and ASCII punctuation match: '摘要：' == '摘要:') with all whitespace removed, on characters — Chinese
has no spaces, and a character n-gram of 8+ is far longer than the names and set phrases a real summary shares
with its source.

- ``empty``: the prediction has no letter, digit or CJK character (``""``, whitespace, only '.' or '。').
- ``copy`` (E.3 "Copy From the Novel Excerpt", E.5 "Randomly Copy"): at least ``COPY_THRESHOLD`` = 50% of the
  prediction's character ``COPY_N``-grams (``COPY_N`` = 8) occur verbatim in the context. Needs the context;
  ``None`` when it is not known. A prediction shorter than ``COPY_N`` characters is never a copy.
- ``repetition`` (E.4 "meaningless repetition", E.5, E.6): at least ``REPEAT_THRESHOLD`` = 30% of the
  prediction's character ``REPEAT_N``-grams (``REPEAT_N`` = 10) already occurred earlier in the prediction.
  A text of length L looping with period P has L-P-n+1 of its L-n+1 n-grams repeated, so two full copies of
  a sentence of 20+ characters already reach the threshold, while a summary that restates a phrase once stays
  far below it (real GPT-4 / Moonshot summaries: at most 0.17).
- ``echo`` (E.4 "请注意，摘要应…", E.6 Llama3.1 repeating the prompt's last sentence): the prediction contains a
  sentence or marker of a prompt: any of ``ropescale.common.prompts.INSTRUCTION_FRAGMENTS`` (the instruction clauses
  of Appendix F.1/F.2 and the ``[原文_开始]`` / ``[原文_结束]`` / ``[摘要]`` markers), or the prompt's summary cue
  ('摘要：') twice or more.

Rates per run are the share of predictions flagged; the copy rate is over the predictions whose context is
known (``None`` if none is).
"""
from __future__ import annotations

import unicodedata
from typing import Iterable, Optional

from ropescale.common.prompts import INSTRUCTION_FRAGMENTS

COPY_N = 8
COPY_THRESHOLD = 0.5
REPEAT_N = 10
REPEAT_THRESHOLD = 0.3
SUMMARY_CUE = "摘要:"  # NFKC of the baseline prompts' '摘要：'
MODES = ("empty", "copy", "repetition", "echo")


def normalize(text: str) -> str:
    """NFKC (full-width punctuation -> ASCII) with every whitespace character removed."""
    return "".join(unicodedata.normalize("NFKC", text).split())


_FRAGMENTS = tuple(dict.fromkeys(normalize(f) for f in INSTRUCTION_FRAGMENTS))


def is_empty(prediction: str) -> bool:
    """No letter, digit or CJK character at all."""
    return not any(ch.isalnum() for ch in prediction)


def _ngrams(s: str, n: int) -> list[str]:
    return [s[i:i + n] for i in range(len(s) - n + 1)]


def copy_share(prediction: str, context: str, n: int = COPY_N) -> Optional[float]:
    """Share of the prediction's character n-grams found verbatim in the context (None if it has none)."""
    grams = _ngrams(normalize(prediction), n)
    if not grams:
        return None
    src = set(_ngrams(normalize(context), n))
    return sum(g in src for g in grams) / len(grams)


def repetition_share(prediction: str, n: int = REPEAT_N) -> Optional[float]:
    """Share of the prediction's character n-grams that already occurred earlier in it (None if it has none)."""
    grams = _ngrams(normalize(prediction), n)
    if not grams:
        return None
    seen: set = set()
    rep = 0
    for g in grams:
        if g in seen:
            rep += 1
        else:
            seen.add(g)
    return rep / len(grams)


def echo_fragments(prediction: str) -> list[str]:
    """The prompt sentences / markers the prediction contains (normalized forms)."""
    p = normalize(prediction)
    found = [f for f in _FRAGMENTS if f in p]
    if p.count(SUMMARY_CUE) >= 2:
        found.append(SUMMARY_CUE)
    return found


def detect(prediction: str, context: Optional[str] = None) -> dict:
    """Flags and measurements of every failure mode for one prediction (``copy`` is None without a context)."""
    cs = copy_share(prediction, context) if context is not None else None
    rs = repetition_share(prediction)
    echoes = echo_fragments(prediction)
    return {
        "empty": is_empty(prediction),
        "copy": None if context is None else bool(cs is not None and cs >= COPY_THRESHOLD),
        "copy_share": cs,
        "repetition": bool(rs is not None and rs >= REPEAT_THRESHOLD),
        "repetition_share": rs,
        "echo": bool(echoes),
        "echo_fragments": echoes,
    }


def rates(flags: Iterable[dict]) -> dict:
    """Share of predictions flagged per mode: {'empty', 'copy', 'repetition', 'echo', 'n'} (copy over known)."""
    flags = list(flags)
    out: dict = {"n": len(flags)}
    for mode in MODES:
        vals = [f[mode] for f in flags if f.get(mode) is not None]
        out[mode] = (sum(bool(v) for v in vals) / len(vals)) if vals else None
    return out

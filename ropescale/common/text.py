"""Text facts shared by data_concat and probes: where a Chinese (or English) sentence ends."""
from __future__ import annotations

import re

# Sentence ends: Chinese 。！？ (a run of them, e.g. "！？"), or ASCII .!? followed by whitespace / end of text
# (a bare '?' inside Chinese text is a lost character in these editions, not an end), each with any closing
# quotes/brackets that follow (”」』’"' and ）)》); a line break also ends a sentence (paragraph end).
_SENT_END = re.compile(r"(?:[。！？]+|[.!?]+(?=[”」』’\"'）)》]*(?:\s|$)))[”」』’\"'）)》]*[ \t]*\n?|\n")


def split_sentences(text: str) -> list[str]:
    """Split into sentences that concatenate back to ``text`` exactly (each keeps its end mark, closing quotes
    and trailing line break). Chinese sentences end at 。！？ plus closing quotes ”」』 (Laban et al. 2021 split
    documents into sentences; this is the Chinese equivalent); whitespace-only pieces are merged into the
    previous sentence."""
    out: list[str] = []
    pos = 0
    for m in _SENT_END.finditer(text):
        if m.end() <= pos:
            continue
        out.append(text[pos:m.end()])
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    merged: list[str] = []
    for s in out:
        if merged and not s.strip():
            merged[-1] += s
        else:
            merged.append(s)
    return merged


def sentence_ends(text: str) -> list[int]:
    """Character offsets just after each sentence of :func:`split_sentences` (trailing whitespace excluded)."""
    ends, pos = [], 0
    for s in split_sentences(text):
        pos += len(s)
        ends.append(pos - (len(s) - len(s.rstrip())))
    return ends

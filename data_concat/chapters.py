"""Chapters of the shared novels and their token counts, shared by ``pairs`` and ``sample``."""
from __future__ import annotations

import bisect
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ropescale.io import InputError, read_jsonl

# How several chapter headings are merged into one summary (a window of chapters -> its headings, in order).
MERGE_SEP = "；"
# A sentence ends after one of these, optionally followed by closing quotes.
_SENTENCE_END = re.compile(r"[。！？!?…][」』”’\"']*")


@dataclass
class Chapter:
    book: str
    chapter: int
    title: str
    text: str
    where: str = ""


@dataclass
class Tokenized:
    """A text with the character offset where each token ends (``ends[i]`` = end of token i)."""

    text: str
    ends: list[int] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return len(self.ends)

    def tokens_upto(self, pos: int) -> int:
        """Number of tokens that end at or before character ``pos`` (the token count of ``text[:pos]``, up to
        merges across the cut, which callers re-check)."""
        return bisect.bisect_right(self.ends, pos)


def read_chapters(path: str | os.PathLike, *, on_bad: str = "error",
                  on_skip: Callable[[InputError], None] | None = None) -> list[Chapter]:
    """Chapters ``{book, chapter, title, text}`` (the shared novels' format); bad lines: error or counted skip."""
    path = Path(path)
    skip = on_bad == "skip"
    out = []
    for obj in read_jsonl(path, required=("book", "chapter", "title", "text"), skip_bad=skip, on_skip=on_skip):
        line = obj["_line"]
        try:
            for k in ("book", "title", "text"):
                if not isinstance(obj[k], str) or not obj[k].strip():
                    raise InputError(f"empty or non-string {k!r}", path, line)
            try:
                num = int(obj["chapter"])
            except (TypeError, ValueError):
                raise InputError(f"'chapter' is not an integer: {obj['chapter']!r}", path, line) from None
        except InputError as e:
            if not skip:
                raise
            if on_skip is not None:
                on_skip(e)
            continue
        out.append(Chapter(obj["book"], num, obj["title"].strip(), obj["text"], f"{path}:{line}"))
    return out


def by_book(chapters: Sequence[Chapter]) -> dict[str, list[Chapter]]:
    """Chapters grouped by book, books and chapters in input order."""
    out: dict[str, list[Chapter]] = {}
    for c in chapters:
        out.setdefault(c.book, []).append(c)
    return out


def tokenize_with_offsets(tok, texts: Sequence[str], batch_size: int = 32) -> list[Tokenized]:
    """Tokenize texts (no special tokens), keeping each token's end offset."""
    out: list[Tokenized] = []
    for s in range(0, len(texts), batch_size):
        chunk = list(texts[s:s + batch_size])
        enc = tok(chunk, add_special_tokens=False, return_offsets_mapping=True)
        for text, offs in zip(chunk, enc["offset_mapping"]):
            out.append(Tokenized(text, [int(e) for _, e in offs]))
    return out


def count_tokens(tok, texts: Sequence[str], batch_size: int = 32) -> list[int]:
    out: list[int] = []
    for s in range(0, len(texts), batch_size):
        out += [len(x) for x in tok(list(texts[s:s + batch_size]), add_special_tokens=False)["input_ids"]]
    return out


def paragraph_cuts(text: str) -> list[int]:
    """Character positions where ``text`` may be cut at a paragraph boundary (end of each paragraph)."""
    return [m.start() for m in re.finditer("\n", text)] + [len(text)]


def sentence_cuts(text: str) -> list[int]:
    """Character positions right after each sentence end."""
    return [m.end() for m in _SENTENCE_END.finditer(text)] + [len(text)]


def merged_title(chapters: Sequence[Chapter]) -> str:
    """The summary of a window of chapters: their headings in order, joined by MERGE_SEP."""
    return MERGE_SEP.join(c.title for c in chapters)

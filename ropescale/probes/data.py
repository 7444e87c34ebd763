"""Probe inputs: books of chapters (the shared novels), documents from any JSONL, and sentence splitting.

- Chapters JSONL ({book, chapter, title, text}, e.g. ropescale.CHAPTERS_JSONL): each chapter is rendered the way the
  book prints it: a heading line ``第N回 <title>`` (水浒传's chapter 0: ``楔子 <title>``), then the body, then a
  newline. A book is its chapters in file order.
- Documents JSONL: one document a line with ``text`` (or ``context``); optional ``id`` and ``book`` (documents
  with the same ``book`` count as one book for "same-book" negatives; without it each document is its own book).
  A chapters file is read as documents too: one document per book (headings included).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ropescale.common.chapters import (Chapter, by_book, chapter_heading, chapter_index,  # noqa: F401  (re-exported)
                                chinese_numeral, read_chapters)
from ropescale.common.io import InputError, read_jsonl
from ropescale.common.text import split_sentences  # noqa: F401  (the one sentence splitter, re-exported for the probes)

@dataclass
class Doc:
    """A document: ``id``, ``book`` (grouping for same-book sampling), ``text``; ``where`` = file:line."""

    id: str
    book: str
    text: str
    where: str = ""
    chapters: list[Chapter] = field(default_factory=list)


def is_chapters_file(path: str | os.PathLike) -> bool:
    """True when the file's first record has the chapters fields {book, chapter, title, text}."""
    for row in read_jsonl(path):
        return all(k in row for k in ("book", "chapter", "title", "text"))
    raise InputError("empty file", path)


def load_books(path: str | os.PathLike) -> dict[str, list[Chapter]]:
    """Chapters JSONL -> {book: [Chapter, ...]} in file order (see :func:`ropescale.common.chapters.read_chapters`)."""
    books = by_book(read_chapters(path))
    if not books:
        raise InputError("no chapters", path)
    return books


def render_chapter(ch: Chapter) -> str:
    return f"{ch.heading}\n{ch.text.rstrip()}\n"


def load_docs(path: str | os.PathLike, tail_chapters: int = 0) -> list[Doc]:
    """Documents from a documents JSONL ({text} or {context}) or a chapters JSONL (one document per book;
    ``tail_chapters`` > 0 keeps only each book's last N chapters, e.g. text held out from training)."""
    path = Path(path)
    if is_chapters_file(path):
        docs = []
        for book, chs in load_books(path).items():
            if tail_chapters > 0:
                chs = chs[-tail_chapters:]
            docs.append(Doc(book, book, "".join(render_chapter(c) for c in chs), chs[0].where, chs))
        return docs
    docs = []
    seen = set()
    for row in read_jsonl(path, required=("text",), aliases={"context": "text"}):
        ln = row["_line"]
        if not isinstance(row["text"], str) or not row["text"].strip():
            raise InputError("'text' must be a non-empty string", path, ln)
        did = str(row.get("id", f"line{ln}"))
        if did in seen:
            raise InputError(f"duplicate document id {did!r}", path, ln)
        seen.add(did)
        docs.append(Doc(did, str(row.get("book", did)), row["text"], f"{path}:{ln}"))
    if not docs:
        raise InputError("no documents", path)
    return docs



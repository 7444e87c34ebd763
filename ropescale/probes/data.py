"""Probe inputs: books of chapters (the shared novels), documents from any JSONL, and sentence splitting.

- Chapters JSONL ({book, chapter, title, text}, e.g. ropescale.CHAPTERS_JSONL): each chapter is rendered the way the
  book prints it: a heading line ``第N回 <title>`` (水浒传's chapter 0: ``楔子 <title>``), then the body, then a
  newline. A book is its chapters in file order.
- Documents JSONL: one document a line with ``text`` (or ``context``); optional ``id`` and ``book`` (documents
  with the same ``book`` count as one book for "same-book" negatives; without it each document is its own book).
  A chapters file is read as documents too: one document per book (headings included).

With ``--model tiny`` (a tiny build: a model directory holding ``tiny.json``) and no ``--data``, every probe reads
the chapters that build held out (``tiny.json``'s ``heldout_chapters``, the last 12 of each book for the committed
default): the shared novels' other chapters are its training text. :func:`heldout_default` makes that choice.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ropescale.common.chapters import Chapter, by_book, read_chapters
from ropescale.common.io import InputError, check_input_file, read_jsonl, write_jsonl_atomic
from ropescale.common.models import is_tiny, resolve_model
from ropescale.common.paths import CACHE_DIR, CHAPTERS_JSONL


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


def data_name(docs: list[Doc]) -> str:
    """The file the documents were read from (what a probe records as its ``data``); empty for no documents."""
    return docs[0].where.rsplit(":", 1)[0] if docs else ""


def load_docs(path: str | os.PathLike, tail_chapters: int = 0) -> list[Doc]:
    """Documents from a plain text file (``.txt``: one document), a documents JSONL ({text} or {context}) or a
    chapters JSONL (one document per book; ``tail_chapters`` > 0 keeps only each book's last N chapters, e.g. text
    held out from training)."""
    path = Path(path)
    if path.suffix.lower() == ".txt":  # plain text (e.g. a novel): one document
        text = check_input_file(path).read_text(encoding="utf-8")
        if not text.strip():
            raise InputError("empty file", path)
        return [Doc(path.stem, path.stem, text, f"{path}:1")]
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




def tiny_heldout_file(model: str | os.PathLike) -> Path | None:
    """A chapters JSONL of the chapters a tiny build held out from its training (its ``tiny.json``
    ``heldout_chapters``, taken from the shared novels in file order; written once under the cache), or None
    when ``model`` is not a tiny build."""
    d = resolve_model(model) if is_tiny(model) else Path(model)
    info = d / "tiny.json"
    if not info.is_file():
        return None
    meta = json.loads(info.read_text(encoding="utf-8"))
    names = meta.get("heldout_chapters")
    if not names:
        return None
    out = CACHE_DIR / "probes" / f"tiny-{meta.get('key', 'build')}-heldout.jsonl"
    if not out.is_file():
        keep = set(names)
        chs = [c for c in read_chapters(CHAPTERS_JSONL) if f"{c.book}:{c.chapter}" in keep]
        if len(chs) != len(keep):
            raise InputError(f"{len(keep) - len(chs)} of the chapters its build held out are not in the shared "
                             f"novels", info)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl_atomic(out, ({"book": c.book, "chapter": c.chapter, "title": c.title, "text": c.text}
                                 for c in chs))
    return out


def heldout_default(settings, data_given: bool, log=None):
    """``settings`` with ``data`` pointed at the tiny build's held-out chapters (:func:`tiny_heldout_file`) when
    the model is a tiny build and ``--data`` was left at its default (the shared novels, the build's training
    text); unchanged otherwise."""
    if data_given or Path(settings.data) != Path(CHAPTERS_JSONL):
        return settings
    held = tiny_heldout_file(settings.model)
    if held is None:
        return settings
    (log or (lambda m: print(m, file=sys.stderr)))(
        f"[probes] --model {settings.model}: reading the chapters its build held out from training ({held}); "
        f"--data chooses other text")
    return dataclasses.replace(settings, data=str(held))

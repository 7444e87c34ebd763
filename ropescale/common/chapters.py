"""The shared novels' chapters: one reader, one ``Chapter`` record, one printed heading.

Format (``ropescale.common.paths.CHAPTERS_JSONL``): one chapter a line, ``{book, chapter, title, text}``; ``chapter``
is an integer (水浒传's prologue 楔子 is chapter 0), books are contiguous and in reading order. ``data_concat`` (pairs,
the CNNSum sampler), ``probes`` (books for suffix identification / shuffles), ``training`` and the tiny default all
read it through :func:`read_chapters`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .io import InputError, read_jsonl
from .paths import CHAPTERS_JSONL

_DIGITS = "零一二三四五六七八九"


def chinese_numeral(n: int) -> str:
    """1 -> 一, 10 -> 十, 21 -> 二十一, 101 -> 一百零一, 120 -> 一百二十 (as chapter numbers are printed)."""
    if n < 0 or n >= 10000:
        raise ValueError(f"chapter number out of range: {n}")
    if n < 10:
        return _DIGITS[n]
    out, zero = "", False
    for value, unit in ((1000, "千"), (100, "百"), (10, "十"), (1, "")):
        d = n // value % 10
        if d == 0:
            zero = bool(out)
            continue
        if zero:
            out += "零"
            zero = False
        out += ("" if (d == 1 and unit == "十" and not out) else _DIGITS[d]) + unit
    return out


def chapter_index(chapter: int) -> str:
    """The printed chapter index: 第N回 (chapter 0 is 水浒传's prologue 楔子)."""
    return "楔子" if chapter == 0 else f"第{chinese_numeral(chapter)}回"


def chapter_heading(chapter: int, title: str) -> str:
    """The printed heading line of a chapter: ``第N回 <title>``."""
    return f"{chapter_index(chapter)} {title}".rstrip()


@dataclass
class Chapter:
    book: str
    chapter: int
    title: str
    text: str
    where: str = ""  # file:line it came from (for error messages)

    @property
    def heading(self) -> str:
        return chapter_heading(self.chapter, self.title)


ON_BAD = ("error", "skip")  # what read_chapters does with a malformed or empty line


def add_on_bad(parser) -> None:
    """``--on-bad`` of a command that reads chapters (:func:`read_chapters`' ``on_bad``)."""
    parser.add_argument("--on-bad", choices=ON_BAD, default="error",
                        help="malformed or empty chapter lines: stop with FILE:LINE (error) or skip and count them "
                             "(default: error)")


def read_chapters(path: str | os.PathLike = CHAPTERS_JSONL, *, on_bad: str = "error",
                  on_skip: Callable[[InputError], None] | None = None,
                  books: str | Sequence[str] | None = None) -> list[Chapter]:
    """Chapters in file order. A bad line (missing field, empty or non-string book/title/text, non-integer chapter)
    is an error naming file and line, or with ``on_bad="skip"`` is passed to ``on_skip`` and left out. ``books``
    (names, or one comma-separated string as ``--books`` takes it) keeps only those books; a name with no
    chapters in the file is an error. A file with no (valid) chapter at all is an error."""
    path = Path(path)
    skip = on_bad == "skip"
    out = []
    skipped = [0]

    def _skip(err: InputError) -> None:
        skipped[0] += 1
        if on_skip is not None:
            on_skip(err)

    for obj in read_jsonl(path, required=("book", "chapter", "title", "text"), skip_bad=skip, on_skip=_skip):
        line = obj["_line"]
        try:
            for k in ("book", "title", "text"):
                if not isinstance(obj[k], str) or not obj[k].strip():
                    raise InputError(f"empty or non-string {k!r}", path, line)
            num = obj["chapter"]
            if isinstance(num, bool):
                num = None
            try:
                num = int(num)
            except (TypeError, ValueError):
                raise InputError(f"'chapter' is not an integer: {obj['chapter']!r}", path, line) from None
        except InputError as e:
            if not skip:
                raise
            _skip(e)
            continue
        out.append(Chapter(obj["book"], num, obj["title"].strip(), obj["text"], f"{path}:{line}"))
    if not out:
        why = f"{skipped[0]} bad line(s) skipped" if skipped[0] else "empty file"
        raise InputError(f"no chapters ({why})", path)
    if books:
        wanted = [b.strip() for b in books.split(",")] if isinstance(books, str) else list(books)
        wanted = [b for b in wanted if b]
        missing = sorted(set(wanted) - {c.book for c in out})
        if missing:
            raise InputError(f"no chapters of book(s) {', '.join(missing)}", path)
        out = [c for c in out if c.book in wanted]
    return out


def load_chapters(path: str | os.PathLike = CHAPTERS_JSONL) -> list[dict]:
    """The chapters as plain dicts ``{book, chapter, title, text}``, through :func:`read_chapters`."""
    return [{"book": c.book, "chapter": c.chapter, "title": c.title, "text": c.text} for c in read_chapters(path)]


def by_book(chapters: Sequence[Chapter]) -> dict[str, list[Chapter]]:
    """Chapters grouped by book, books and chapters in input order."""
    out: dict[str, list[Chapter]] = {}
    for c in chapters:
        out.setdefault(c.book, []).append(c)
    return out

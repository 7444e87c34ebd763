"""Chapters of the shared novels and their token counts, shared by ``pairs`` and ``sample``."""
from __future__ import annotations

import bisect
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ropescale.common.chapters import Chapter
from ropescale.common.io import write_json_atomic
from ropescale.common.text import sentence_ends

# How several chapter headings are merged into one summary (a window of chapters -> its headings, in order).
MERGE_SEP = "；"


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


def tokenize_with_offsets(tok, texts: Sequence[str], batch_size: int = 32, on_batch=None) -> list[Tokenized]:
    """Tokenize texts (no special tokens), keeping each token's end offset; ``on_batch(n)`` after each batch of
    ``n`` texts (a progress bar's ``update``)."""
    out: list[Tokenized] = []
    for s in range(0, len(texts), batch_size):
        chunk = list(texts[s:s + batch_size])
        enc = tok(chunk, add_special_tokens=False, return_offsets_mapping=True)
        for text, offs in zip(chunk, enc["offset_mapping"]):
            out.append(Tokenized(text, [int(e) for _, e in offs]))
        if on_batch is not None:
            on_batch(len(chunk))
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
    """Character positions right after each sentence end (ropescale.common.text, the splitter the probes use too)."""
    ends = sentence_ends(text)
    return ends if ends and ends[-1] == len(text) else ends + [len(text)]


def merged_title(chapters: Sequence[Chapter]) -> str:
    """The summary of a window of chapters: their headings in order, joined by MERGE_SEP."""
    return MERGE_SEP.join(c.title for c in chapters)


def _tokenizer_fingerprint(tok) -> str | None:
    """sha256 over the tokenizer's files (None when it was not loaded from a directory)."""
    d = Path(str(getattr(tok, "name_or_path", "")))
    if not d.is_dir():
        return None
    h = hashlib.sha256()
    found = False
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "tokenizer.model"):
        f = d / name
        if f.is_file():
            found = True
            h.update(name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16] if found else None


def paragraph_token_counts(tok, texts: Sequence[str], *, cache: bool = True, on_batch=None) -> list[list[int]]:
    """For each text, the token counts of its paragraphs (lines): the text's tokens partitioned by the paragraph
    a token ends in, so they sum to the text's token count exactly. Cached on disk per tokenizer and text
    (``$ROPESCALE_CACHE/data_concat/``) so repeated runs over the same novels skip tokenization."""
    from ropescale.common.paths import CACHE_DIR

    fp = _tokenizer_fingerprint(tok) if cache else None
    path = CACHE_DIR / "data_concat" / f"paracounts-{fp}.json" if fp else None
    store: dict[str, list[int]] = {}
    if path is not None and path.is_file():
        try:
            store = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            store = {}
    keys = [hashlib.sha1(t.encode("utf-8")).hexdigest() for t in texts]
    todo = [i for i, k in enumerate(keys) if k not in store]
    if on_batch is not None and len(todo) < len(texts):
        on_batch(len(texts) - len(todo))  # (``on_batch``: progress, texts counted as they are done)
    for i, tz in zip(todo, tokenize_with_offsets(tok, [texts[i] for i in todo], on_batch=on_batch)):
        starts, pos = [], 0
        for line in texts[i].split("\n"):
            starts.append(pos)
            pos += len(line) + 1
        bounds = [tz.tokens_upto(s) for s in starts[1:]] + [tz.n_tokens]
        store[keys[i]] = [b - a for a, b in zip([0] + bounds[:-1], bounds)]
    if todo and path is not None:
        write_json_atomic(path, store)
    return [store[k] for k in keys]

"""Real summarization pairs from the shared novels: ``{id, book, chapters, context, summary, tokens, cut}``.

The summary is the chapter's 回目 heading couplet (``title``): a one-line summary the author wrote. Sizes are
context tokens of the given tokenizer, in [min_tokens, max_tokens]:

- A chapter shorter than ``min_tokens`` is merged with the following chapters of the same book until the window
  reaches ``min_tokens`` (context = the chapter texts joined by a newline, summary = their headings joined by
  "；"). A book's last window still below ``min_tokens`` is dropped and counted (``dropped_short``).
- A context longer than ``max_tokens`` is cut at the last paragraph boundary that keeps it within
  [min_tokens, max_tokens] (``cut_paragraph``); when no paragraph boundary does (one very long paragraph), at the
  last sentence end (``cut_sentence``); when neither works the window is dropped (``dropped_uncuttable``).
  ``--split first`` (default) keeps the first piece of each window and counts the tokens left out
  (``tokens_left_out``); ``--split all`` cuts the whole window into consecutive pieces, each paired with the
  headings of the chapters it overlaps, and counts the final remainder below ``min_tokens`` (``tail_tokens``).
  A piece's heading summarizes its whole chapter, so a cut piece is a looser pair than a whole chapter.
Every pair's ``tokens`` is the exact token count of its context (re-tokenized after cutting).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Sequence

from ropescale.common.chapters import Chapter, add_on_bad, by_book, read_chapters
from ropescale.common.cli import add_command, add_json, add_overwrite
from ropescale.common.io import InputError, claim_output_file, write_jsonl_atomic

from .cuts import MERGE_SEP, count_tokens, merged_title, paragraph_cuts, sentence_cuts, tokenize_with_offsets

SPLITS = ("first", "all")


@dataclass
class _Window:
    chapters: list[Chapter]
    text: str
    spans: list[tuple[int, int]]  # character span of each chapter in text


def _join(chs: Sequence[Chapter]) -> _Window:
    parts, spans, pos = [], [], 0
    for c in chs:
        spans.append((pos, pos + len(c.text)))
        parts.append(c.text)
        pos += len(c.text) + 1
    return _Window(list(chs), "\n".join(parts), spans)


def _pick_cut(tz, start_char: int, start_tok: int, lo: int, hi: int, cuts: list[int]) -> list[int]:
    """Cut positions after ``start_char`` whose piece has lo..hi tokens (by offsets), longest piece first."""
    out = []
    for p in cuts:
        if p <= start_char:
            continue
        n = tz.tokens_upto(p) - start_tok
        if n > hi:
            break
        if n >= lo:
            out.append(p)
    return out[::-1]


def build_pairs(chapters: Sequence[Chapter], tok, min_tokens: int, max_tokens: int, *, split: str = "first",
                max_pairs: int | None = None, progress: bool = False) -> tuple[list[dict], dict]:
    """Pairs from chapters (see module doc). Returns (pairs, report of counts)."""
    if split not in SPLITS:
        raise InputError(f"unknown --split {split!r} (choose from {', '.join(SPLITS)})")
    if min_tokens <= 0 or max_tokens < min_tokens:
        raise InputError(f"bad token range [{min_tokens}, {max_tokens}]: need 0 < min <= max")
    from tqdm import tqdm

    rep = {"chapters": len(chapters), "pairs": 0, "whole": 0, "merged_windows": 0, "cut_paragraph": 0,
           "cut_sentence": 0, "dropped_short": 0, "dropped_short_chapters": [], "dropped_uncuttable": 0,
           "tokens_left_out": 0, "tail_tokens": 0}
    pairs: list[dict] = []
    bar = tqdm(total=len(chapters), desc="tokenizing chapters", unit="ch", disable=not progress, file=sys.stderr,
               leave=False)
    books = by_book(chapters)
    for book, chs in books.items():
        tzs = tokenize_with_offsets(tok, [c.text for c in chs], on_batch=bar.update)  # (the slow part: the bar)
        counts = [t.n_tokens for t in tzs]
        i = 0
        while i < len(chs):
            if max_pairs is not None and len(pairs) >= max_pairs:
                break
            j, total = i + 1, counts[i]
            while total < min_tokens and j < len(chs):
                total += counts[j]
                j += 1
            win = _join(chs[i:j])
            tz = tzs[i] if j == i + 1 else tokenize_with_offsets(tok, [win.text])[0]
            while tz.n_tokens < min_tokens and j < len(chs):  # joining can merge tokens across a boundary
                j += 1
                win = _join(chs[i:j])
                tz = tokenize_with_offsets(tok, [win.text])[0]
            i = j
            if tz.n_tokens < min_tokens:
                rep["dropped_short"] += 1
                rep["dropped_short_chapters"] += [f"{c.book}:{c.chapter}" for c in win.chapters]
                continue
            if len(win.chapters) > 1:
                rep["merged_windows"] += 1
            _cut_window(win, tz, tok, min_tokens, max_tokens, split, pairs, rep, max_pairs)
        if max_pairs is not None and len(pairs) >= max_pairs:
            break
    bar.close()
    rep["pairs"] = len(pairs)
    return pairs, rep


def _cut_window(win: _Window, tz, tok, lo: int, hi: int, split: str, pairs: list, rep: dict,
                max_pairs: int | None) -> None:
    text = win.text
    start_char, start_tok, piece = 0, 0, 0
    multi = split == "all" and tz.n_tokens > hi
    while True:
        if max_pairs is not None and len(pairs) >= max_pairs:
            return
        rest_tokens = tz.n_tokens - start_tok
        if start_char == 0 and rest_tokens <= hi:
            n = count_tokens(tok, [text])[0]
            if lo <= n <= hi:
                pairs.append(_record(win, 0, len(text), text, n, "none", None))
                rep["whole"] += 1
                return
        if rest_tokens < lo:
            rep["tail_tokens"] += max(0, rest_tokens)
            return
        cut = _next_cut(tz, tok, text, start_char, start_tok, lo, hi)
        if cut is None:
            if start_char == 0:
                rep["dropped_uncuttable"] += 1
            else:
                rep["tail_tokens"] += rest_tokens
            return
        end, kind, ctx, n = cut
        rep["cut_" + kind] += 1
        pairs.append(_record(win, start_char, end, ctx, n, kind, piece if multi else None))
        used = tz.tokens_upto(end)
        if split == "first":
            rep["tokens_left_out"] += tz.n_tokens - used
            return
        piece += 1
        start_char, start_tok = end, used
        if start_tok >= tz.n_tokens:
            return


def _next_cut(tz, tok, text: str, start_char: int, start_tok: int, lo: int, hi: int):
    """(end, kind, context, tokens) of the first cut after ``start_char`` -- at a paragraph end, else at a sentence
    end -- whose piece has ``lo`` to ``hi`` tokens; None when there is none."""
    for kind, cuts in (("paragraph", paragraph_cuts(text)), ("sentence", sentence_cuts(text))):
        for p in _pick_cut(tz, start_char, start_tok, lo, hi, cuts):
            ctx = text[start_char:p].strip("\n")
            n = count_tokens(tok, [ctx])[0]
            if lo <= n <= hi:
                return p, kind, ctx, n
    return None


def _record(win: _Window, a: int, b: int, ctx: str, n: int, cut: str, piece: int | None) -> dict:
    chs = [c for c, (s, e) in zip(win.chapters, win.spans) if s < b and e > a]
    first, last = chs[0], chs[-1]
    pid = f"{first.book}-{first.chapter}" + (f"-{last.chapter}" if len(chs) > 1 else "")
    if piece is not None:
        pid += f"-p{piece}"
    return {"id": pid, "book": first.book, "chapters": [c.chapter for c in chs], "context": ctx,
            "summary": merged_title(chs), "tokens": n, "cut": cut}


def register(sub) -> None:
    p = add_command(sub, "pairs", help="build {context, summary} pairs from the shared novels", description=__doc__)
    p.add_argument("--chapters", required=True, metavar="FILE",
                   help="chapters JSONL {book, chapter, title, text} (e.g. ../shared/data/novels/chapters.jsonl)")
    p.add_argument("--tokenizer", default="tiny", help="tokenizer directory, or 'tiny' (default: tiny)")
    p.add_argument("--min-tokens", type=int, required=True, metavar="N", help="minimum context length in tokens")
    p.add_argument("--max-tokens", type=int, required=True, metavar="N", help="maximum context length in tokens")
    p.add_argument("--split", choices=SPLITS, default="first",
                   help="long windows: keep the first piece (first) or all consecutive pieces (all) (default: first)")
    p.add_argument("--books", help="comma-separated book names to use; default: all")
    p.add_argument("--max-pairs", type=int, metavar="N", help="stop after this many pairs")
    add_on_bad(p)
    p.add_argument("--out", required=True, metavar="FILE", help="output JSONL (written atomically)")
    add_json(p, "the report")
    add_overwrite(p)
    p.set_defaults(func=cmd_pairs)


def cmd_pairs(args) -> int:
    from .tokenizer import load_tokenizer

    claim_output_file(args.out, overwrite=args.overwrite)
    if args.max_pairs is not None and args.max_pairs <= 0:
        raise InputError(f"--max-pairs must be positive, got {args.max_pairs}")
    bad = []
    chs = read_chapters(args.chapters, on_bad=args.on_bad, on_skip=bad.append, books=args.books)
    tok = load_tokenizer(args.tokenizer)
    pairs, rep = build_pairs(chs, tok, args.min_tokens, args.max_tokens, split=args.split,
                             max_pairs=args.max_pairs, progress=sys.stderr.isatty())
    rep["skipped_bad_lines"] = len(bad)
    rep["skipped_bad"] = [str(e) for e in bad]
    write_jsonl_atomic(args.out, pairs)
    if args.json:
        print(json.dumps(rep, ensure_ascii=False))
    else:
        toks = [p["tokens"] for p in pairs]
        print(f"pairs: {len(pairs)} from {rep['chapters']} chapters   context tokens min/mean/max: "
              f"{min(toks, default=0)} / {round(sum(toks) / max(1, len(toks)), 1)} / {max(toks, default=0)}")
        print(f"whole windows: {rep['whole']}   merged windows: {rep['merged_windows']}   "
              f"cut at paragraph: {rep['cut_paragraph']}   at sentence: {rep['cut_sentence']}")
        print(f"dropped: short {rep['dropped_short']}, uncuttable {rep['dropped_uncuttable']}, "
              f"bad lines {len(bad)}   tokens left out: {rep['tokens_left_out']}   tail tokens: "
              f"{rep['tail_tokens']}")
        print(f"wrote {args.out}")
    return 0


__all__ = ["MERGE_SEP", "build_pairs", "register"]

"""The CNNSum multi-scale sampler (arXiv 2412.02819, Sec 3.2), for any book of chapters.

For a target range R = [T - a, T + 2K] (presets in ropescale.common.subsets) and a book B = {c_0, ..., c_i}:
(1) a sliding window w starts from c_0 and expands chapter by chapter; (2) when w = [c_j, ..., c_k]:
  i.   if len(w) < inf R, expand w with c_{k+1};
  ii.  if len(w) in R, gather w as a data point and set w = [c_{k+1}];
  iii. if len(w) > sup R, remove chapters from c_j onward until i or ii holds;
(3) until the book has no chapters left. The rules are also applied when the window's last chapter is the book's
last one (a final window inside R is gathered; one below R is discarded). ``len(w)`` is the sum of the chapters'
token counts (the paper tokenizes chapters); each gathered window's context (the chapters joined by a newline)
is re-tokenized, and the rare window whose exact count falls outside R by a few boundary tokens is skipped and
counted. Windows never overlap.

Balancing (Sec 3.2, after the candidate sets): books with fewer samples are preferred and, within a book,
lengths closer to T: samples are drawn one at a time from the book with the fewest samples drawn so far (ties:
the book with fewer candidates, then input order), taking that book's remaining candidate closest to T.

Scaled-down targets (``--subset-tokens N``, e.g. 2048 for a tiny model) keep the relative range of a preset
(``ropescale.common.subsets.scaled``). When T is below the size of a chapter, ``--unit paragraph`` slides the same
window over paragraphs instead of chapters; the summary is then the merged headings of the chapters the window
touches.

Each output record is ``{id, context, summary, book, chapters, tokens, subset}``; ``subset`` names the subset
(``L``, ``XL``, ``2XL``, ``3XL``, or ``T<N>`` for ``--subset-tokens N``, e.g. ``T2048``), the name eval_summ uses for
it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from typing import Sequence

from ropescale.common import subsets
from ropescale.common.chapters import Chapter, add_on_bad, by_book, read_chapters
from ropescale.common.cli import add_command, add_json, add_overwrite
from ropescale.common.io import InputError, claim_output_file, write_jsonl_atomic

from .cuts import count_tokens, merged_title, paragraph_token_counts

UNITS = ("chapter", "paragraph")


def sliding_windows(lengths: Sequence[int], lo: int, hi: int) -> list[tuple[int, int]]:
    """Windows (j, k) (inclusive unit indices) gathered by rules i-iii of CNNSum Sec 3.2 for range [lo, hi]."""
    out: list[tuple[int, int]] = []
    j, total = 0, 0
    for k, n in enumerate(lengths):
        total += n  # rule i: expand with c_k
        while total > hi:  # rule iii: remove chapters from c_j onward
            total -= lengths[j]
            j += 1
        if lo <= total <= hi:  # rule ii: gather, restart from c_{k+1}
            out.append((j, k))
            j, total = k + 1, 0
    return out


@dataclass
class Unit:
    """A chapter, or a paragraph of one (``--unit paragraph``), with its token count."""

    chapter: Chapter
    text: str
    tokens: int
    para: int | None = None


def units_of(chs: Sequence[Chapter], tok, unit: str, on_batch=None) -> list[Unit]:
    """The book as units: its chapters, or its non-empty paragraphs, with token counts (``on_batch(n)``: n more
    chapters counted)."""
    if unit not in UNITS:
        raise InputError(f"unknown --unit {unit!r} (choose from {', '.join(UNITS)})")
    counts = paragraph_token_counts(tok, [c.text for c in chs], on_batch=on_batch)
    if unit == "chapter":
        return [Unit(c, c.text, sum(n)) for c, n in zip(chs, counts)]
    out = []
    for c, ns in zip(chs, counts):
        for m, (text, n) in enumerate(zip(c.text.split("\n"), ns)):
            if text.strip():
                out.append(Unit(c, text, n, m))
    return out


def candidates(book_units: Sequence[Unit], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(j, k, summed length) of every window the rules gather in one book."""
    lens = [u.tokens for u in book_units]
    return [(j, k, sum(lens[j:k + 1])) for j, k in sliding_windows(lens, lo, hi)]


def balance(cands: dict[str, list], target: int, max_samples: int | None = None, per_book: int | None = None,
            accept=None) -> list[tuple[str, object]]:
    """Draw samples book by book (fewest drawn first, ties: fewer candidates), each book's closest to ``target``
    first. ``cands[book]`` = [(j, k, length), ...]; ``accept(book, cand)`` may reject one (it is then skipped)."""
    order = list(cands)
    remaining = {b: sorted(c, key=lambda x: (abs(x[2] - target), x[0])) for b, c in cands.items()}
    drawn = {b: 0 for b in cands}
    out = []
    while max_samples is None or len(out) < max_samples:
        live = [b for b in order if remaining[b] and (per_book is None or drawn[b] < per_book)]
        if not live:
            break
        b = min(live, key=lambda x: (drawn[x], len(cands[x]), order.index(x)))
        c = remaining[b].pop(0)
        if accept is not None and not accept(b, c):
            continue
        drawn[b] += 1
        out.append((b, c))
    return out


def _record(name: str, book: str, us: Sequence[Unit], tokens: int, unit: str) -> dict:
    chs: list[Chapter] = []
    for u in us:
        if not chs or chs[-1] is not u.chapter:
            chs.append(u.chapter)
    if unit == "chapter":
        span = f"{chs[0].chapter}-{chs[-1].chapter}"
    else:
        span = f"{us[0].chapter.chapter}.{us[0].para}-{us[-1].chapter.chapter}.{us[-1].para}"
    return {"id": f"{name}-{book}-{span}", "context": "\n".join(u.text for u in us), "summary": merged_title(chs),
            "book": book, "chapters": [c.chapter for c in chs], "tokens": tokens, "subset": name}


def sample(chapters: Sequence[Chapter], tok, subset: subsets.Subset, *, unit: str = "chapter",
           max_samples: int | None = None, per_book: int | None = None, progress: bool = False
           ) -> tuple[list[dict], dict]:
    """CNNSum-format samples {id, context, summary, book, chapters, tokens, subset} for one subset range (see module
    doc); ``subset`` is the subset's name (L, XL, 2XL, 3XL, or T<target> for a scaled-down one, as eval_summ
    names it), so the subset travels with the data."""
    from tqdm import tqdm

    lo, hi = subset.range
    with tqdm(total=len(chapters), desc="tokenizing chapters", unit="ch", disable=not progress, file=sys.stderr,
              leave=False) as bar:
        units = {b: units_of(chs, tok, unit, on_batch=bar.update) for b, chs in by_book(chapters).items()}
    cands = {b: candidates(us, lo, hi) for b, us in units.items()}
    rep = {"subset": subset.name, "target": subset.target, "range": [lo, hi], "unit": unit,
           "candidates": {b: len(c) for b, c in cands.items()}, "edge_out_of_range": 0}
    records: list[dict] = []

    def accept(book, cand):
        j, k, _ = cand
        us = units[book][j:k + 1]
        ctx = "\n".join(u.text for u in us)
        n = count_tokens(tok, [ctx])[0]
        if not lo <= n <= hi:
            rep["edge_out_of_range"] += 1
            return False
        records.append(_record(subset.name, book, us, n, unit))
        return True

    balance(cands, subset.target, max_samples, per_book, accept)
    book_order = list(units)
    records.sort(key=lambda r: (book_order.index(r["book"]), r["chapters"][0], r["id"]))
    rep["samples"] = len(records)
    rep["per_book"] = {b: sum(r["book"] == b for r in records) for b in book_order}
    rep["length"] = length_stats([r["tokens"] for r in records])
    return records, rep


def length_stats(lengths: Sequence[int]) -> dict:
    """Min / Q1 / mean / max, the columns of CNNSum's Table 1. Q1 is the first quartile by linear interpolation
    between order statistics (Hyndman & Fan type 7, numpy's default ``linear``; ``statistics`` method
    ``inclusive``), so it always lies between min and max."""
    if not lengths:
        return {"min": 0, "q1": 0, "mean": 0, "max": 0}
    q1 = statistics.quantiles(lengths, n=4, method="inclusive")[0] if len(lengths) > 1 else lengths[0]
    return {"min": min(lengths), "q1": round(q1, 1), "mean": round(sum(lengths) / len(lengths), 1),
            "max": max(lengths)}


def register(sub) -> None:
    p = add_command(sub, "sample", help="CNNSum multi-scale sliding-window sampler (Sec 3.2)", description=__doc__)
    p.add_argument("--chapters", required=True, metavar="FILE", help="chapters JSONL {book, chapter, title, text}")
    p.add_argument("--tokenizer", default="tiny", help="tokenizer directory, or 'tiny' (default: tiny)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--subset", help="L (16K [-4K]), XL (32K [-6K]), 2XL (64K [-10K]), 3XL (128K [-16K]), or T<N> "
                                    "(a scaled-down target of N tokens, range as in --like)")
    g.add_argument("--subset-tokens", type=_tokens, metavar="N",
                   help="a scaled-down subset of N tokens (16k style accepted; the same as --subset T<N>)")
    p.add_argument("--like", default="L", help="preset whose relative range a scaled-down target uses (default: L)")
    p.add_argument("--unit", choices=UNITS, default="chapter",
                   help="what the window slides over: chapters (the paper) or paragraphs (targets below a chapter) "
                        "(default: chapter)")
    p.add_argument("--books", help="comma-separated book names; default: all")
    p.add_argument("--max-samples", type=int, metavar="N", help="at most this many samples (balanced across books)")
    p.add_argument("--per-book", type=int, metavar="N", help="at most this many samples per book")
    add_on_bad(p)
    p.add_argument("--out", required=True, metavar="FILE",
                   help="output CNNSum-format JSONL, each record naming its 'subset' (written atomically)")
    add_json(p, "the report")
    add_overwrite(p)
    p.set_defaults(func=cmd_sample)


def _tokens(v: str) -> int:
    """A token count: 2048 or 2k (x 1024)."""
    s = str(v).strip().lower()
    try:
        return int(float(s[:-1]) * 1024) if s.endswith("k") else int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a token count (e.g. 2048 or 2k), got {v!r}") from None


def cmd_sample(args) -> int:
    from .tokenizer import load_tokenizer

    claim_output_file(args.out, overwrite=args.overwrite)
    if args.subset and subsets.scaled_tokens(args.subset) is not None:
        args.subset_tokens, args.subset = subsets.scaled_tokens(args.subset), None
    if args.subset:
        sub = subsets.get(args.subset)
    else:
        if args.subset_tokens <= 0:
            raise InputError(f"--subset-tokens must be positive, got {args.subset_tokens}")
        sub = subsets.scaled(args.subset_tokens, args.like)
    for k in ("max_samples", "per_book"):
        v = getattr(args, k)
        if v is not None and v <= 0:
            raise InputError(f"--{k.replace('_', '-')} must be positive, got {v}")
    bad = []
    chs = read_chapters(args.chapters, on_bad=args.on_bad, on_skip=bad.append, books=args.books)
    tok = load_tokenizer(args.tokenizer)
    records, rep = sample(chs, tok, sub, unit=args.unit, max_samples=args.max_samples, per_book=args.per_book,
                          progress=sys.stderr.isatty())
    rep["skipped_bad_lines"] = len(bad)
    if not records:  # an empty eval set is no result: nothing is written
        lo, hi = rep["range"]
        hint = ("; for targets below a chapter's length use --unit paragraph" if args.unit == "chapter" else
                "; a larger --subset-tokens, or other --books")
        raise InputError(f"no window of {args.unit}s fits the range [{lo}, {hi}] tokens of subset {rep['subset']} "
                         f"(nothing written){hint}", args.chapters)
    write_jsonl_atomic(args.out, records)
    if args.json:
        print(json.dumps(rep, ensure_ascii=False))
    else:
        lo, hi = rep["range"]
        L = rep["length"]
        print(f"subset {rep['subset']}: target {rep['target']}, range [{lo}, {hi}], unit {rep['unit']}")
        print(f"candidates per book: {json.dumps(rep['candidates'], ensure_ascii=False)}")
        print(f"samples: {rep['samples']}  per book: {json.dumps(rep['per_book'], ensure_ascii=False)}")
        print(f"tokens min / Q1 / mean / max: {L['min']} / {L['q1']} / {L['mean']} / {L['max']}   "
              f"skipped at the range edge: {rep['edge_out_of_range']}   bad lines skipped: {len(bad)}")
        print(f"wrote {args.out}")
    return 0

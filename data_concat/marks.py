"""``python -m data_concat unique-marks``: a copy of a packed set in which each pair of a sample writes its marks in
brackets of its own (the control for the marks confound of packed short pairs, docs/positions.md).

The recall task marks four sentences of a context 【1】-【4】 and asks for them back. Packed several a sample under
causal attention, a later pair sees the earlier pairs' 【1】-【4】 too, so what it learns to copy is confounded with
the marks it has seen. Here pair k of every sample (k = 0, 1, ...) has each 【 and 】 token of its span, in its
context, its prompt and its answer, replaced by the k-th bracket pair of :data:`STYLES`: the first pair keeps 【n】,
the next writes [n], then <n>, #n#, ^n^, |n|, *n*, (n) (a style repeats only past 8 pairs: the ninth is 【】
again). Each bracket is one token of the
tokenizer (checked), so the lengths, the pair starts, the positions and which tokens are labelled are the source
set's; a labelled bracket's label is its new token.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ropescale.common.cli import add_command, add_json, add_out, add_overwrite, print_result
from ropescale.common.io import InputError, claim_output_dir

MARK = ("【", "】")
STYLES = (MARK, ("[", "]"), ("<", ">"), ("#", "#"), ("^", "^"), ("|", "|"), ("*", "*"), ("(", ")"))
NOTE = "each pair of a sample in its own brackets"


def style_ids(tokenizer) -> list[tuple[int, int]]:
    """The token ids of each bracket pair of :data:`STYLES`; InputError naming a bracket that is not one token."""
    out = []
    for o, c in STYLES:
        ids = [tokenizer(x, add_special_tokens=False)["input_ids"] for x in (o, c)]
        if any(len(i) != 1 for i in ids):
            raise InputError(f"the bracket pair {o}{c} is not one token each in this tokenizer (ids {ids}): the "
                             "rewrite would change lengths")
        out.append((ids[0][0], ids[1][0]))
    return out


def rewrite_row(ids: list[int], labels: list[int], starts: list[int], styles: list[tuple[int, int]]) -> int:
    """Pair k of one sample (``starts``: where each pair begins) gets ``styles[k % len(styles)]`` for every token
    equal to ``styles[0]``'s opening or closing bracket, in ``ids`` and, where labelled, ``labels`` (in place);
    returns the brackets changed."""
    (o0, c0), changed = styles[0], 0
    ends = list(starts[1:]) + [len(ids)]
    for k, (a, b) in enumerate(zip(starts, ends)):
        o, c = styles[k % len(styles)]
        if (o, c) == (o0, c0):
            continue
        for j in range(a, b):
            new = o if ids[j] == o0 else c if ids[j] == c0 else None
            if new is None:
                continue
            if labels[j] == ids[j]:
                labels[j] = new
            ids[j] = new
            changed += 1
    return changed


def unique_marks(src: str | os.PathLike, dst: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> dict:
    """Write the unique-marks copy of packed set ``src`` to ``dst`` (atomically; ``tokenizer``: default the one
    the set's meta.json names); returns the counts: samples, pairs, brackets replaced, samples whose styles repeat
    (more than 8 pairs). InputError for a set without pair boundaries or a bracket that is not one token."""
    from .packed import load_meta, read_packed, write_packed
    from .tokenizer import load_tokenizer

    meta = load_meta(src)
    tok_name = tokenizer or meta.get("tokenizer")
    if not tok_name:
        raise InputError("meta.json names no tokenizer: give --tokenizer", Path(src) / "meta.json")
    styles = style_ids(load_tokenizer(tok_name))
    rows = read_packed(src).rows()
    if any(not r.get("pair_starts") for r in rows):
        raise InputError("a sample without pair boundaries (pair_starts; written by python -m data_concat pack)", src)
    replaced = repeats = pairs = 0
    for r in rows:
        pairs += len(r["pair_starts"])
        repeats += len(r["pair_starts"]) > len(styles)
        replaced += rewrite_row(r["input_ids"], r["labels"], r["pair_starts"], styles)
    cols = {"input_ids": [x for r in rows for x in r["input_ids"]], "labels": [x for r in rows for x in r["labels"]],
            "pair_starts": [r["pair_starts"] for r in rows], "pair_ids": [r["pair_ids"] for r in rows],
            "length": [r["length"] for r in rows]}
    counts = {"samples": len(rows), "pairs": pairs, "brackets_replaced": replaced, "samples_with_repeats": repeats}
    stats_file = Path(src) / "stats.json"
    stats = json.loads(stats_file.read_text(encoding="utf-8")) if stats_file.is_file() else {}
    write_packed(dst, cols, {**meta, "marks": NOTE, "marks_source": str(src)}, {**stats, "unique_marks": counts})
    return counts


def register(sub) -> None:
    p = add_command(sub, "unique-marks", help="a packed set with each pair's marks in brackets of its own",
                    description=__doc__)
    p.add_argument("--data", required=True, metavar="DIR", help="the packed set to rewrite (python -m data_concat "
                                                                 "pack, several pairs a sample)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory, or 'tiny' (default: the one the set's "
                                                     "meta.json names)")
    add_out(p, "the packed set directory to write")
    add_json(p, "the counts")
    add_overwrite(p)
    p.set_defaults(func=cmd_unique_marks)


def cmd_unique_marks(args: argparse.Namespace) -> int:
    claim_output_dir(args.out, overwrite=args.overwrite)
    counts = unique_marks(args.data, args.out, args.tokenizer)
    return print_result(counts, args.json, f"{args.out}: {counts['samples']} samples, {counts['pairs']} pairs, "
                                           f"{counts['brackets_replaced']} brackets rewritten"
                                           + (f" ({counts['samples_with_repeats']} samples with more than "
                                              f"{len(STYLES)} pairs repeat a style)"
                                              if counts["samples_with_repeats"] else ""))

"""``python -m data_concat text``: plain text (e.g. a novel, ``../shared/data/english/austen/*.txt``) as a packed set of
language-modelling windows -- the fine-tuning data for a real English model (``finetune.py --data OUT``).

Each sample is one window of ``--length`` consecutive tokens of one file (no prompt, loss on every token), the
windows of a file taken end to end from its start, files in the order given; ``--n`` keeps that many, spread over
the files in turn. The set has the packed format (``data_concat.packed``: one pair a sample, so every positions
policy reads it) and records the files and their sha256 in meta.json.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from ropescale.common.cli import add_command, add_json, add_out, add_overwrite, print_result
from ropescale.common.io import InputError, claim_output_dir, sha256_file

from .packed import FORMAT, FORMAT_VERSION, compute_stats, write_packed


def windows(ids: list[int], length: int) -> list[list[int]]:
    """The consecutive ``length``-token windows of ``ids`` from its start (the remainder dropped)."""
    return [ids[a:a + length] for a in range(0, len(ids) - length + 1, length)]


def pack_text(files, tokenizer_dir: str | os.PathLike, out: str | os.PathLike, *, length: int,
              n: int | None = None) -> dict:
    """Write the packed set of ``length``-token windows of the text ``files`` (at most ``n``, taken from the
    files in turn) to ``out`` (atomically); returns its stats."""
    from .tokenizer import load_tokenizer

    if length < 2:
        raise InputError(f"--length must be >= 2, got {length}")
    files = [Path(f) for f in files]
    tok = load_tokenizer(tokenizer_dir)
    per_file = []
    for f in files:
        if not f.is_file():
            raise InputError("no such text file", f)
        ids = list(tok(f.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"])
        per_file.append([(f"{f.stem}:{i}", w) for i, w in enumerate(windows(ids, length))])
    longest = max(map(len, per_file))  # the files in turn, then what the longer ones have left
    chosen = [g[i] for i in range(longest) for g in per_file if i < len(g)]
    chosen = chosen[:n] if n else chosen
    if not chosen:
        raise InputError(f"no window of {length} tokens in the files given", files[0])
    flat = np.array([t for _, w in chosen for t in w], dtype=np.int32)
    cols = {"input_ids": flat, "labels": flat.copy(), "pair_starts": [[0] for _ in chosen],
            "pair_ids": [[wid] for wid, _ in chosen], "length": np.full(len(chosen), length, dtype=np.int32)}
    stats = compute_stats([length] * len(chosen), [length] * len(chosen), [1] * len(chosen), length, length)
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "tokenizer": str(tokenizer_dir),
            "eos_token_id": int(tok.eos_token_id), "target": f"text-{length}", "min": length, "max": length,
            "prompt": "none (plain text)", "files": [str(f) for f in files],
            "files_sha256": [sha256_file(f) for f in files], "counts": {"samples": len(chosen)},
            "ignore_index": -100}
    write_packed(out, cols, meta, stats)
    return stats


def register(sub) -> None:
    p = add_command(sub, "text", help="plain text files as a packed set of language-modelling windows",
                    description=__doc__)
    p.add_argument("files", nargs="+", help="UTF-8 text files")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory (a model directory)")
    p.add_argument("--length", type=int, required=True, help="tokens a sample (window)")
    p.add_argument("--n", type=int, help="at most this many samples (default: every window)")
    add_out(p, "the packed set directory to write")
    add_json(p, "the set's stats")
    add_overwrite(p)
    p.set_defaults(func=cmd_text)


def cmd_text(args: argparse.Namespace) -> int:
    claim_output_dir(args.out, overwrite=args.overwrite)
    stats = pack_text(args.files, args.tokenizer, args.out, length=args.length, n=args.n)
    return print_result(stats, args.json, f"{args.out}: {stats['samples']} samples of {args.length} tokens")

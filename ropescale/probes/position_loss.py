"""position-loss: the next-token loss at every position of held-out windows, averaged per bucket of positions: where
a rope's loss leaves its in-window level (docs/demo.md, "The bound, tested"; experiments/bound.yaml).

``--n`` windows of ``--window`` tokens are drawn from the documents (default: with ``--model tiny``, the chapters its
build held out; ``--heldout-of tiny`` for a model fine-tuned from it; a real model: ``--data`` a documents file or a
directory of ``.txt`` files), the factor search's seeded draw. Position p's loss is -log P(token p | tokens < p)
(nats; position 0 is never predicted); bucket k averages the positions k*B <= p < (k+1)*B (``--bucket`` B; bucket 0
has B - 1). One forward a window serves every bucket for a rope whose frequencies do not depend on the length; a rope
that follows the length (dynamic NTK, dynamic YaRN, LongRoPE's factor switch: ``formulas.Method.by_length``) reads
each bucket from a forward over the window's first (k+1)*B tokens, what a model reading that many tokens computes.

items.jsonl holds one record a window and bucket (``window``, ``bucket``: the bucket's first position, ``loss``,
``tokens``): the score file an experiment reads (``score: {file: items.jsonl, id: window, length: bucket, field:
loss, unit: window}``); summary.json the mean a bucket.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ropescale.common.io import InputError
from ropescale.common.settings import setting

from .common import POSITIVE, ProbeRun, ProbeSettings, probe_settings, progress
from .data import Doc, data_name, load_docs, tiny_heldout_file


@dataclass(frozen=True)
class PositionLossSettings(ProbeSettings):
    window: int | None = setting(None, "tokens a window (default: 6x the original context)", check=POSITIVE,
                                 metavar="N")
    bucket: int | None = setting(None, "positions a bucket (default: a quarter of the original context)",
                                 check=POSITIVE, metavar="B")
    tail_chapters: int = setting(0, "chapters data: keep only each book's last N chapters",
                                 check=(lambda v: v >= 0, "not be negative"))
    heldout_of: str | None = setting(None, "read the chapters this tiny build held out (e.g. tiny, for a model "
                                           "fine-tuned from it); over --data", metavar="MODEL")


def load_corpus(s: PositionLossSettings) -> list[Doc]:
    """``--data``: a documents or chapters file (``probes.data.load_docs``), or a directory whose ``*.txt`` files
    are one document each (sorted by name); ``--heldout-of MODEL``: the chapters that tiny build held out."""
    if s.heldout_of:
        held = tiny_heldout_file(s.heldout_of)
        if held is None:
            raise InputError(f"--heldout-of {s.heldout_of}: not a tiny build (no tiny.json naming held-out chapters)")
        return load_docs(held, s.tail_chapters)
    p = Path(s.data)
    if not p.is_dir():
        return load_docs(p, s.tail_chapters)
    docs = [d for f in sorted(p.glob("*.txt")) for d in load_docs(f)]
    if not docs:
        raise InputError("a text corpus directory holds *.txt files; none here", p)
    return docs


def buckets(n: int, width: int) -> list[tuple[int, int]]:
    """(first, end) of each bucket over the predicted positions 1..n-1: [k w, (k+1) w) clipped to [1, n)."""
    return [(max(1, a), min(a + width, n)) for a in range(0, n, width) if max(1, a) < min(a + width, n)]


def bucket_losses(model, ids: list[int], width: int, by_length: bool) -> list[tuple[int, float, int]]:
    """(bucket start, mean loss over its positions, positions) of one window: one forward
    (``passkey.forward_read``), or with ``by_length`` a forward over ids[:end] for each bucket, shortest first."""
    from .passkey import forward_read

    full = None if by_length else forward_read(model, ids)[0]
    if by_length:  # transformers' dynamic rope only grows its cached length past the original one; a 1-token
        forward_read(model, ids[:1])  # forward resets it, so each prefix below is read as a fresh model reads it
    out = []
    for first, end in buckets(len(ids), width):
        nll = full if full is not None else forward_read(model, ids[:end])[0]
        out.append((first - first % width, float(nll[first:end].mean()), end - first))
    return out


def position_loss_probe(loaded, docs, settings: PositionLossSettings | None = None, **fields) -> dict:
    """Run the position-loss probe into ``settings.out``; returns the summary (cells: mean loss a bucket)."""
    from rope_scaling import RopeSpec
    from rope_scaling.formulas import REGISTRY

    from .rope_search import draw_windows

    s = probe_settings(PositionLossSettings, settings, fields)
    window = s.window or 6 * loaded.orig_ctx
    width = s.bucket or max(1, loaded.orig_ctx // 4)
    if window < 2:
        raise InputError(f"--window {window}: a window needs at least 2 tokens")
    s = dataclasses.replace(s, window=window, bucket=width, data=data_name(docs) or s.data)
    starts = [a - a % width for a, _ in buckets(window, width)]
    run = ProbeRun("position-loss", loaded, s, starts, metric="next-token loss (nats), mean over a bucket",
                   column=f"bucket of {width} positions (its first)", cell_kind="mean")
    wins = draw_windows(loaded.tokenizer, docs, s.n, window, window - 1, s.seed)
    by_length = REGISTRY[RopeSpec.from_record(loaded.rope).method].by_length
    for i, w in enumerate(progress(wins, "position-loss")):
        if run.done(f"w{i}:b{starts[-1]}"):
            continue
        for start, loss, n in bucket_losses(loaded.model, w.prefix + w.target, width, by_length):
            run.add({"id": f"w{i}:b{start}", "group": "", "col": start, "value": loss, "window": f"w{i}",
                     "bucket": start, "loss": loss, "tokens": n, "doc": w.doc, "start": w.start})
    return run.finish({"window": window, "bucket": width, "by_length": by_length})


def register(sub) -> None:
    from .command import register_probe

    register_probe(sub, "position-loss", PositionLossSettings, run=position_loss_probe, load=load_corpus,
                   description=__doc__,
                   help="next-token loss by position over held-out windows, per bucket (one forward a window)")

"""ppl: loss on a fixed target span as the prefix grows (Sun et al. 2021, "Do Long-Range Language Models Actually
Use Long-Range Context?", Sec 2.2 and 3).

Sun et al. evaluate only the k target tokens at the end of an N-token input, so every target token has about the
same context, and grow N ("we set the number of target tokens per context k = 10", Sec 2.2). Here: for each item a
target span of ``--target-len`` tokens (default k = 10) is fixed in a document;
for each length N in ``--lengths`` (total input tokens, default 1x..8x the original context) the input is the
N - k tokens before the target followed by the target, and the cell is the mean NLL (nats/token) of the target
tokens. The same targets are used at every length, so the columns differ only in how much prefix the model sees.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ropescale.common.io import InputError
from ropescale.common.settings import setting

from .command import register_probe
from .common import POSITIVE, ProbeRun, ProbeSettings, default_lengths, probe_settings, progress
from .data import data_name
from .scorer import check_batch, score_continuations
from .targets import DEFAULT_TARGET_LEN, sample_targets, tokenize_docs


@dataclass(frozen=True)
class PplSettings(ProbeSettings):
    lengths: list[int] | None = setting(None, "total input lengths N (prefix + target), comma-separated; default: "
                                              "1x..8x the original context", check=POSITIVE, metavar="N,N,...")
    target_len: int = setting(DEFAULT_TARGET_LEN, "target span tokens k (Sun et al. 2021 Sec 2.2)", check=POSITIVE)
    tail_chapters: int = setting(0, "chapters data: keep only each book's last N chapters (e.g. text held out from "
                                    "training)", check=(lambda v: v >= 0, "not be negative"))


def ppl_probe(loaded, docs, settings: PplSettings | None = None, **fields) -> dict:
    """Run the ppl probe into run dir ``settings.out`` (or give the settings as keywords); returns the summary
    (cells: mean target loss per length)."""
    s = probe_settings(PplSettings, settings, fields)
    lengths = s.lengths or default_lengths(loaded.orig_ctx)
    n, target_len, seed, batch_size = s.n, s.target_len, s.seed, s.batch_size
    if any(L <= target_len for L in lengths):
        raise InputError(f"every length must exceed --target-len {target_len}: {lengths}")
    rows = min(batch_size, n * len(lengths))  # before any text is tokenized: the longest forward fits memory
    check_batch(loaded.model, [max(lengths)] * rows, target_len, what=f"--lengths {max(lengths)}")
    s = dataclasses.replace(s, lengths=lengths, data=data_name(docs) or s.data)
    run = ProbeRun("ppl", loaded, s, lengths, metric="loss (nats/token) on the target span",
                   column="input length N (prefix + target)", cell_kind="mean")
    doc_ids = tokenize_docs(loaded.tokenizer, docs)
    targets = sample_targets(doc_ids, docs, n, max(lengths) - target_len, target_len, seed)
    todo = []
    for t in targets:
        ids = doc_ids[t.doc]
        for L in lengths:
            rid = f"{t.key}:N{L}"
            if not run.done(rid):
                todo.append((rid, t, L, ids[t.start - (L - target_len):t.start], ids[t.start:t.start + target_len]))
    todo.sort(key=lambda c: c[2])  # equal lengths in a batch: no padding
    for i in progress(range(0, len(todo), batch_size), "ppl", total=(len(todo) + batch_size - 1) // batch_size):
        chunk = todo[i:i + batch_size]
        scores = score_continuations(loaded.model, [c[3] for c in chunk], [c[4] for c in chunk],
                                     batch_size=batch_size, pad_id=loaded.pad_id)
        for (rid, t, L, _, _), sc in zip(chunk, scores):
            run.add({"id": rid, "group": "", "col": L, "value": sc.loss, "doc": docs[t.doc].id,
                     "target_start": t.start, "prefix_len": L - target_len, "target_len": target_len,
                     "logprob": sc.logprob})
    return run.finish()


def register(sub) -> None:
    register_probe(sub, "ppl", PplSettings, description=__doc__,
                   help="loss on a fixed target span vs prefix length (Sun et al. 2021 Sec 3)", run=ppl_probe)

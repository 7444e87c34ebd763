"""Target spans in documents, shared by the probes that score a fixed span after a prefix (ppl, copy, perturb) and
by the factor search's held-out windows: the spans are drawn once per item, so every length reads the same targets."""
from __future__ import annotations

from dataclasses import dataclass

from ropescale.common.io import InputError

from .common import encode, progress, rng_for

# Sun et al. 2021 Sec 2.2: "we set the number of target tokens per context k = 10" (token-level experiments, Sec 3-4)
DEFAULT_TARGET_LEN = 10


@dataclass
class Target:
    """A fixed target span: ``doc`` index, ``start`` token offset, ``k`` tokens; ``key`` names it in item ids."""

    doc: int
    start: int
    k: int
    key: str


def tokenize_docs(tokenizer, docs) -> list[list[int]]:
    return [encode(tokenizer, d.text) for d in docs]


def sample_targets(doc_ids: list[list[int]], docs, n: int, need_before: int, k: int, seed: int) -> list[Target]:
    """``n`` target spans of ``k`` tokens, each with at least ``need_before`` tokens before it in its document.
    Documents are taken round-robin (in file order, among those long enough); the offset is drawn from a seeded
    RNG per item. Raises InputError when no document is long enough."""
    ok = [i for i, ids in enumerate(doc_ids) if len(ids) >= need_before + k]
    if not ok:
        longest = max(len(x) for x in doc_ids)
        raise InputError(f"no document is long enough: need {need_before + k} tokens, longest has {longest}",
                         docs[0].where.rsplit(":", 1)[0] if docs else None)
    out = []
    for j in range(n):
        d = ok[j % len(ok)]
        rng = rng_for(seed, "target", j, docs[d].id)
        start = rng.randint(need_before, len(doc_ids[d]) - k)
        out.append(Target(d, start, k, f"{docs[d].id}@{start}"))
    return out


def target_spans(loaded, docs, *, n: int, n_prefix: int, target_len: int, seed: int, desc: str):
    """(token ids of every document, an iterator of (target, prefix ids, target ids)) for ``n`` target spans of
    ``target_len`` tokens with ``n_prefix`` tokens before each (InputError at once when no document is long
    enough): what copy and perturb score."""
    doc_ids = tokenize_docs(loaded.tokenizer, docs)
    targets = sample_targets(doc_ids, docs, n, n_prefix, target_len, seed)

    def spans():
        for t in progress(targets, desc):
            ids = doc_ids[t.doc]
            yield t, ids[t.start - n_prefix:t.start], ids[t.start:t.start + target_len]

    return doc_ids, spans()

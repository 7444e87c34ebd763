"""shuffle: the zero-shot k-Block Shuffle Test (Laban, Dai, Bandarkar & Hearst 2021, Sec 3-4).

A document is split into sentences (Chinese sentences end at 。！？ plus any closing quotes ”」』); sentences are
grouped in contiguous blocks of k (k = ``--blocks``, default 1..5; the last block may be shorter), and the blocks
are shuffled, keeping the sentence order inside each block (a permutation other than the identity). The model is
right when the original document gets a higher log-likelihood than the shuffled one (a tie counts as wrong).
Documents longer than the model's context (``--window``, default: the context its scaled config is meant for) are
scored with successive windows overlapping by 50%, the window log-likelihoods averaged (Sec 3.1).

Both versions are tokenized sentence by sentence, so they hold exactly the same tokens and only the order differs.
Documents: each chapter of a chapters JSONL (its body), or each document of a documents JSONL. Without
``--lengths`` documents are truncated at ``--max-sentences`` (default 20, as in Sec 3.2) and the column is ``all``;
with ``--lengths`` each document is cut to the longest run of whole leading sentences that fits in L tokens (and
must be at least L/2 tokens), so the columns show how the test fares as documents outgrow the original context.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ropescale.common.io import InputError
from ropescale.common.settings import setting
from ropescale.common.text import split_sentences

from .command import register_probe
from .common import POSITIVE, ProbeRun, ProbeSettings, data_setting, probe_settings, progress, rng_for
from .data import Doc, is_chapters_file, load_books, load_docs
from .scorer import check_batch, score_document


@dataclass(frozen=True)
class ShuffleSettings(ProbeSettings):
    data: str = data_setting("chapters JSONL (each chapter body is a document) or documents JSONL ({text}/{context})")
    lengths: list[int] | None = setting(None, "document length budgets in tokens, comma-separated; default: none, "
                                              "documents cut at --max-sentences", check=POSITIVE, metavar="N,N,...")
    blocks: list[int] = setting([1, 2, 3, 4, 5], "block sizes k, comma-separated", check=(lambda k: k >= 1, ">= 1"),
                                metavar="K,K,...")
    max_sentences: int | None = setting(None, "truncate documents at this many sentences; default: 20 without "
                                              "--lengths, else no cap (0)", check=(lambda v: v >= 0, "not be negative"))
    window: int = setting(0, "scoring window in tokens (0: the model's (scaled) context); windows overlap by half",
                          check=(lambda v: v >= 0, "not be negative"))


def block_shuffle(items: list, k: int, rng) -> list:
    """Group ``items`` in contiguous blocks of ``k`` and return them with the blocks permuted (never the identity
    permutation) and the order inside each block kept (Laban et al. 2021 Sec 4). Needs at least two blocks."""
    if k < 1:
        raise ValueError("block size must be >= 1")
    blocks = [items[i:i + k] for i in range(0, len(items), k)]
    if len(blocks) < 2:
        raise ValueError(f"{len(items)} sentences make fewer than two blocks of {k}")
    order = list(range(len(blocks)))
    perm = order[:]
    while perm == order:
        rng.shuffle(perm)
    return [x for b in perm for x in blocks[b]]


def shuffle_docs(data: str) -> list[Doc]:
    """The test's documents: chapter bodies of a chapters JSONL, or the documents of a documents JSONL."""
    if is_chapters_file(data):
        return [Doc(f"{c.book}:{c.chapter}", c.book, c.text, c.where)
                for chs in load_books(data).values() for c in chs]
    return load_docs(data)


def truncate(sent_ids: list[list[int]], max_sentences: int, max_tokens: int) -> int:
    """How many leading sentences to keep: at most ``max_sentences`` (0 = no cap) and ``max_tokens`` (0 = no cap)."""
    n, tot = 0, 0
    for ids in sent_ids:
        if max_sentences and n >= max_sentences:
            break
        if max_tokens and tot + len(ids) > max_tokens:
            break
        n += 1
        tot += len(ids)
    return n


def shuffle_probe(loaded, docs: list[Doc], settings: ShuffleSettings | None = None, **fields) -> dict:
    """Run the k-block shuffle test into run dir ``settings.out`` (or give the settings as keywords); cells:
    accuracy per block size (group) x length."""
    s = probe_settings(ShuffleSettings, settings, fields)
    blocks, lengths, n, seed, batch_size = s.blocks, s.lengths, s.n, s.seed, s.batch_size
    data = (docs[0].where.rsplit(":", 1)[0] if docs else "") or s.data
    max_sentences = s.max_sentences if s.max_sentences is not None else (0 if lengths else 20)
    window = s.window or loaded.default_length
    if not blocks:
        raise InputError("--blocks: give at least one block size")
    # every token of a window is scored; documents shorter than the window are padded
    check_batch(loaded.model, [window] * batch_size, window, what=f"--window {window}", padded=True)
    s = dataclasses.replace(s, max_sentences=max_sentences, window=window, data=data)
    run = ProbeRun("shuffle", loaded, s, lengths or [],
                   metric="accuracy (original scores above the block-shuffled version)",
                   column="document length budget (tokens)" if lengths else "block size k", cell_kind="proportion")
    tok = loaded.tokenizer
    cols = lengths or ["all"]
    # choose documents: in a seeded order, those that give >= 2 blocks of the largest k at every length
    order = list(range(len(docs)))
    rng_for(seed, "shuffle-docs").shuffle(order)
    chosen = []
    for di in order:
        if len(chosen) >= n:
            break
        sents = split_sentences(docs[di].text)
        sent_ids = tok(sents, add_special_tokens=False)["input_ids"] if sents else []
        cuts = {}
        for L in cols:
            cap = 0 if L == "all" else L
            m = truncate(sent_ids, max_sentences, cap)
            if m < 2 * max(blocks) or (cap and sum(len(x) for x in sent_ids[:m]) < cap // 2):
                break
            cuts[L] = m
        else:
            chosen.append((di, sent_ids, cuts))
    if len(chosen) < n:
        raise InputError(f"only {len(chosen)} of {n} documents are long enough ({2 * max(blocks)} sentences"
                         + (f", {max(lengths) // 2}+ tokens" if lengths else "") + ")", data or None)
    for di, sent_ids, cuts in progress(chosen, "shuffle"):
        doc = docs[di]
        todo, pairs = [], []
        for k in blocks:
            for L in cols:
                rid = f"{doc.id}:k{k}:{'' if L == 'all' else 'L'}{L}"
                if run.done(rid):
                    continue
                kept = sent_ids[:cuts[L]]
                shuffled = block_shuffle(kept, k, rng_for(seed, "kbst", doc.id, k, L))
                todo.append((rid, k, L, len(kept)))
                pairs += [[t for s in kept for t in s], [t for s in shuffled for t in s]]
        if not todo:
            continue
        lls = score_document(loaded.model, pairs, window, batch_size=batch_size, pad_id=loaded.pad_id)
        for i, (rid, k, L, ns) in enumerate(todo):
            orig, shuf = lls[2 * i], lls[2 * i + 1]
            run.add({"id": rid, "group": f"k={k}", "col": L, "value": float(orig > shuf), "doc": doc.id,
                     "sentences": ns, "tokens": len(pairs[2 * i]), "ll_original": orig, "ll_shuffled": shuf})
    return run.finish()


def register(sub) -> None:
    register_probe(sub, "shuffle", ShuffleSettings, description=__doc__,
                   help="zero-shot k-Block Shuffle Test (Laban et al. 2021 Sec 3-4)",
                   load=lambda s: shuffle_docs(s.data), run=shuffle_probe)

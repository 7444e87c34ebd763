"""suffix-id: suffix identification, accuracy vs the tokens the model reads.

Lengths (``--lengths``, default orig/2, 1x, 2x, 4x, 8x the original context) count every token the model reads at
once: the prefix, the candidate suffix (``--suffix-len``, 128) and, with ``--heading full``, the gold's heading line
between them -- so a column of 512 is inside a 512-token window (a 384-token prefix + a 128-token candidate). The
papers state their lengths as prefix lengths; an item records its ``prefix_tokens``.

``--variant chapter`` (default): ChapterBreak (Sun, Thai & Iyyer 2022, Sec 2). Each example is a triplet
(c, s+, N): c is a prefix (L minus the candidate's tokens, see above) that ends exactly at a chapter break; s+
is the gold suffix, the first 128 tokens of the next chapter; N holds five negatives, the beginnings of *later*
chapters of the same book (sampled with the seed). All negatives are given the same chapter heading/index as the
gold, so memorized chapter numbers cannot help. The model is right when
log P(s+|c) > log P(s-|c) for every negative (all candidates have the same token count, so this is also lowest
perplexity). The prefix is the book as printed (each chapter's heading line ``第N回 <title>``, then its body).

How the heading appears (``--heading``):
- ``index`` (default, the paper's setting): a candidate is its chapter's beginning as printed, heading line
  included, truncated to 128 tokens, with the chapter index replaced by the gold's (``第N回``); each candidate keeps
  its own title couplet (the first words of its chapter), exactly as "Chapter III" + the chapter's text in PG-19.
- ``full``: the gold's whole heading line (index and title) ends the context of every candidate; candidates are the
  first 128 tokens of the chapter bodies. Easier: the title summarizes the gold chapter.
- ``none``: no heading at all; candidates are the first 128 body tokens.

``--variant sentence``: the suffix-identification test of Sun et al. 2021 (Sec 5): the prefix ends at a full stop,
the gold suffix is the next 128 tokens, and the five negatives are random 128-token spans of the same book that
start at a sentence and overlap neither the prefix nor the gold suffix. Works on any documents JSONL.

What is compared (``--score``):
- ``logprob`` (default, both papers' setting): log P(s|c), the candidate's log-likelihood given the prefix.
- ``pmi``: log P(s|c) - log P(s|<doc start>), what the prefix adds to each candidate's likelihood (pointwise mutual
  information; the document-start token is the tokenizer's BOS, else its EOS, which separates documents in
  pretraining). Raw log-likelihoods of different 128-token spans differ by far more than what a prefix adds (on
  the tiny default: a median of 131 nats between the six candidates given only EOS, vs 29 nats the prefix adds to
  the gold and 13 to a negative), which buries the prefix's contribution for a small model; PMI takes each
  candidate's own likelihood out, so what is left is the context effect. An extension, not in the papers: report
  it beside ``logprob``, not instead of it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rope_scaling.formulas import REGISTRY
from ropescale.common.chapters import Chapter, chapter_index
from ropescale.common.io import InputError
from ropescale.common.runs.record import RunMeta
from ropescale.common.settings import setting
from ropescale.common.text import split_sentences
from ropescale.evaluation.report.intake import declare_variant

from .command import register_probe
from .common import POSITIVE, ProbeRun, ProbeSettings, data_setting, encode, probe_settings, progress, rng_for
from .data import is_chapters_file, load_books, load_docs, render_chapter
from .scorer import check_batch, score_candidates

N_NEGATIVES = 5
HEADINGS = ("index", "full", "none")
SCORES = ("logprob", "pmi")


@dataclass(frozen=True)
class SuffixIdSettings(ProbeSettings):
    data: str = data_setting("chapters JSONL {book, chapter, title, text} (variant sentence: any documents JSONL)")
    batch_size: int = setting(6, "sequences per forward pass (the gold and its negatives together)", check=POSITIVE,
                              resume="ignore")
    lengths: list[int] | None = setting(None, "tokens the model reads per item (prefix + candidate suffix, and with "
                                              "--heading full the heading line), comma-separated; default: orig/2, "
                                              "1x, 2x, 4x, 8x the original context", check=POSITIVE,
                                        metavar="N,N,...")
    variant: str = setting("chapter", "chapter: ChapterBreak (the prefix ends at a chapter break); sentence: Sun et "
                                      "al. 2021 Sec 5", choices=("chapter", "sentence"))
    heading: str = setting("index", "how the gold's chapter heading is given to every candidate (see above)",
                           choices=HEADINGS)
    suffix_len: int = setting(128, "candidate suffix tokens", check=POSITIVE)
    score: str = setting("logprob", "what picks the candidate: logprob = log P(s|prefix) (the papers'); pmi = "
                                    "log P(s|prefix) - log P(s|document start) (see above)", choices=SCORES)


@declare_variant("suffix-id")
def variant_label(meta: RunMeta) -> str:
    """What tells apart suffix-id runs beyond the model, its RoPE spec and training: its variant, heading mode and
    score, each named only when it is not the default."""
    st, default = meta.settings, {f.name: f.default for f in dataclasses.fields(SuffixIdSettings)}
    return " ".join(str(st[k]) for k in ("variant", "heading", "score") if st.get(k) and st[k] != default[k])


def default_suffix_lengths(orig_ctx: int, suffix_len: int = 0) -> list[int]:
    """orig/2, orig, 2x, 4x, 8x the original context: the tokens read (prefix + candidate), so the 1x column fits
    the original window; those with room for a prefix beside a ``suffix_len``-token candidate."""
    return [L for L in _default_lengths(orig_ctx) if L > suffix_len]


def _default_lengths(orig_ctx: int) -> list[int]:
    return [orig_ctx // 2, orig_ctx, orig_ctx * 2, orig_ctx * 4, orig_ctx * 8]


def _reuse(loaded) -> bool:
    """Encode the shared prefix once, except under a method whose frequencies depend on the total length
    (``formulas.Method.by_length``: dynamic NTK, dynamic YaRN, LongRoPE: the prefix's keys would be rotated for its
    own length, not the prefix + candidate's)."""
    m = REGISTRY.get((loaded.rope or {}).get("method") or "none")
    return m is None or not m.by_length


# ---------------------------------------------------------------- chapter variant (ChapterBreak)
def chapter_candidate(ch: Chapter, gold: Chapter, heading: str, tokenizer, suffix_len: int) -> list[int]:
    """The tokens of one candidate suffix: chapter ``ch``'s beginning, given ``gold``'s chapter index."""
    if heading == "index":
        text = f"{chapter_index(gold.chapter)} {ch.title}".rstrip() + "\n" + ch.text
    else:  # full (the heading goes into the context) / none
        text = ch.text
    ids = encode(tokenizer, text)[:suffix_len]
    if len(ids) < suffix_len:
        raise InputError(f"chapter {ch.book}:{ch.chapter} is shorter than {suffix_len} tokens", None)
    return ids


def chapter_examples(books: dict[str, list[Chapter]], tokenizer, *, n: int, max_len: int, seed: int,
                     negatives: int = N_NEGATIVES) -> list[dict]:
    """``n`` ChapterBreak examples: a break before chapter index j of a book (j >= 1) with at least ``negatives``
    chapters after j and at least ``max_len`` tokens before it. Breaks are drawn per book round-robin with the
    seed; each example names its book, the gold position j, the negative positions (later chapters: > j), and the
    book's token stream up to the break."""
    per_book = {}
    for book, chs in books.items():
        starts, ids = [], []
        for ch in chs:
            starts.append(len(ids))
            ids += encode(tokenizer, render_chapter(ch))
        ok = [j for j in range(1, len(chs) - negatives) if starts[j] >= max_len]
        if ok:
            per_book[book] = (chs, starts, ids, ok)
    if not per_book:
        raise InputError(f"no chapter break has {max_len} tokens before it and {negatives} later chapters")
    names = sorted(per_book)
    rng = rng_for(seed, "chapter-breaks")
    pools = {b: rng.sample(per_book[b][3], len(per_book[b][3])) for b in names}
    out = []
    i = 0
    while len(out) < n and any(pools.values()):
        b = names[i % len(names)]
        i += 1
        if not pools[b]:
            continue
        j = pools[b].pop()
        chs, starts, ids, _ = per_book[b]
        r = rng_for(seed, "negatives", b, chs[j].chapter)
        negs = sorted(r.sample(range(j + 1, len(chs)), negatives))
        out.append({"book": b, "j": j, "chapters": chs, "negs": negs, "prefix_ids": ids[:starts[j]]})
    return out


def doc_start_id(tokenizer) -> int:
    """The token a document starts after: BOS where the tokenizer has one (Llama), else EOS (Qwen: documents are
    separated by <|endoftext|>)."""
    for t in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if t is not None:
            return int(t)
    raise InputError("--score pmi needs a tokenizer with a BOS or EOS token")


def priors(loaded, cands: list[list[int]], batch_size: int) -> list[float]:
    """log P(s|<doc start>) of each candidate: its likelihood without the prefix (the PMI baseline)."""
    return [x.logprob for x in score_candidates(loaded.model, [doc_start_id(loaded.tokenizer)], cands,
                                                batch_size=batch_size, pad_id=loaded.pad_id,
                                                reuse_prefix=_reuse(loaded))]


def judge(lps: list[float], prior: list[float] | None) -> dict:
    """The item's outcome from the gold's (first) and the negatives' log-likelihoods (and, for PMI, their priors):
    correct when the gold scores strictly highest (a tie is wrong), its rank, and the numbers behind it."""
    vals = lps if prior is None else [a - b for a, b in zip(lps, prior)]
    out = {"value": float(all(vals[0] > x for x in vals[1:])), "logprobs": lps,
           "gold_rank": 1 + sum(x > vals[0] for x in vals[1:])}
    if prior is not None:
        out.update(prior_logprobs=prior, pmi=vals)
    return out


METRICS = {"logprob": "accuracy (gold suffix most likely of 6)",
           "pmi": "accuracy (gold suffix highest PMI with the prefix of 6)"}


def _resolved(loaded, settings, fields: dict, variant: str) -> SuffixIdSettings:
    s = probe_settings(SuffixIdSettings, settings, {**fields, "variant": variant} if settings is None else fields)
    s = dataclasses.replace(s, lengths=s.lengths or default_suffix_lengths(loaded.orig_ctx, s.suffix_len))
    check_lengths(s)
    return s


def check_lengths(s: SuffixIdSettings) -> None:
    """Every length leaves room for a prefix beside the candidate (InputError naming the first that does not, or
    none at all)."""
    short = [L for L in s.lengths or [] if L <= s.suffix_len]
    if short:
        raise InputError(f"--lengths {short[0]}: a length counts the prefix and the {s.suffix_len}-token candidate "
                         f"(--suffix-len), so it must be more than {s.suffix_len}")
    if s.lengths is not None and not s.lengths:
        raise InputError(f"no length leaves room for a prefix beside the {s.suffix_len}-token candidate")


def check_memory(loaded, s: SuffixIdSettings, candidates: int = 6) -> None:
    """The longest length's forwards fit the memory available (one line otherwise, before any text is read): the
    prefix encoded once with its KV cache and a copy per candidate in a batch, or (a length-dependent rope) a batch
    of whole prefix + candidate rows."""
    L, rows = max(s.lengths), min(s.batch_size, candidates)
    if _reuse(loaded):
        check_batch(loaded.model, [L], 1, kv=True, kv_copies=rows + 1, what=f"--lengths {L}")
    else:
        check_batch(loaded.model, [L] * rows, s.suffix_len, what=f"--lengths {L}", padded=True)


def _start(loaded, settings, fields: dict, variant: str) -> tuple[SuffixIdSettings, ProbeRun]:
    s = _resolved(loaded, settings, fields, variant)
    check_memory(loaded, s)  # before any text is read or the run directory is opened
    return s, ProbeRun("suffix-id", loaded, s, s.lengths, metric=METRICS[s.score],
                       column="tokens read (prefix + candidate)", cell_kind="proportion", variant=variant_label)


def _longest_prefix(s: SuffixIdSettings) -> int:
    """The longest prefix an example must have before its break: the longest length less the candidate."""
    return max(s.lengths) - s.suffix_len


def _score_example(run: ProbeRun, loaded, s: SuffixIdSettings, cands: list, key: str, prefix, record: dict,
                   tail: int = 0) -> None:
    """One example at every length L, the tokens read (``prefix(P)``: the last P context ids, P = L - the
    candidate's tokens - ``tail``, the tokens ``prefix`` appends after them; item id ``KEY:L<L>``): the
    candidates' log-likelihoods after it, judged (:func:`judge`), added to ``run`` with ``record``'s fields and
    ``prefix_tokens``."""
    prior = priors(loaded, cands, s.batch_size) if s.score == "pmi" else None
    for L in s.lengths:
        rid = f"{key}:L{L}"
        if run.done(rid):
            continue
        p = L - s.suffix_len - tail
        if p < 1:
            raise InputError(f"--lengths {L}: no room for a prefix before the {tail}-token heading and the "
                             f"{s.suffix_len}-token candidate")
        ids = prefix(p)
        scores = score_candidates(loaded.model, ids, cands, batch_size=s.batch_size, pad_id=loaded.pad_id,
                                  reuse_prefix=_reuse(loaded))
        run.add({"id": rid, "group": "", "col": L, "prefix_tokens": len(ids), **record,
                 **judge([x.logprob for x in scores], prior)})


def chapter_probe(loaded, books, settings: SuffixIdSettings | None = None, **fields) -> dict:
    """ChapterBreak suffix identification into run dir ``settings.out`` (or give the settings as keywords); cells:
    accuracy per prefix length."""
    s, run = _start(loaded, settings, fields, "chapter")
    tok = loaded.tokenizer
    for ex in progress(chapter_examples(books, tok, n=s.n, max_len=_longest_prefix(s), seed=s.seed), "suffix-id"):
        chs, j = ex["chapters"], ex["j"]
        gold = chs[j]
        cands = [chapter_candidate(chs[c], gold, s.heading, tok, s.suffix_len) for c in [j] + ex["negs"]]
        tail = encode(tok, gold.heading + "\n") if s.heading == "full" else []
        _score_example(run, loaded, s, cands, f"{ex['book']}:{gold.chapter}", lambda p: ex["prefix_ids"][-p:] + tail,
                       {"book": ex["book"], "gold_chapter": gold.chapter,
                        "negative_chapters": [chs[c].chapter for c in ex["negs"]]}, tail=len(tail))
    return run.finish()


# ---------------------------------------------------------------- sentence variant (Sun et al. 2021 Sec 5)
_FULL_STOP = ("。", "！", "？", ".", "!", "?")


def _ends_at_full_stop(sentence: str) -> bool:
    s = sentence.rstrip().rstrip("”」』’\"'）)》")
    return s.endswith(_FULL_STOP)


def sentence_stream(tokenizer, text: str) -> tuple[list[int], list[int], list[bool]]:
    """Tokens of ``text`` tokenized sentence by sentence, the token offset of each sentence start, and whether the
    sentence before each start ends at a full stop."""
    sents = split_sentences(text)
    enc = tokenizer(sents, add_special_tokens=False)["input_ids"] if sents else []
    ids, starts, stop = [], [], []
    prev_stop = False
    for s, e in zip(sents, enc):
        starts.append(len(ids))
        stop.append(prev_stop)
        ids += e
        prev_stop = _ends_at_full_stop(s)
    return ids, starts, stop


def sentence_examples(docs, tokenizer, *, n: int, max_len: int, suffix_len: int, seed: int,
                      negatives: int = N_NEGATIVES) -> list[dict]:
    """``n`` examples: a boundary b after a full stop with >= ``max_len`` tokens before it; gold = ids[b:b+128];
    negatives = 128-token spans of the same book starting at a sentence start, outside [b - max_len, b + 128)."""
    books: dict[str, list] = {}
    for d in docs:
        books.setdefault(d.book, []).append(d)
    per_book = {}
    for book, ds in books.items():
        ids, starts, stop = sentence_stream(tokenizer, "".join(d.text for d in ds))
        bounds = [k for k in range(len(starts)) if stop[k] and max_len <= starts[k] <= len(ids) - suffix_len]
        per_book[book] = (ids, starts, bounds)
    names = sorted(per_book)
    out = []
    tries = 0
    i = 0
    while len(out) < n and tries < 50 * max(n, 1):
        tries += 1
        b = names[i % len(names)]
        i += 1
        ids, starts, bounds = per_book[b]
        rng = rng_for(seed, "sentence", b, tries)
        if not bounds:
            continue
        bpos = starts[rng.choice(bounds)]
        lo, hi = bpos - max_len, bpos + suffix_len
        # a negative [s, s+128) must not overlap [lo, hi)
        cand = [s for s in starts if s + suffix_len <= len(ids) and (s + suffix_len <= lo or s >= hi)]
        if len(cand) < negatives:
            continue
        if any(e["book"] == b and e["boundary"] == bpos for e in out):
            continue
        negs = sorted(rng.sample(cand, negatives))
        out.append({"book": b, "boundary": bpos, "ids": ids, "negs": negs})
    if len(out) < n:
        raise InputError(f"only {len(out)} of {n} sentence examples fit (need {max_len} prefix tokens, "
                         f"{negatives} non-overlapping same-book spans)")
    return out


def sentence_probe(loaded, docs, settings: SuffixIdSettings | None = None, **fields) -> dict:
    """Sun et al. 2021's sentence variant into run dir ``settings.out``; cells: accuracy per prefix length."""
    s, run = _start(loaded, settings, fields, "sentence")
    examples = sentence_examples(docs, loaded.tokenizer, n=s.n, max_len=_longest_prefix(s), suffix_len=s.suffix_len,
                                 seed=s.seed)
    for ex in progress(examples, "suffix-id"):
        ids, b, k = ex["ids"], ex["boundary"], s.suffix_len
        cands = [ids[b:b + k]] + [ids[o:o + k] for o in ex["negs"]]
        _score_example(run, loaded, s, cands, f"{ex['book']}@{b}", lambda p: ids[b - p:b],
                       {"book": ex["book"], "boundary": b, "negative_starts": ex["negs"]})
    return run.finish()


def load_data(s: SuffixIdSettings):
    """The chapter variant reads a chapters JSONL (books); the sentence variant any documents JSONL. Given
    ``--lengths`` are checked first (before a model loads)."""
    check_lengths(s)
    if s.variant == "chapter":
        if not is_chapters_file(s.data):
            raise InputError("the chapter variant needs a chapters JSONL {book, chapter, title, text}", s.data)
        return load_books(s.data)
    return load_docs(s.data)


def run(loaded, data, s: SuffixIdSettings) -> dict:
    return (chapter_probe if s.variant == "chapter" else sentence_probe)(loaded, data, s)


def register(sub) -> None:
    register_probe(sub, "suffix-id", SuffixIdSettings, help="suffix identification accuracy vs the tokens read "
                                                            "(ChapterBreak)", description=__doc__, load=load_data,
                   run=run)

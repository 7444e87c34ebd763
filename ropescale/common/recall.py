"""The recall task: the demo's long-range task, a stand-in for CNNSum's human-written summaries that a tiny model can
do.

A sample is an excerpt of a novel (consecutive sentences of the shared novels) in which ``K`` sentences, one in
each of ``K`` equal stretches of the excerpt, are marked ``【1】`` ... ``【K】`` where they stand; its reference
"summary" is the marked sentences in order, one a line, each with its mark:

    context:  ...行者笑道：“……”【1】那怪闻言，急回头看。……【2】三藏在马上……        (T tokens)
    summary:  【1】那怪闻言，急回头看。\\n【2】三藏在马上……\\n【3】……\\n【4】……

Every line of the reference is copied verbatim from the input (a model that can copy and look things up by their
mark can write it) and the marks are spread evenly over the whole input, so a model that cannot attend past some
position can lose the lines it cannot reach (how ROUGE-L falls with it is measured, not assumed: the demo reports
exact recall per mark beside it, and a model may fail everywhere at once rather than by depth). CNNSum's real
summaries are human-written plot summaries, which a model of a few million parameters cannot write; the real
CNNSum path (Appendix F prompts, the release files, ``data_concat sample``) is unchanged. Samples are rendered with
the same prompts (``ft-ie`` / ``ft-ib``, Appendix F.2) and scored with the same ROUGE-L as CNNSum.

The tiny default (``ropescale.tiny``) is pretrained with these samples inside its 512-token context; the demo
fine-tunes on longer ones and evaluates at 1x-8x the original context. Held-out text: the last ``--heldout``
chapters of each book (the tiny default never trains on them).

The task's format and samplers live here (the tiny default's build and ``python -m data_concat recall`` both use
them); the command writes them to JSONL:

    python -m data_concat recall --eval-tokens 2048 --max-answer-tokens 128 --n 24 --part heldout --out T2048.jsonl
    python -m data_concat recall --min-tokens 1024 --max-tokens 2048 --n 400 --part train --out pairs.jsonl

An eval set's length counts the total the model holds (:func:`total_tokens`): for every prompt it will be evaluated
with, the rendered prompt (context included, tokenized as ``eval_summ generate`` tokenizes it) plus the generation
budget is at most the set's length, so ``T512`` fits a 512-token window with its answer.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

from .chapters import Chapter, by_book
from .io import InputError
from .text import split_sentences

MARK = "【{}】"
MARKS = 4  # marked sentences per sample
MIN_CHARS, MAX_CHARS = 6, 40  # length of a sentence that may be marked (characters, without its line break)
PARTS = ("train", "heldout", "all")
HELDOUT = 12  # last chapters of each book held out (ropescale.tiny.build.TinySpec.heldout_per_book is this value)


def mark(k: int) -> str:
    """The mark of the k-th sentence (1-based): 【k】."""
    return MARK.format(k)


def reference(sentences: Sequence[str]) -> str:
    """The reference summary for the marked sentences, in order."""
    return "\n".join(mark(k) + s.strip() for k, s in enumerate(sentences, 1))


_MARK_RE = re.compile(r"【(\d+)】")


def marked_sentences(reference: str) -> list[str] | None:
    """The marked sentences of a recall reference (:func:`reference`), in mark order; None when ``reference`` is
    not in that format (every line ``【k】sentence``, k = 1, 2, ... in order)."""
    if not isinstance(reference, str):
        return None
    lines = reference.split("\n")
    out = []
    for k, line in enumerate(lines, 1):
        if not line.startswith(mark(k)):
            return None
        out.append(line[len(mark(k)):].strip())
    return out or None


def mark_recall(prediction: str, reference: str) -> list[bool] | None:
    """Exact recall per mark: for each marked sentence k of ``reference`` (k = 1..K, i.e. by depth in the context),
    whether ``prediction`` holds ``【k】`` followed by exactly that sentence (up to the next mark or line break;
    surrounding white space ignored). A right sentence under another mark does not count. None when the reference
    is not a recall reference."""
    want = marked_sentences(reference)
    if want is None:
        return None
    got: dict[int, set[str]] = {}
    parts = _MARK_RE.split(prediction or "")
    for i in range(1, len(parts) - 1, 2):  # parts: text, k, text after 【k】, k, ...
        got.setdefault(int(parts[i]), set()).add(parts[i + 1].split("\n")[0].strip())
    return [s in got.get(k, ()) for k, s in enumerate(want, 1)]


def marks_only(reference: str) -> str | None:
    """The floor prediction for ``reference``: its marks alone, one a line (``【1】\\n【2】...``): what marks and
    layout score under ROUGE-L without recalling anything."""
    want = marked_sentences(reference)
    return None if want is None else "\n".join(mark(k) for k in range(1, len(want) + 1))


@dataclass
class Source:
    """One book's text (the chosen chapters) as sentences with their token counts and chapter numbers."""

    book: str
    sentences: list[str]
    tokens: list[int]
    chapter: list[int]

    def __len__(self) -> int:
        return len(self.sentences)


def split_part(chapters: Sequence[Chapter], part: str, heldout: int = HELDOUT) -> list[Chapter]:
    """The chapters of ``part``: train (all but the last ``heldout`` of each book), heldout (those), or all."""
    if part not in PARTS:
        raise InputError(f"unknown --part {part!r} (choose from {', '.join(PARTS)})")
    if heldout < 0:
        raise InputError(f"--heldout must be >= 0, got {heldout}")
    out = []
    for chs in by_book(chapters).values():
        cut = max(0, len(chs) - heldout)
        out += {"train": chs[:cut], "heldout": chs[cut:], "all": chs}[part]
    return out


def sources(chapters: Sequence[Chapter], tok) -> list[Source]:
    """The chapters as one :class:`Source` per book, in file order."""
    out = []
    for book, chs in by_book(chapters).items():
        sents, chap = [], []
        for c in chs:
            s = split_sentences(c.text.strip() + "\n")
            sents += s
            chap += [c.chapter] * len(s)
        counts = [len(x) for x in tok(sents, add_special_tokens=False)["input_ids"]] if sents else []
        out.append(Source(book, sents, counts, chap))
    return out


def _markable(s: str) -> bool:
    t = s.strip()
    return MIN_CHARS <= len(t) <= MAX_CHARS and "【" not in t and "】" not in t


def build(src: Source, start: int, n_tokens: int, rng: random.Random, marks: int = MARKS,
          mark_tokens: int = 3) -> dict | None:
    """A sample of about ``n_tokens`` context tokens from ``src`` starting at sentence ``start``: the sentences
    that fit (with ``mark_tokens`` per mark), cut into ``marks`` stretches of equal token count, one markable
    sentence drawn from each. None when the text runs out or a stretch has no markable sentence."""
    budget = n_tokens - marks * mark_tokens
    end, total = start, 0
    while end < len(src) and total + src.tokens[end] <= budget:
        total += src.tokens[end]
        end += 1
    if end >= len(src) and total < budget * 0.9 or end - start < marks:
        return None
    stretch: list[list[int]] = [[] for _ in range(marks)]
    acc = 0
    for i in range(start, end):
        stretch[min(marks - 1, marks * acc // max(total, 1))].append(i)
        acc += src.tokens[i]
    picks = []
    for group in stretch:
        cand = [i for i in group if _markable(src.sentences[i])]
        if not cand:
            return None
        picks.append(rng.choice(cand))
    parts = []
    for i in range(start, end):
        s = src.sentences[i]
        parts.append(mark(picks.index(i) + 1) + s if i in picks else s)
    context = "".join(parts).strip()
    return {"context": context, "summary": reference([src.sentences[i] for i in picks]), "book": src.book,
            "chapters": [src.chapter[start], src.chapter[end - 1]], "start": start, "end": end, "marked": picks}


def exact_tokens(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def prompt_tokens(tok, context: str, prompt: str, style: str = "release") -> int:
    """Tokens of ``context`` rendered with ``prompt`` (:func:`prompts.render`), tokenized as ``eval_summ generate``
    tokenizes a prompt without a chat template: the whole text at once, with the tokenizer's special tokens."""
    from . import prompts

    return len(tok(prompts.render(context, prompt, style))["input_ids"])


def total_tokens(tok, context: str, prompt_types: Sequence[str], budget: int = 0, style: str = "release") -> int:
    """What an eval sample takes of the model's window: the longest of its rendered prompts (``prompt_types``) plus
    the generation budget (the most new tokens generate may add)."""
    return max(prompt_tokens(tok, context, p, style) for p in prompt_types) + budget


# a marked sentence of the longest kind (MAX_CHARS characters), to size the answer in a given tokenizer
_LONG_SENTENCE = "那行者在半空中看得分明，即将金箍棒变作一条铁索，把那妖精的两腿锁住了。"[:MAX_CHARS]


def pair_range(tok, lo: int, hi: int, marks: int = MARKS) -> tuple[int, int]:
    """Context-token range of recall pairs that pack into samples of ``lo``-``hi`` tokens: the longer F.2 prompt
    (``ft-ie`` / ``ft-ib``) and an answer of ``marks`` long sentences + EOS are taken off. A pair whose answer is
    longer still is skipped by ``pack --on-bad skip`` (and counted). InputError when nothing fits."""
    from . import prompts

    overhead = max(exact_tokens(tok, prompts.render("", k)) for k in ("ft-ie", "ft-ib"))
    answer = exact_tokens(tok, reference([_LONG_SENTENCE] * marks)) + 1
    ctx_lo, ctx_hi = lo - overhead, hi - overhead - answer
    if ctx_hi < max(ctx_lo, 8 * marks):
        raise InputError(f"samples of {lo}-{hi} tokens cannot hold a recall pair beside the {overhead}-token prompt "
                         f"and a ~{answer}-token answer: use longer samples")
    return max(ctx_lo, 8 * marks), ctx_hi


def window_starts(src: Source, target: int, k: int, seed: int) -> list[int]:
    """Sentence indices where ``k`` eval windows of ``target`` tokens start in ``src`` (fewer when the text holds
    fewer): the text is cut into ``k`` equal strata (by tokens) and each window starts at a seeded place inside its
    stratum, early enough to end inside it, so windows never overlap, cover the whole book, and move with the seed
    (a stratum with no room for a window starts at its beginning)."""
    total = sum(src.tokens)
    k = max(1, min(k, total // target))
    step = total / k
    rng = random.Random(f"{seed}|windows|{src.book}")
    wants = [j * step + rng.uniform(0, max(0.0, step - target)) for j in range(k)]
    starts, acc, j = [], 0, 0
    for i, t in enumerate(src.tokens):
        if j < k and acc >= wants[j]:
            starts.append(i)
            j += 1
        acc += t
    return starts


def _check_sizes(n: int, target: int | None, min_tokens: int | None, max_tokens: int | None, marks: int,
                 max_answer: int | None) -> None:
    """recall_samples' sizes are possible: an InputError naming the flag otherwise."""
    if n <= 0:
        raise InputError(f"--n must be positive, got {n}")
    if marks < 1:
        raise InputError(f"--marks must be >= 1, got {marks}")
    if target is None and (min_tokens is None or max_tokens is None):
        raise InputError("give --target, or --min-tokens and --max-tokens")
    if max_answer is not None and max_answer < 8 * marks:
        raise InputError(f"--max-answer-tokens {max_answer} is too short for {marks} marked sentences")
    if target is not None and target < 8 * marks:
        raise InputError(f"--target {target} is too short for {marks} marked sentences")
    if target is None and not 8 * marks <= min_tokens <= max_tokens:
        raise InputError(f"bad token range [{min_tokens}, {max_tokens}] (need {8 * marks} <= min <= max)")


def _eval_windows(srcs: Sequence[Source], tok, n: int, target: int, marks: int, seed: int, rng: random.Random,
                  max_answer: int | None, fits: "_Fit") -> list[dict]:
    """An eval set: non-overlapping windows spread over each book, books taking turns, each holding as much text as
    ``fits`` allows in ``target`` tokens; a window whose stretch has no markable sentence, whose answer does not fit
    ``max_answer``, or whose rendered prompts run past ``target`` is moved a little."""
    out: list[dict] = []
    queues = [(src, window_starts(src, target, -(-n // len(srcs)), seed)) for src in srcs]
    i = 0
    while len(out) < n and any(q[1] for q in queues):
        src, starts = queues[i % len(queues)]
        i += 1
        if not starts:
            continue
        start = starts.pop(0)
        taken = [(e["start"], e["end"]) for e in out if e["book"] == src.book]
        for shift in (0, *(d for k in range(1, 13) for d in (k, -k))):
            if not 0 <= start + shift < len(src):
                continue
            ex = build(src, start + shift, fits.context, rng, marks)
            if ex and not any(ex["start"] < b and a < ex["end"] for a, b in taken) \
                    and fits.total(ex["context"]) <= target \
                    and (max_answer is None or exact_tokens(tok, ex["summary"]) + 1 <= max_answer):
                out.append(ex)
                break
    if len(out) < n:
        raise InputError(f"only {len(out)} of {n} samples of {target} tokens fit in the chosen text "
                         f"(use fewer --n, a shorter --target or more chapters)")
    return out


@dataclass
class _Fit:
    """How an eval window is sized for a length ``target``: without prompts the context alone is at most ``target``
    tokens; with prompts, every rendered prompt plus the generation ``budget`` is (:func:`total_tokens`), so the
    context gets ``target`` less the budget and the longest prompt's own tokens."""

    tok: object
    target: int
    prompts: tuple = ()
    budget: int = 0
    style: str = "release"

    @cached_property
    def context(self) -> int:
        """The context tokens a window is built to (its exact total is checked by :meth:`total`)."""
        if not self.prompts:
            return self.target
        return self.target - total_tokens(self.tok, "", self.prompts, self.budget, self.style)

    def total(self, context: str) -> int:
        if not self.prompts:
            return exact_tokens(self.tok, context)
        return total_tokens(self.tok, context, self.prompts, self.budget, self.style)


def _training_samples(srcs: Sequence[Source], n: int, min_tokens: int, max_tokens: int, marks: int,
                      rng: random.Random) -> list[dict]:
    """Training pairs: lengths uniform in [min_tokens, max_tokens], random books and starts."""
    out: list[dict] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 50 * n:
            raise InputError(f"could not build {n} samples of {min_tokens}-{max_tokens} tokens from the text")
        src = srcs[rng.randrange(len(srcs))]
        length = rng.randint(min_tokens, max_tokens)
        if len(src) < 2:
            continue
        ex = build(src, rng.randrange(len(src)), length, rng, marks)
        if ex:
            out.append(ex)
    return out


def recall_samples(srcs: Sequence[Source], tok, *, n: int, target: int | None = None, min_tokens: int | None = None,
                   max_tokens: int | None = None, marks: int = MARKS, seed: int = 0,
                   max_answer: int | None = None, prompts: Sequence[str] = (), budget: int | None = None,
                   style: str = "release") -> list[dict]:
    """``n`` samples. With ``target``: an eval set, one window in each of equal strata of a book's text, at a place
    the seed picks (:func:`window_starts`; round robin over books, windows never overlap). Without ``prompts`` every
    context has at most ``target`` tokens (within a few sentences of it); with ``prompts`` (e.g. ``("ft-ie",
    "ft-ib")``) ``target`` is the total the model holds: every rendered prompt plus ``budget`` new tokens (default
    ``max_answer``, else 0) is at most ``target`` tokens (:func:`total_tokens`). With ``max_answer`` too, every
    reference plus an EOS fits in that many tokens (a window whose marked sentences are longer is moved and its
    marks drawn again), so a generation of ``max_answer`` new tokens can hold the whole answer.
    With ``min_tokens``/``max_tokens``: lengths uniform in that range, random starts — training pairs."""
    _check_sizes(n, target, min_tokens, max_tokens, marks, max_answer)
    srcs = [s for s in srcs if len(s)]
    if not srcs:
        raise InputError("no text to sample from")
    rng = random.Random(seed)
    if target is not None:
        fits = _Fit(tok, target, tuple(prompts), (max_answer or 0) if budget is None else budget, style)
        if fits.context < 8 * marks:
            raise InputError(f"--eval-tokens {target} leaves {fits.context} context tokens beside the prompts "
                             f"({', '.join(prompts)}) and the {fits.budget}-token generation budget: too short for "
                             f"{marks} marked sentences")
        out = _eval_windows(srcs, tok, n, target, marks, seed, rng, max_answer, fits)
    else:
        out = _training_samples(srcs, n, min_tokens, max_tokens, marks, rng)
    for j, ex in enumerate(out):
        ex["tokens"] = exact_tokens(tok, ex["context"])
        ex["id"] = f"recall:{ex['book']}:{ex['chapters'][0]}:{ex['start']}:{j}"
        ex["task"] = "recall"
        if target is not None:
            ex["subset"] = f"T{target}"
        del ex["start"], ex["end"], ex["marked"]
    return out

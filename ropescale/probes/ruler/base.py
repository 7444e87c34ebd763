"""What every RULER generator shares: the sample, the words the model's tokenizer writes, the haystacks, and the
fit of a sample to its length.

A length L counts every token the model reads: the input (template + haystack + question), the answer prefix, and
the answer budget -- the larger of the generation budget (RULER's ``tokens_to_generate``) and the teacher-forced
answer's tokens -- so ``len(prompt) + max(budget, len(answer)) <= L`` (RULER, niah.py: ``total_tokens =
len(input) + tokens_to_generate <= max_seq_length``). The haystack is the largest that fits (:func:`fit`: RULER's
binary search over the haystack size, per sample).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Callable

from ropescale.common.io import InputError

from .templates import ENGLISH_PROBE, NOISE

LANGS = ("en", "zh")


@dataclass
class Sample:
    """One task input at one length: ``prompt`` (input + answer prefix tokens), ``answer`` (the teacher-forced
    continuation's tokens) with each reference's token ``spans`` in it, ``refs`` (the strings RULER's
    string_match_all looks for in a generated answer), the generation ``budget`` and the generator's ``info``."""

    task: str
    length: int
    index: int
    prompt: list[int]
    answer: list[int]
    spans: list[tuple[int, int]]
    refs: list[str]
    budget: int
    text: str = ""  # the prompt as text
    info: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        """The tokens this sample takes of its length: prompt + the larger of the budget and the answer."""
        return len(self.prompt) + max(self.budget, len(self.answer))


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def detect_lang(tokenizer) -> str:
    """``en`` when the tokenizer writes English words (under half a token a character on a sample sentence), else
    ``zh`` (the tiny default's vocabulary spells English letter by letter but has 1,098 Chinese characters)."""
    return "en" if len(encode(tokenizer, ENGLISH_PROBE)) < 0.5 * len(ENGLISH_PROBE) else "zh"


def sentences(text: str, lang: str) -> list[str]:
    """A text's sentences: whitespace collapsed, split after . ! ? (en) or 。！？ (zh), the mark kept."""
    if lang == "en":
        text = re.sub(r"\s+", " ", text).strip()
        return [s for s in re.split(r"(?<=[.!?])\s+", text) if s]
    text = re.sub(r"\s+", "", text)
    return [s for s in re.split(r"(?<=[。！？])", text) if s]


@dataclass
class Context:
    """What a generator reads: the tokenizer, the language of the texts, the words it draws (``words``: each one
    token of the tokenizer: English words of the novel text, written with a leading space, or Chinese characters)
    and the novel haystack's sentences."""

    tokenizer: object
    lang: str
    words: list[str]
    novel: list[str]

    def encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text)

    @property
    def joiner(self) -> str:
        """What joins a haystack's sentences (RULER joins the essay's with a space)."""
        return " " if self.lang == "en" else ""


def word_pool(tokenizer, texts: list[str], lang: str, limit: int = 4000) -> list[str]:
    """The words a generator draws, in order of first use in ``texts``: English lowercase words of 4-9 letters that
    the tokenizer writes as one token after a space, or Chinese characters it writes as one token."""
    seen: dict[str, None] = {}
    pattern = r"\b[a-z]{4,9}\b" if lang == "en" else r"[\u4e00-\u9fff]"
    for t in texts:
        for w in re.findall(pattern, t[:2_000_000]):
            if w in seen:
                continue
            if len(encode(tokenizer, (" " + w) if lang == "en" else w)) == 1:
                seen[w] = None
                if len(seen) >= limit:
                    return list(seen)
    return list(seen)


def make_context(tokenizer, lang: str, texts: list[str]) -> Context:
    """The context for ``lang`` from the novel ``texts`` (its haystack and its word pool)."""
    if lang not in LANGS:
        raise InputError(f"--lang must be one of auto, {', '.join(LANGS)}; got {lang!r}")
    sents = [s for t in texts for s in sentences(t, lang)]
    words = word_pool(tokenizer, texts, lang)
    if len(words) < 60:
        raise InputError(f"the novel text gives only {len(words)} one-token words for --lang {lang}; "
                         "a generator needs at least 60 (is the text in the language of --lang?)")
    return Context(tokenizer, lang, words, sents)


def noise_sentences(lang: str, k: int) -> list[str]:
    """RULER's noise haystack: its five sentences repeated, ``k`` repetitions (each one haystack "sentence")."""
    return [NOISE[lang]] * k


def novel_sentences(ctx: Context, k: int, start: int) -> list[str]:
    """``k`` consecutive sentences of the novel text from ``start`` (wrapping around, as RULER repeats its essays)."""
    n = len(ctx.novel)
    if n == 0:
        raise InputError("the novel haystack has no sentences")
    return [ctx.novel[(start + i) % n] for i in range(k)]


def random_number(rng: random.Random, digits: int = 7) -> str:
    """RULER's needle value: a random ``digits``-digit number (niah.py ``generate_random_number``)."""
    return str(rng.randint(10 ** (digits - 1), 10 ** digits - 1))


def answer_tokens(ctx: Context, refs: list[str], lead: str, sep: str, end: str) -> tuple[list[int], list]:
    """The teacher-forced answer ``lead + sep.join(refs) + end``, tokenized piece by piece so each reference's token
    span is known: (tokens, [(start, stop) per reference])."""
    ids, spans = ctx.encode(lead) if lead else [], []
    for i, r in enumerate(refs):
        if i:
            ids += ctx.encode(sep)
        a = len(ids)
        ids += ctx.encode(r)
        spans.append((a, len(ids)))
    if end:
        ids += ctx.encode(end)
    return ids, spans


Build = Callable[[int], Sample]  # a sample with haystack size k (the same k always gives the same sample)


def fit(build: Build, length: int, task: str) -> Sample:
    """The sample with the largest haystack size k >= 1 whose tokens fit ``length`` (:attr:`Sample.total` <= L):
    doubling, then bisection (RULER's binary search). InputError when even k = 1 does not fit."""
    s = build(1)
    if s.total > length:
        raise InputError(f"--lengths {length}: too short for task {task} ({s.total} tokens with the smallest "
                         f"haystack, the answer budget included)")
    lo, hi = 1, 2
    while (t := build(hi)).total <= length:
        lo, s, hi = hi, t, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        t = build(mid)
        if t.total <= length:
            lo, s = mid, t
        else:
            hi = mid
    return s

"""Frequent words extraction (RULER, arXiv 2404.06654 Sec 3.3; NVIDIA/RULER
scripts/data/synthetic/freq_words_extraction.py): coded words (six random lower-case letters) drawn with Zipf
counts, the word of rank r appearing int(N r^-alpha / zeta(alpha)) times (alpha = 2), the top-ranked one replaced
by the noise '...'; the answer is the words of ranks 2-4. The vocabulary has L // 50 words (RULER's default)."""
from __future__ import annotations

import functools
import random
import string
from dataclasses import dataclass

from .base import Context, Sample, answer_tokens, fit
from .templates import FWE


@dataclass(frozen=True)
class FweConfig:
    alpha: float = 2.0
    word_len: int = 6
    budget: int = 50  # RULER's tokens_to_generate for freq_words_extraction


@functools.lru_cache(maxsize=None)
def zeta(s: float, terms: int = 100_000) -> float:
    """Riemann zeta(s) for s > 1: the partial sum plus the Euler-Maclaurin tail N^(1-s)/(s-1) - N^-s/2."""
    n = terms
    return sum(k ** -s for k in range(1, n)) + n ** (1 - s) / (s - 1) + 0.5 * n ** -s


def zipf_counts(num_words: int, vocab: int, alpha: float) -> list[int]:
    """RULER's counts: int(num_words * r^-alpha / zeta(alpha)) for rank r = 1..vocab."""
    z = zeta(alpha)
    return [int(num_words * r ** -alpha / z) for r in range(1, vocab + 1)]


def fwe_sample(ctx: Context, cfg: FweConfig, task: str, length: int, index: int, seed: int,
              budget: int = 0) -> Sample:
    rng = random.Random(f"{seed}|{task}|{length}|{index}")
    size = max(10, (length - (budget or cfg.budget)) // 50)
    vocab: list[str] = []
    while len(vocab) < size:
        w = "".join(rng.choices(string.ascii_lowercase, k=cfg.word_len))
        if w not in vocab:
            vocab.append(w)
    vocab[0] = "..."  # the top rank is noise
    refs = vocab[1:4]
    t = FWE[ctx.lang]
    answer, spans = answer_tokens(ctx, refs, t["lead"], t["sep"], t["end"])
    shuffle_seed = rng.random()

    def build(k: int) -> Sample:  # k: RULER's num_words, in steps of 8
        counts = zipf_counts(8 * k, len(vocab), cfg.alpha)
        words = [w for w, c in zip(vocab, counts) for _ in range(c)]
        random.Random(shuffle_seed).shuffle(words)
        text = t["template"].format(context=" ".join(words)) + t["answer_prefix"]
        info = {"num_words": 8 * k, "counts": counts[:5], "vocab": len(vocab)}
        return Sample(task, length, index, ctx.encode(text), answer, spans, refs, budget or cfg.budget, text, info)

    return fit(build, length, task)

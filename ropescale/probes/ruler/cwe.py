"""Common words extraction (RULER, arXiv 2404.06654 Sec 3.3; NVIDIA/RULER
scripts/data/synthetic/common_words_extraction.py): a numbered list of words in which ten common words appear
``freq_cw`` times each and the others ``freq_ucw`` times; the answer is the ten common words. RULER's counts: 6
and 1 below 4,096 tokens, 30 and 3 from 4,096 on; the number of uncommon words is the largest that fits. Where even
no uncommon word fits, ``freq_cw`` is lowered (to 2 at least; the item records the count used). The words are one
token each of the model's vocabulary. RULER's one-shot example is left out (it would fill a 512-token window of the
tiny default)."""
from __future__ import annotations

import random
from dataclasses import dataclass

from ropescale.common.io import InputError

from .base import Context, Sample, fit
from .templates import CWE


@dataclass(frozen=True)
class CweConfig:
    num_cw: int = 10
    budget: int = 120  # RULER's tokens_to_generate for common_words_extraction


def counts_for(length: int) -> tuple[int, int]:
    """RULER's (freq_cw, freq_ucw): (6, 1) below 4,096 tokens, (30, 3) from 4,096 on."""
    return (6, 1) if length < 4096 else (30, 3)


def cwe_answer(ctx: Context, words: list[str]) -> tuple[list[int], list]:
    """The teacher-forced answer " 1. w1 2. w2 ...": each number and each word (with its leading space) tokenized
    apart, so each word's span is its own tokens whatever the tokenizer (a word never shares a token with its
    number)."""
    ids: list[int] = []
    spans = []
    for i, w in enumerate(words):
        ids += ctx.encode(f" {i + 1}.")
        a = len(ids)
        ids += ctx.encode(f" {w}")
        spans.append((a, len(ids)))
    return ids, spans


def cwe_sample(ctx: Context, cfg: CweConfig, task: str, length: int, index: int, seed: int,
              budget: int = 0) -> Sample:
    rng = random.Random(f"{seed}|{task}|{length}|{index}")
    order = rng.sample(ctx.words, len(ctx.words))
    common = order[:cfg.num_cw]
    t = CWE[ctx.lang]
    answer, spans = cwe_answer(ctx, common)
    refs = common
    freq_cw, freq_ucw = counts_for(length)
    shuffle_seed = rng.random()

    def builder(fc: int):
        def build(k: int) -> Sample:  # k - 1 uncommon words
            if cfg.num_cw + k - 1 > len(order):
                raise InputError(f"task {task} at {length} tokens needs more than the {len(order)} one-token words "
                                 "of the novel text")
            words = common * fc + order[cfg.num_cw:cfg.num_cw + k - 1] * freq_ucw
            random.Random(shuffle_seed).shuffle(words)
            context = t["item_sep"].join(t["item"].format(i=i + 1, word=w) for i, w in enumerate(words))
            text = t["template"].format(context=context) + t["answer_prefix"]
            info = {"freq_cw": fc, "freq_ucw": freq_ucw, "uncommon": k - 1, "entries": len(words)}
            return Sample(task, length, index, ctx.encode(text), answer, spans, refs, budget or cfg.budget, text, info)
        return build

    for fc in range(freq_cw, 1, -1):
        b = builder(fc)
        if b(1).total <= length:
            return fit(b, length, task)
    return fit(builder(2), length, task)  # raises: too short

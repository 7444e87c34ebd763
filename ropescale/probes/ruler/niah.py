"""Needle in a haystack (RULER, arXiv 2404.06654 Sec 3.1; NVIDIA/RULER scripts/data/synthetic/niah.py): needles
"One of the special magic numbers for {key} is: {value}." in a haystack, the question asking for the values of one
or more keys.

- ``num_k`` keys, each with ``num_v`` values (one needle per value); ``num_q`` of the keys are asked for; the
  needles of the keys not asked for are the distractors (multikey);
- keys are two words of the model's vocabulary (``adj-noun`` in RULER's English, two characters in Chinese),
  values seven-digit numbers, all distinct;
- the haystack is RULER's noise (its five sentences repeated) or sentences of a novel; the needles go in at
  sentence index ``int(k x depth)`` of a k-sentence haystack, ``depth`` drawn from RULER's 40 depths (0..100 %) or,
  for the needle grid, given.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from .base import Context, Sample, answer_tokens, fit, noise_sentences, novel_sentences, random_number
from .templates import NIAH

DEPTHS = [round(100 * i / 39) for i in range(40)]  # RULER's np.round(np.linspace(0, 100, num=40)).astype(int)


@dataclass(frozen=True)
class NiahConfig:
    haystack: str = "noise"  # noise | novel
    num_k: int = 1
    num_v: int = 1
    num_q: int = 1
    budget: int = 128  # RULER's tokens_to_generate for niah


def make_keys(ctx: Context, rng: random.Random, n: int) -> list[str]:
    """``n`` distinct keys of two vocabulary words (``word-word``; two characters in Chinese)."""
    out: list[str] = []
    while len(out) < n:
        a, b = rng.sample(ctx.words, 2)
        key = f"{a}-{b}" if ctx.lang == "en" else a + b
        if key not in out:
            out.append(key)
    return out


def join_keys(keys: list[str], lang: str) -> str:
    """RULER's query: "a, b, and c" (English), "a、b和c" (Chinese)."""
    sep, last = NIAH[lang]["join_keys"]
    return keys[0] if len(keys) == 1 else sep.join(keys[:-1]) + last + keys[-1]


def texts_for(lang: str, singular: bool) -> tuple[str, str, str]:
    """(needle, template, answer prefix) with RULER's singular rewrite when one value is asked for ('Some' -> 'A',
    'are all' -> 'is', 'are' -> 'is', the singular noun)."""
    t = NIAH[lang]
    noun = t["type_v"]["numbers"][0 if singular else 1]
    template, prefix = t["template"], t["answer_prefix"]
    if singular and lang == "en":
        for a, b in (("Some", "A"), ("are all", "is"), ("are", "is")):
            template, prefix = template.replace(a, b), prefix.replace(a, b)
    return (t["needle"].replace("{type_v}", noun), template.replace("{type_v}", noun),
            prefix.replace("{type_v}", noun))


def niah_sample(ctx: Context, cfg: NiahConfig, task: str, length: int, index: int, seed: int,
                depth: float | None = None, budget: int = 0) -> Sample:
    """One NIAH sample of ``length`` tokens (the haystack fitted by :func:`fit`); ``depth`` in [0, 1] places every
    needle there (the grid), None draws each from RULER's depths."""
    rng = random.Random(f"{seed}|{task}|{length}|{index}")
    num_k = max(cfg.num_k, cfg.num_q)
    keys = make_keys(ctx, rng, num_k)
    values: list[list[str]] = []
    used: set[str] = set()
    for _ in keys:
        vals = []
        while len(vals) < cfg.num_v:
            v = random_number(rng)
            if v not in used:
                used.add(v)
                vals.append(v)
        values.append(vals)
    asked = sorted(rng.sample(range(num_k), cfg.num_q))
    singular = cfg.num_q * cfg.num_v == 1
    needle_t, template, prefix_t = texts_for(ctx.lang, singular)
    needles = [needle_t.format(key=k, value=v) for k, vals in zip(keys, values) for v in vals]
    rng.shuffle(needles)
    depths = [depth] * len(needles) if depth is not None else sorted(d / 100 for d in rng.sample(DEPTHS, len(needles)))
    start = rng.randrange(max(1, len(ctx.novel)))
    query = join_keys([keys[i] for i in asked], ctx.lang)
    refs = [v for i in asked for v in values[i]]
    t = NIAH[ctx.lang]
    answer, spans = answer_tokens(ctx, refs, t["lead"], t["sep"], t["end"])
    prefix = prefix_t.format(query=query)

    def build(k: int) -> Sample:
        hay = noise_sentences(ctx.lang, k) if cfg.haystack == "noise" else novel_sentences(ctx, k, start)
        at = [int(k * d) for d in depths]
        parts: list[str] = []
        last = 0
        for pos, needle in zip(at, needles):
            parts += hay[last:pos] + [needle]
            last = pos
        parts += hay[last:]
        joiner = "\n" if cfg.haystack == "noise" else ctx.joiner
        text = template.format(context=joiner.join(parts), query=query) + prefix
        info = {"depth": depth, "depths": depths, "sentences": k, "needle_at": at, "keys": keys,
                "asked": [keys[i] for i in asked], "haystack": cfg.haystack}
        return Sample(task, length, index, ctx.encode(text), answer, spans, refs, budget or cfg.budget, text, info)

    return fit(build, length, task)

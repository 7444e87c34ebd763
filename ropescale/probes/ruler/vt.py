"""Variable tracking (RULER, arXiv 2404.06654 Sec 3.2; NVIDIA/RULER scripts/data/synthetic/variable_tracking.py):
a chain "VAR X1 = 12345", "VAR X2 = VAR X1", ... (``num_hops`` hops, five-letter upper-case names, a five-digit
value) hidden in the noise haystack, its statements in order at random sentence positions; the answer is every
variable the value reaches. RULER's one-shot example is left out (alone it would fill a 512-token window of the
tiny default)."""
from __future__ import annotations

import random
import string
from dataclasses import dataclass

from .base import Context, Sample, answer_tokens, fit, noise_sentences
from .templates import VT


@dataclass(frozen=True)
class VtConfig:
    num_chains: int = 1
    num_hops: int = 4
    budget: int = 30  # RULER's tokens_to_generate for variable_tracking


def make_chains(rng: random.Random, num_chains: int, num_hops: int, lang: str) -> tuple[list, list]:
    """(variables per chain, statements per chain): distinct five-letter names, the first assigned a value
    (RULER's ``generate_chains``)."""
    names: list[str] = []
    while len(names) < num_chains * (num_hops + 1):
        v = "".join(rng.choices(string.ascii_uppercase, k=5))
        if v not in names:
            names.append(v)
    t = VT[lang]
    variables, chains = [], []
    for c in range(num_chains):
        vs = names[c * (num_hops + 1):(c + 1) * (num_hops + 1)]
        chain = [t["assign_value"].format(var=vs[0], value=rng.randint(10000, 99999))]
        chain += [t["assign_var"].format(var=vs[j + 1], prev=vs[j]) for j in range(num_hops)]
        variables.append(vs)
        chains.append(chain)
    return variables, chains


def vt_sample(ctx: Context, cfg: VtConfig, task: str, length: int, index: int, seed: int,
              budget: int = 0) -> Sample:
    rng = random.Random(f"{seed}|{task}|{length}|{index}")
    variables, chains = make_chains(rng, cfg.num_chains, cfg.num_hops, ctx.lang)
    value = chains[0][0].split("=")[-1].strip()
    t = VT[ctx.lang]
    refs = variables[0]
    answer, spans = answer_tokens(ctx, refs, t["lead"], t["sep"], t["end"])
    prefix = t["answer_prefix"].format(num_v=cfg.num_hops + 1, query=value)
    draw = rng.random()  # each k draws its positions from the same stream

    def build(k: int) -> Sample:
        r = random.Random(f"{draw}|{k}")
        sents = noise_sentences(ctx.lang, k + cfg.num_hops)  # room for the chain
        at = []
        for chain in chains:
            pos = sorted(r.sample(range(len(sents)), len(chain)))
            for j, (p, stmt) in enumerate(zip(pos, chain)):
                sents.insert(p + j, stmt)
                at.append(p + j)
        context = "\n".join(sents).replace(". \n", ".\n")
        text = t["template"].format(context=context, query=value) + prefix
        info = {"sentences": k, "chain_at": at, "value": value}
        return Sample(task, length, index, ctx.encode(text), answer, spans, refs, budget or cfg.budget, text, info)

    return fit(build, length, task)

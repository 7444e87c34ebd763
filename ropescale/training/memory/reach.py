"""How long a sample the memory planner fits, and what binds where it fits none (``python -m
ropescale.training.memory --reach``): the longest sample each family of plans fits on one H200 and one H100 (125
GiB of host each), then 1M and 2M tokens on one H200 and on 8 H200s with Ulysses sequence parallelism, each with the
plan and its numbers or, where no plan fits, the term of the memory model that binds: the largest part of the
closest plan's peak (or of its host memory). A model, not a measurement.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from ropescale.common.forward_memory import GIB, Shape

from .estimate import QWEN15_7B, Setup, estimate
from .plan import H100, H200, Choice, Machine, NoFit, choose, evaluate, recipe_plan

# 8 H200s with Ulysses (--sequence-parallel 8, ZeRO-3 over the 8): each process its GPU and 125 GiB of host (an
# 8-GPU node with 1,000 GiB: the one-H200 machine's host per GPU)
H200_X8 = Machine("8 x H200 (139.8 GiB each), Ulysses over 8, 125 GiB host a GPU", int(139.8 * GIB), 125 * GIB)
LENGTHS = (1 << 20, 1 << 21)  # 1M and 2M: the lengths --reach plans by name


@dataclass(frozen=True)
class Family:
    """A family of plans for :func:`reach`: the planner restricted to some choices."""

    name: str
    fixed: dict = field(default_factory=dict)


NOT_TILED = {"tile_attention": 0}
FAMILIES = (
    Family("recipe: weights + optimizer offloaded, every checkpoint on the host", {"recipe": True}),
    Family("every layer recomputed, checkpoints on the GPU then the host", {"recompute_every": 1,
                                                                            "checkpoint_block": 1} | NOT_TILED),
    Family("+ one checkpoint per 2 layers", {"recompute_every": 1, "checkpoint_block": 2} | NOT_TILED),
    Family("+ one checkpoint per 4 layers", {"recompute_every": 1, "checkpoint_block": 4} | NOT_TILED),
    Family("every choice but the layer tiled by sequence", dict(NOT_TILED)),
    Family("the layer tiled by sequence (4,096-token chunks), every other choice open", {"tile_attention": 4096}),
    Family("the planner, every choice open", {}),
)


def fits(shape: Shape, base: Setup, machine: Machine, fixed: dict) -> Choice | None:
    """The planner's choice among the family's plans, or None where none fits."""
    fixed = dict(fixed)
    if fixed.pop("recipe", False):
        c = evaluate(recipe_plan(base, shape, cuda=True), shape, base, machine)
        ok = c.estimate.peak <= machine.gpu_budget and c.estimate.host <= machine.host_budget
        return c if ok else None
    try:
        return choose(shape, base, machine, fixed)
    except NoFit:
        return None


def reach(shape: Shape, machine: Machine, family: Family, *, step: int = 16384, base: Setup | None = None,
          limit: int = 1 << 22) -> tuple[int, Choice | None]:
    """The longest sample (a multiple of ``step`` up to ``limit``) some plan of ``family`` fits on ``machine``."""
    base = base or Setup(length=step)

    def at(n: int) -> Choice | None:
        return fits(shape, replace(base, length=n * step), machine, family.fixed)

    if at(1) is None:
        return 0, None
    lo, hi = 1, 2
    while hi * step <= limit and at(hi) is not None:
        lo, hi = hi, hi * 2
    hi = min(hi, limit // step + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) is not None else (lo, mid)
    return lo * step, at(lo)


def peak_parts(shape: Shape, s: Setup) -> dict:
    """The GPU bytes of a step's peak by term, {term: {part: bytes}} (all parts add up to the estimate's peak):
    weights, optimizer state, checkpoints, and at a layer's recompute each per-token part of it x the tokens plus
    its constant (one chunk's working set for the tiled layer), at the head's backward its logits and final norm."""
    e = estimate(shape, s)
    out = {"weights": {"weights": e.weights}, "LoRA + optimizer state": {"state": e.state}}
    if e.at == "end":
        return out | {"the embedding's gradient": {"gradient": e.embedding_grad}}
    out["checkpoints on the GPU"] = {f"{e.checkpoints // max(1, e.parts['checkpoint_bytes'])} x "
                                     f"{e.parts['checkpoint_bytes'] / GIB:.1f} GiB": e.checkpoints}
    rest = e.parts["moments"][e.at] - e.checkpoints
    if e.at == "head":
        return out | {"the head's logits and final norm (with the kept layers)": {"head": rest}}
    what = "the layer tiled by sequence" if s.tile_attention else "a layer's recompute"
    parts = {}
    for k, v in e.parts["per_token"].items():
        parts[f"{k.replace('_', ' ')} ({v:,} B a token)"] = v * e.tokens
        rest -= v * e.tokens
    parts["one chunk's working set" if s.tile_attention else "the rest"] = rest
    return out | {what: parts}


def largest(parts: dict) -> tuple[str, int]:
    """(the term of :func:`peak_parts` with the most bytes, named with its largest part; its bytes)."""
    sums = {k: sum(v.values()) for k, v in parts.items()}
    term = max(sums, key=sums.get)
    if len(parts[term]) > 1:
        sub = max(parts[term], key=parts[term].get)
        return f"{term} (largest part: {sub}, {parts[term][sub] / GIB:.1f} GiB)", sums[term]
    return term, sums[term]


def binding(shape: Shape, base: Setup, machine: Machine, fixed: dict | None = None) -> dict:
    """Where no plan fits ``base`` on ``machine``: the closest plan, the memory it misses by and the term that
    binds (the largest part of its peak where the GPU is over, of its host memory where the host is)."""
    try:
        c = choose(shape, base, machine, dict(fixed or {}))
    except NoFit as err:
        closest = getattr(err, "closest", None)
    else:
        return {"fits": True, "plan": c.plan.describe()}
    if closest is None:
        return {"fits": False, "plan": None, "term": "no plan allowed by the choices given"}
    _, plan, e, host = closest
    s = plan.setup(base)
    gpu_over, host_over = e.peak - machine.gpu_budget, e.host - machine.host_budget
    if gpu_over >= host_over:
        parts = peak_parts(shape, s)
        where, need, budget = "GPU", e.peak, machine.gpu_budget
    else:
        ck = e.parts["host_checkpoints"] * e.parts["checkpoint_bytes"]
        parts = {"host: offloaded weights + optimizer": {"weights + optimizer": e.host - ck},
                 "host: checkpoints": {"checkpoints": ck}}
        where, need, budget = "host", e.host, machine.host_budget
    term, size = largest(parts)
    return {"fits": False, "plan": plan.describe(), "where": where, "need_gib": round(need / GIB, 1),
            "budget_gib": round(budget / GIB, 1), "term": term, "term_gib": round(size / GIB, 1),
            "parts_gib": {k: {p: round(v / GIB, 2) for p, v in d.items()} for k, d in parts.items()}}


def at_length(n: int, machine: Machine, *, sp: int = 1, label_share: float = 0.1, shape: Shape = QWEN15_7B) -> dict:
    """One sample of ``n`` tokens on ``machine`` (``sp`` GPUs under Ulysses): the plan and its numbers, or what
    binds (:func:`binding`)."""
    base = Setup(length=n, sp=sp, world=sp, label_share=label_share)
    row = {"machine": machine.name, "length": n}
    try:
        c = choose(shape, base, machine)
    except NoFit:
        return row | binding(shape, base, machine)
    e = c.estimate
    return row | {"fits": True, "plan": c.plan.describe(), "peak_gib": round(e.peak / GIB, 1), "at": e.at,
                  "host_gib": round(c.host_need / GIB, 1), "step_seconds": round(c.seconds["step"], 1),
                  "tokens_per_s": round(n / c.seconds["step"], 1),
                  "term": largest(peak_parts(shape, c.plan.setup(base)))[0]}


def print_reach(label_share: float = 0.1, as_json: bool = False) -> int:
    rows = []
    for m in (H200, H100):
        for f in FAMILIES:
            n, c = reach(QWEN15_7B, m, f, base=Setup(length=16384, label_share=label_share))
            rows.append({"machine": m.name, "plans": f.name, "longest": n, "plan": c.plan.describe() if c else None,
                         "step_seconds": round(c.seconds["step"], 1) if c else None})
    lengths = [at_length(n, m, sp=sp, label_share=label_share) for m, sp in ((H200, 1), (H200_X8, 8))
               for n in LENGTHS]
    if as_json:
        print(json.dumps({"reach": rows, "lengths": lengths}))
        return 0
    print("| machine | plans | longest sample (model) | the plan there | step (time model) |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['machine']} | {r['plans']} | {r['longest'] // 1024:,}K ({r['longest']:,}) | {r['plan']} | "
              f"{r['step_seconds']} s |")
    print("\n| machine | length | plan (model) | peak GPU / host | step, tok/s (time model) | binding term |\n"
          "|---|---|---|---|---|---|")
    for r in lengths:
        k = f"{r['length'] // 1024:,}K"
        if r["fits"]:
            print(f"| {r['machine']} | {k} | {r['plan']} | {r['peak_gib']} / {r['host_gib']} GiB | "
                  f"{r['step_seconds']} s, {r['tokens_per_s']:,.0f} tok/s | the largest part of the peak: "
                  f"{r['term']} |")
        else:
            print(f"| {r['machine']} | {k} | no plan fits; the closest: {r['plan']} | needs {r['need_gib']} GiB "
                  f"of {r['where']} (budget {r['budget_gib']}) | - | {r['term']}: {r['term_gib']} GiB |")
    return 0

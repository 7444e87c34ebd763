"""LongRoPE's evolutionary search of per-pair rescale factors, model-free: candidates, mutation, crossover, budget,
resumable state. The fitness (lower is better: a model's loss at the target length, the ppl probe's measure) is a
callback, so this module needs no model, no torch and no files; ``python -m rope_scaling search``
(``ropescale.probes.rope_search``) wires a model to it.

A candidate is one rescale factor per rotary pair, lambda_i >= 1 (theta'_i = theta_i / lambda_i, LongRoPE's
``long_factor``), non-decreasing with the pair index (longer wavelength, at least as much interpolation), inside
[1, ``max_factor``] (LongRoPE: 1.25 x the scale), and optionally with the first ``keep_first`` pairs held at 1 (the
high-frequency pairs left unscaled, as LongRoPE's piece-wise variant does). LongRoPE (Ding et al. 2024, arXiv
2402.13753, Sec 3.2 and its reference code ``evolution/algorithms/dim_mono.py``; written anew here):

- the initial population: PI, NTK and YaRN at the scale as per-pair factors (``formulas.rescale_factors``, the
  registry's own formulas), then mutations of them up to ``population``;
- each generation: the ``parents`` fittest of the population survive; ``mutations`` children of random parents
  (each pair, with probability ``mutate_prob``, redrawn on the ``step`` grid between its neighbours' values, so the
  order holds by construction) and ``crossovers`` children of two random parents (pairs of the second parent copied
  into the first until the child is monotone and new; after ``crossover_tries`` failed scans, a mutation instead);
- a candidate already evaluated is never proposed again (LongRoPE's history);
- the budget: fitness evaluations and/or minutes, counted over the whole search (resumes included).

The state (:func:`run_search`'s return value, JSON-serialisable) is handed to ``checkpoint`` after every generation:
the seeded RNG's state at the last completed generation, its population, every evaluated candidate with its
fitness in order, the best fitness per generation. :func:`run_search` with that state continues the search: it
replays an unfinished generation from the checkpoint (candidates already evaluated take their recorded fitness), so a
resumed search with the same seed and budget ends in the same state as an uninterrupted one (an evaluation budget;
a budget in minutes ends where the clock says).

The output (:func:`factors_of`) is a ``--longrope-factors`` file: ``long_factor`` = the best candidate,
``short_factor`` = 1.0 for every pair (plain RoPE within the original context: LongRoPE's readjusted short factors
come from a second search at the original length, Sec 3.3, which this search does not run), no
``attention_factor`` (the default sqrt(1 + ln s / ln orig), the one the fitness callback must evaluate with).
"""
from __future__ import annotations

import copy
import itertools
import math
import operator
import random
import time
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Sequence

from ropescale.common.io import InputError
from ropescale.common.settings import setting

from .formulas import rescale_factors
from .spec import LongRopeFactors, RopeSpec

STATE_VERSION = 1
GROUP = "LongRoPE search (evolutionary, arXiv 2402.13753 Sec 3.2)"
_AT_LEAST_1 = (lambda v: v >= 1, ">= 1")
_POSITIVE = (lambda v: v > 0, "> 0")
_BUDGETS = ("budget_evals", "budget_minutes")  # may change between a run and its resume


@dataclass(frozen=True)
class SearchSettings:
    """How the search runs (the model, scale and target length are the caller's)."""

    population: int = setting(64, "candidates in the initial population (LongRoPE: 64)", check=_AT_LEAST_1,
                              metavar="N", group=GROUP)
    parents: int = setting(32, "the fittest candidates kept each generation (LongRoPE: 32)", check=_AT_LEAST_1,
                           metavar="N", group=GROUP)
    mutations: int = setting(16, "mutated children per generation (LongRoPE: 16)", check=(lambda v: v >= 0, ">= 0"),
                             metavar="N", group=GROUP)
    crossovers: int = setting(16, "crossover children per generation (LongRoPE: 16)",
                              check=(lambda v: v >= 0, ">= 0"), metavar="N", group=GROUP)
    step: float = setting(0.01, "grid step of a mutated factor (LongRoPE: 0.01)", check=_POSITIVE, metavar="X",
                          group=GROUP)
    max_factor: float | None = setting(None, "largest factor a pair may take; default 1.25 x the scale (LongRoPE)",
                                       check=(lambda v: v >= 1, ">= 1"), metavar="X", group=GROUP)
    keep_first: int = setting(0, "hold the first N rotary pairs (the fastest) at factor 1",
                              check=(lambda v: v >= 0, ">= 0"), metavar="N", group=GROUP)
    mutate_prob: float = setting(0.3, "probability that a mutation redraws a pair (LongRoPE: 0.3)",
                                 check=(lambda v: 0 < v <= 1, "> 0 and <= 1"), metavar="P", group=GROUP)
    crossover_tries: int = setting(20, "crossover scans before a mutation replaces it (LongRoPE: 20)",
                                   check=_AT_LEAST_1, metavar="N", group=GROUP)
    seed: int = setting(0, "seed of the search's random choices", metavar="N", group=GROUP)
    budget_evals: int | None = setting(None, "stop after N fitness evaluations in all (resumes included)",
                                       flag="--evals", check=_AT_LEAST_1, metavar="N", resume="ignore", group=GROUP)
    budget_minutes: float | None = setting(None, "stop after M minutes of search in all (resumes included; the "
                                                 "evaluation under way finishes)", flag="--budget", check=_POSITIVE,
                                           metavar="M", resume="ignore", group=GROUP)

    def __post_init__(self):
        if self.parents > self.population:
            raise InputError(f"parents ({self.parents}) must not exceed the population ({self.population})")
        if self.parents < 2 and self.crossovers:
            raise InputError("crossover needs at least 2 parents")
        if self.mutations + self.crossovers < 1:
            raise InputError("a generation needs at least one mutation or crossover")

    def check_budget(self) -> None:
        """InputError unless a budget is set (checked when a search starts, so the settings' defaults stand)."""
        if self.budget_evals is None and self.budget_minutes is None:
            raise InputError("the search needs a budget: --budget MINUTES and/or --evals N")

    def fixed(self) -> dict:
        """The settings a resumed search must share with the run it continues (all but the budgets)."""
        return {k: v for k, v in asdict(self).items() if k not in _BUDGETS}


def initial_factors(head_dim: int, base: float, scale: float, orig_ctx: int, *, yarn_alpha: float = 1.0,
                    yarn_beta: float = 32.0) -> dict[str, list[float]]:
    """PI, NTK and YaRN at ``scale`` as per-pair rescale factors theta_i / theta'_i (the registry's formulas): the
    seeds of the initial population (LongRoPE Sec 3.2, "optimized initial population")."""
    specs = {"pi": RopeSpec("pi", scale), "ntk": RopeSpec("ntk", scale),
             "yarn": RopeSpec("yarn", scale, orig_ctx=orig_ctx, yarn_alpha=yarn_alpha, yarn_beta=yarn_beta)}
    return {name: rescale_factors(spec, head_dim, base) for name, spec in specs.items()}


def factors_of(best: Sequence[float], attention_factor: float | None = None) -> LongRopeFactors:
    """The ``--longrope-factors`` content of a searched candidate: long_factor = it, short_factor = 1.0 per pair
    (plain RoPE within the original context; see the module doc). Write it with ``.to_json()``."""
    return LongRopeFactors([1.0] * len(best), list(best), attention_factor)


def is_monotone(f: Sequence[float]) -> bool:
    """Non-decreasing with the pair index (LongRoPE's constraint)."""
    return all(map(operator.le, f, itertools.islice(f, 1, None)))


# ---------------------------------------------------------------- the search
class _Search:
    """One run of the search (see module doc); :func:`run_search` drives it."""

    def __init__(self, fitness, init: dict[str, list[float]], settings: SearchSettings, scale: float, state, clock,
                 checkpoint, where):
        self.fitness, self.settings, self.clock, self.checkpoint = fitness, settings, clock, checkpoint
        self.scale = float(scale)
        self.pairs = len(next(iter(init.values())))
        self.max_factor = float(settings.max_factor if settings.max_factor is not None else 1.25 * self.scale)
        self.init = {k: self._legal(v) for k, v in init.items()}
        self.rng = random.Random(settings.seed)
        self.state = copy.deepcopy(state) if state is not None else self._fresh()  # the caller's stays as it was
        self._check_state(where)
        ck = self.state["checkpoint"]
        done = ck["evaluated"] if ck else 0
        self.evaluated = [(tuple(f), float(x)) for f, x in self.state["evaluated"]]  # the record, in order
        self.cache = dict(self.evaluated)  # fitness of every candidate ever evaluated (a replay reuses it)
        self.seen = {self._key(f) for f, _ in self.evaluated[:done]}  # LongRoPE's history, as of the checkpoint
        self.evaluated = self.evaluated[:done]
        self.record = [[list(f), x] for f, x in self.evaluated]  # the same, as the state holds it (JSON)
        self.curve = [c for c in self.state["curve"] if ck and c["generation"] <= ck["generation"]]
        self.elapsed0 = float(self.state["elapsed_s"])
        self.t0 = clock()

    # -------------------------------------------------------- state
    def _fresh(self) -> dict:
        return {"version": STATE_VERSION, "settings": self.settings.fixed(), "scale": self.scale,
                "pairs": self.pairs, "max_factor": self.max_factor, "init": self.init, "checkpoint": None,
                "evaluated": [], "curve": [], "elapsed_s": 0.0, "best": None, "done": False, "stopped_by": None}

    def _check_state(self, where) -> None:
        s = self.state
        if not isinstance(s, dict) or s.get("version") != STATE_VERSION:
            raise InputError(f"not a search state of version {STATE_VERSION}", where)
        want = {"settings": self.settings.fixed(), "scale": self.scale, "pairs": self.pairs,
                "max_factor": self.max_factor, "init": self.init}
        diffs = [k for k in want if _jsonish(s.get(k)) != _jsonish(want[k])]
        if diffs:
            raise InputError(f"the search state was made with other {', '.join(diffs)}: a resumed search takes the "
                             f"same settings (only the budget may change)", where)

    def _snapshot(self, generation: int, population) -> None:
        self.state["checkpoint"] = {"generation": generation, "rng": _rng_state(self.rng), "evaluated":
                                    len(self.evaluated), "population": [[list(f), x] for f, x in population]}

    def _publish(self, *, done: bool, stopped_by: str | None) -> dict:
        best = min(self.evaluated, key=lambda e: e[1]) if self.evaluated else None
        self.state.update(evaluated=self.record, curve=list(self.curve),
                          elapsed_s=self._elapsed(), done=done, stopped_by=stopped_by,
                          best=None if best is None else {"factors": list(best[0]), "fitness": best[1]})
        if self.checkpoint is not None:
            self.checkpoint(self.state)
        return self.state

    def _elapsed(self) -> float:
        return self.elapsed0 + (self.clock() - self.t0)

    # -------------------------------------------------------- candidates
    def _key(self, f) -> tuple:
        # exact: every value is a seed's or a grid value rounded when drawn (:meth:`_grid`), copied, never recomputed
        return tuple(f)

    def _legal(self, f: Sequence[float]) -> list[float]:
        """An initial candidate made legal: clipped to [1, max_factor], the first pairs held at 1, non-decreasing."""
        out, run = [], 1.0
        for i, x in enumerate(f):
            x = 1.0 if i < self.settings.keep_first else min(max(float(x), 1.0), self.max_factor)
            run = max(run, x)
            out.append(run)
        return out

    def _grid(self, lo: float, hi: float) -> float:
        """A random value on lo + k * step within [lo, hi]."""
        k = self.rng.randrange(int((hi - lo) / self.settings.step + 1e-9) + 1)
        return round(min(lo + k * self.settings.step, hi), 10)

    def _new(self, f) -> bool:
        return is_monotone(f) and self._key(f) not in self.seen

    def mutate(self, parent: Sequence[float]) -> list[float] | None:
        """Each free pair, with probability mutate_prob, redrawn between its neighbours; retried until new."""
        first = self.settings.keep_first
        for _ in range(100):
            f = list(parent)
            for i in range(first, self.pairs):
                if self.rng.random() < self.settings.mutate_prob:
                    lo = f[i - 1] if i > 0 else 1.0
                    hi = f[i + 1] if i + 1 < self.pairs else self.max_factor
                    f[i] = self._grid(lo, hi)
            if self._new(f):
                return f
        return None  # the neighbourhood is exhausted

    def crossover(self, a: Sequence[float], b: Sequence[float]) -> list[float] | None:
        """Pairs of ``b`` copied into ``a`` (each considered with probability mutate_prob, taken with 1/2) until the
        child is monotone and new; None after crossover_tries scans."""
        if self._key(a) == self._key(b):
            return None
        f = list(a)
        for _ in range(self.settings.crossover_tries):
            for i in range(self.pairs):
                if self.rng.random() < self.settings.mutate_prob and self.rng.random() < 0.5:
                    f[i] = b[i]
                    if self._new(f):
                        return f
        return None

    # -------------------------------------------------------- evaluation under the budget
    def _exhausted(self) -> str | None:
        s = self.settings
        if s.budget_evals is not None and len(self.evaluated) >= s.budget_evals:
            return "evaluations"
        if s.budget_minutes is not None and self._elapsed() >= 60.0 * s.budget_minutes:
            return "minutes"
        return None

    def evaluate(self, f: list[float]) -> tuple[tuple, float] | None:
        """(candidate, fitness), or None when the budget is spent (a replayed candidate costs nothing new)."""
        key = tuple(f)
        if key in self.cache:
            x = self.cache[key]
        else:
            if self._exhausted():
                return None
            x = float(self.fitness(key))
            x = math.inf if math.isnan(x) else x
            self.cache[key] = x
        self.seen.add(self._key(f))
        self.evaluated.append((key, x))
        self.record.append([list(f), x])
        return key, x

    def _record(self, generation: int, population, partial: bool = False) -> None:
        entry = {"generation": generation, "best": min(x for _, x in population), "evaluations": len(self.evaluated),
                 "elapsed_s": round(self._elapsed(), 3)}
        if partial:
            entry["partial"] = True
        self.curve.append(entry)

    # -------------------------------------------------------- the loop
    def initial(self) -> list | None:
        """Generation 0: the seeds, then mutations of random seeds up to the population size."""
        pop = []
        seeds = [list(f) for f in self.init.values()]
        for f in seeds:
            if self._key(f) in self.seen:
                continue
            e = self.evaluate(f)
            if e is None:
                return self._stop(0, pop, len(pop))
            pop.append(e)
        while len(pop) < self.settings.population:
            child = self.mutate(self.rng.choice(seeds))
            if child is None:
                break
            e = self.evaluate(child)
            if e is None:
                return self._stop(0, pop, len(pop))
            pop.append(e)
        return pop

    def generation(self, g: int, population: list) -> list | None:
        parents = sorted(population, key=lambda e: e[1])[:self.settings.parents]
        pop = list(parents)
        n_children = self.settings.mutations + self.settings.crossovers
        for j in range(n_children):
            if j < self.settings.mutations or len(parents) < 2:
                child = self.mutate(self.rng.choice(parents)[0])
            else:
                a, b = self.rng.sample(range(len(parents)), 2)
                a, b = sorted((a, b))
                child = self.crossover(parents[a][0], parents[b][0])
                if child is None:
                    child = self.mutate(parents[a][0])
            if child is None:
                continue
            e = self.evaluate(child)
            if e is None:
                return self._stop(g, pop, len(pop) - len(parents))
            pop.append(e)
        return pop

    def _stop(self, g: int, pop: list, new: int) -> None:
        """The budget ran out in generation ``g`` after ``new`` of its candidates: they count (a partial entry in
        the curve); the checkpoint stays at the last complete generation."""
        if new:
            self._record(g, pop, partial=True)
        self.stopped = self._exhausted()
        return None

    def run(self) -> dict:
        self.stopped = None
        ck = self.state["checkpoint"]
        if ck is None:
            pop = self.initial()
            if pop is None:
                return self._publish(done=True, stopped_by=self.stopped)
            if not pop:
                raise InputError("no candidate to evaluate: the seeds and their mutations are all the same")
            self._record(0, pop)
            self._snapshot(0, pop)
            self._publish(done=False, stopped_by=None)
            g = 1
        else:
            self.rng.setstate(_rng_from_json(ck["rng"]))
            pop = [(tuple(f), float(x)) for f, x in ck["population"]]
            g = ck["generation"] + 1
        while True:
            new = self.generation(g, pop)
            if new is None:
                return self._publish(done=True, stopped_by=self.stopped)
            pop = new
            self._record(g, pop)
            self._snapshot(g, pop)
            self._publish(done=False, stopped_by=None)
            if self._exhausted():
                return self._publish(done=True, stopped_by=self._exhausted())
            g += 1


def run_search(fitness: Callable[[tuple[float, ...]], float], init: Mapping[str, Sequence[float]],
               settings: SearchSettings, *, scale: float, state: dict | None = None,
               checkpoint: Callable[[dict], None] | None = None, clock: Callable[[], float] = time.monotonic,
               where=None) -> dict:
    """Search per-pair rescale factors minimising ``fitness`` (see module doc) from the seeds ``init`` (name ->
    factors, e.g. :func:`initial_factors`) at ``scale``; returns the final state (``best``: the fittest candidate
    and its fitness, ``curve``: the best fitness per generation, ``evaluated``: every candidate with its fitness).
    ``state``: a state an earlier call returned or checkpointed, to continue it (the same settings but the budget,
    else an InputError naming ``where``); ``checkpoint(state)`` is called after every generation and at the end."""
    settings.check_budget()
    if not init:
        raise ValueError("the search needs at least one initial candidate")
    sizes = {len(v) for v in init.values()}
    if len(sizes) != 1:
        raise ValueError(f"initial candidates of different lengths: {sorted(sizes)}")
    n = sizes.pop()
    if settings.keep_first >= n:
        raise InputError(f"keep_first {settings.keep_first} leaves no pair to search (the model has {n})")
    init = {k: [float(x) for x in v] for k, v in init.items()}
    return _Search(fitness, init, settings, scale, state, clock, checkpoint, where).run()


# ---------------------------------------------------------------- JSON helpers
def _rng_state(rng: random.Random) -> list:
    v, internal, gauss = rng.getstate()
    return [v, list(internal), gauss]


def _rng_from_json(s) -> tuple:
    return (s[0], tuple(s[1]), s[2])


def _jsonish(v):
    """``v`` as JSON would give it back (tuples as lists), so a state read from a file compares with a fresh one."""
    if isinstance(v, dict):
        return {str(k): _jsonish(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonish(x) for x in v]
    return v


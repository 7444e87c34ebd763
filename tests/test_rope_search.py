"""The LongRoPE-style search core (rope_scaling.search), model-free: a toy fitness with a known monotone optimum,
the constraints on every candidate, determinism per seed, the budget, and resume == uninterrupted."""
from __future__ import annotations

import copy
import json
import math

import pytest

from rope_scaling import InputError, RopeSpec
from rope_scaling.formulas import frequencies
from rope_scaling.search import SearchSettings, factors_of, initial_factors, is_monotone, run_search
from rope_scaling.spec import read_longrope_factors

N = 8  # rotary pairs (head_dim 16, the tiny test models)
# the optimum: 1 for the first quarter, a ramp to 5, flat at 5 -- monotone, on the 0.01 grid, and far from every
# seed (PI x8 is 8 everywhere, NTK and YaRN rise to 8)
TARGET = [1.0, 1.0, 1.0, 2.0, 3.0, 4.0, 5.0, 5.0]
SMALL = dict(population=16, parents=8, mutations=12, crossovers=4)  # LongRoPE's proportions, a quarter the size


def mse(f):
    return sum((a - b) ** 2 for a, b in zip(f, TARGET)) / N


def seeds():
    return initial_factors(2 * N, 10000.0, 8.0, 64)


def run(budget=600, seed=0, fitness=mse, **kw):
    return run_search(fitness, seeds(), SearchSettings(seed=seed, budget_evals=budget, **{**SMALL, **kw}), scale=8.0)


def timeless(state):
    """A state without its clock readings (the only thing two runs of one search may differ in)."""
    s = json.loads(json.dumps(state))
    s.pop("elapsed_s")
    for c in s["curve"]:
        c.pop("elapsed_s")
    return s


def test_the_seeds_are_pi_ntk_and_yarn_at_the_scale():
    got = seeds()
    assert got["pi"] == pytest.approx([8.0] * N)
    assert got["ntk"] == pytest.approx([8 ** (2 * i / 14) for i in range(N)])  # b' = b 8^(16/14): 8^(2i/(d-2))
    # YaRN x8 at L 64, d 16, b 1e4: ramp floor(i(32)) = 0 .. ceil(i(1)) = ceil(16 ln(64/2pi) / (2 ln 1e4)) = 3:
    # pair 0 kept, pairs 1-2 blended (1 / (g/8 + 1 - g), g = 1/3, 2/3), pairs 3-7 divided by 8
    assert got["yarn"] == pytest.approx([1.0, 1 / (1 / 24 + 2 / 3), 1 / (2 / 24 + 1 / 3), 8, 8, 8, 8, 8])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_known_optimum_is_reached(seed):
    st = run(budget=3000, seed=seed)
    best = st["best"]["factors"]
    assert min(mse(f) for f in seeds().values()) > 1.0  # no seed is near it
    assert max(abs(a - b) for a, b in zip(best, TARGET)) <= 0.1  # within 0.1 of every pair in 3,000 evaluations
    assert st["best"]["fitness"] == pytest.approx(mse(best)) and st["best"]["fitness"] < 2e-3
    assert len(st["evaluated"]) == 3000 and st["done"] and st["stopped_by"] == "evaluations"
    curve = [c["best"] for c in st["curve"]]
    assert curve == sorted(curve, reverse=True) and curve[0] > 100 * curve[-1]  # the parents survive: never worse
    assert [c["generation"] for c in st["curve"]] == list(range(len(curve)))


def test_every_candidate_is_legal_and_new():
    st = run(budget=800, keep_first=2, max_factor=6.0)
    cands = [tuple(f) for f, _ in st["evaluated"]]
    assert len(set(cands)) == len(cands)  # never proposed twice (LongRoPE's history)
    for f in cands:
        assert is_monotone(f) and f[0] == f[1] == 1.0 and all(1.0 <= x <= 6.0 for x in f)
    # the seeds come first, made legal: PI x8 clipped to 6, the first two pairs held at 1
    assert cands[0] == (1.0, 1.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0)


def test_deterministic_per_seed():
    a, b, c = run(seed=7), run(seed=7), run(seed=8)
    assert timeless(a) == timeless(b)
    assert [f for f, _ in a["evaluated"]] != [f for f, _ in c["evaluated"]]


class Interrupted(Exception):
    pass


def interrupted_run(budget, stop_after, **kw):
    """Run until the fitness is called ``stop_after`` times (then the process 'dies'); returns the last state the
    checkpoint saw, as a file would hold it."""
    saved, calls = [None], [0]

    def fitness(f):
        calls[0] += 1
        if calls[0] > stop_after:
            raise Interrupted
        return mse(f)

    with pytest.raises(Interrupted):
        run_search(fitness, seeds(), SearchSettings(seed=3, budget_evals=budget, **{**SMALL, **kw}), scale=8.0,
                   checkpoint=lambda s: saved.__setitem__(0, json.dumps(s)))
    return json.loads(saved[0])


@pytest.mark.parametrize("stop_after", [16, 17, 50, 299])  # at a generation's end, just after, mid-way, at the last
def test_resume_equals_uninterrupted(stop_after):
    whole = run_search(mse, seeds(), SearchSettings(seed=3, budget_evals=300, **SMALL), scale=8.0)
    state = interrupted_run(300, stop_after)
    assert not state["done"] and state["checkpoint"]["generation"] >= 0
    calls = [0]

    def counting(f):
        calls[0] += 1
        return mse(f)

    resumed = run_search(counting, seeds(), SearchSettings(seed=3, budget_evals=300, **SMALL), scale=8.0,
                         state=state)
    assert timeless(resumed) == timeless(whole)
    assert calls[0] == 300 - state["checkpoint"]["evaluated"]  # only what the checkpoint had not: no re-evaluation


def test_a_finished_search_continues_with_a_larger_budget():
    short = run_search(mse, seeds(), SearchSettings(seed=4, budget_evals=150, **SMALL), scale=8.0)
    assert short["done"] and short["curve"][-1].get("partial")  # 150 ends inside a generation
    again = run_search(mse, seeds(), SearchSettings(seed=4, budget_evals=150, **SMALL), scale=8.0,
                       state=copy.deepcopy(short))
    assert timeless(again) == timeless(short)  # the same budget again: nothing more to do
    longer = run_search(mse, seeds(), SearchSettings(seed=4, budget_evals=400, **SMALL), scale=8.0,
                        state=json.loads(json.dumps(short)))
    whole = run_search(mse, seeds(), SearchSettings(seed=4, budget_evals=400, **SMALL), scale=8.0)
    assert timeless(longer) == timeless(whole)


def test_resume_refuses_other_settings():
    st = run(budget=100)
    with pytest.raises(InputError, match="state.json: the search state was made with other settings"):
        run_search(mse, seeds(), SearchSettings(seed=1, budget_evals=100, **SMALL), scale=8.0, state=st,
                   where="state.json")
    with pytest.raises(InputError, match="other scale"):
        run_search(mse, seeds(), SearchSettings(seed=0, budget_evals=100, **SMALL), scale=4.0, state=st)


def test_budget_in_minutes():
    now = [0.0]

    def slow(f):  # every evaluation takes one (fake) second
        now[0] += 1.0
        return mse(f)

    st = run_search(slow, seeds(), SearchSettings(budget_minutes=1.0, **SMALL), scale=8.0, clock=lambda: now[0])
    assert st["stopped_by"] == "minutes" and len(st["evaluated"]) == 60 and st["elapsed_s"] == 60.0


def test_nan_fitness_is_the_worst():
    st = run(budget=60, fitness=lambda f: math.nan if f[-1] > 7 else mse(f))
    assert st["best"]["factors"][-1] <= 7 and math.isfinite(st["best"]["fitness"])


@pytest.mark.parametrize("kw,words", [
    (dict(parents=20), "must not exceed the population"),
    (dict(mutations=0, crossovers=0), "at least one mutation or crossover"),
])
def test_bad_settings(kw, words):
    with pytest.raises(InputError, match=words):
        SearchSettings(**{**SMALL, "budget_evals": 10, **kw})


def test_a_search_needs_a_budget():
    with pytest.raises(InputError, match=r"needs a budget: --budget MINUTES and/or --evals N"):
        run_search(mse, seeds(), SearchSettings(**SMALL), scale=8.0)


def test_the_result_is_a_longrope_factor_file(tmp_path):
    st = run(budget=200)
    f = factors_of(st["best"]["factors"])
    p = tmp_path / "factors.json"
    p.write_text(json.dumps(f.to_json()))
    back = read_longrope_factors(p, rotary_dim=2 * N, monotone=True)
    assert back == f and back.short_factor == (1.0,) * N and back.attention_factor is None
    spec = RopeSpec("longrope", 8, orig_ctx=64, longrope_factors=back)
    theta = frequencies(RopeSpec(), 2 * N, 10000.0).inv_freq
    assert frequencies(spec, 2 * N, 10000.0, 65).inv_freq == pytest.approx(
        [t / x for t, x in zip(theta, st["best"]["factors"])])
    assert frequencies(spec, 2 * N, 10000.0, 64).inv_freq == pytest.approx(theta)  # short: plain RoPE

"""From the collected runs to the readings, one path for every experiment (the statistics floor,
``ropescale/common/stats``):

- a cell (a row at one length in one seed): :func:`~ropescale.common.stats.means.cell_of_prompts` over the row's arms
  (a sample scored by several arms counted once: n = distinct sample ids; the percentile bootstrap from 8 samples,
  the t interval below);
- a cell of a proportion (``score: kind: proportion``, scores 0 / 1): k of n trials over the row's arms, Wilson's
  interval (:func:`~ropescale.common.stats.proportions.wilson`; never [0, 0] for 0 of n), in percent;
- a cell over seeds: :func:`~ropescale.common.stats.means.over_seeds` (the t interval over the seeds' cells, the seed
  the unit; the seeds' range beside it);
- a comparison a - b (one seed): :func:`~ropescale.common.stats.tests.paired_sign_flip` over the sample ids both rows
  have (each id's mean over a row's arms), its interval the mean difference's; over seeds:
  :func:`~ropescale.common.stats.tests.t_over_seeds` of the seeds' differences;
- each declared family's tests (its pairs x lengths) get their Benjamini-Hochberg q
  (:func:`~ropescale.common.stats.multiplicity.family`); a test is resolved only at q < 0.05.
"""
from __future__ import annotations

from .spec import Experiment


def groups(exp: Experiment, data: dict, series: str, seed: int, length: int) -> list | None:
    """The per-sample scores of a row's arms in one seed and length; None unless every arm of it has them."""
    out = [data.get(a, {}).get(seed, {}).get(length) for a in exp.members(series)]
    return None if any(g is None for g in out) else out


def per_id(gs: list) -> dict:
    """{id: the mean of its scores over the groups that have it} (the unit two rows pair on)."""
    ids = sorted({i for g in gs for i in g}, key=lambda i: (0, int(i), "") if i.isdigit() else (1, 0, i))
    return {i: sum(g[i] for g in gs if i in g) / sum(1 for g in gs if i in g) for i in ids}


def shown(exp: Experiment, data: dict) -> list[str]:
    """The table's rows whose every arm has runs."""
    return [s for s in exp.table if all(a in exp.arms for a in exp.members(s))
            and all(a in data for a in exp.members(s))]


def proportion_cell(gs: list):
    """k of n trials (every score of the row's arms, 0 or 100) with Wilson's interval, in percent."""
    from ropescale.common.stats.means import Estimate
    from ropescale.common.stats.proportions import wilson

    x = [v for g in gs for v in g.values()]
    if not x:
        return Estimate(None, 0, rule="Wilson", unit="trial")
    w = wilson(round(sum(x) / 100), len(x))
    return Estimate(100 * w.rate, len(x), None, 100 * w.lo, 100 * w.hi, rule=w.rule, unit="trial")


def seed_results(exp: Experiment, data: dict, seed: int) -> dict:
    """One seed: {"cells": {row: {length: Estimate}}, "families": {family: [(a, b, length, Significance)]}}."""
    from ropescale.common.stats.means import cell_of_prompts
    from ropescale.common.stats.multiplicity import family
    from ropescale.common.stats.tests import paired_sign_flip

    cells = {}
    for s in shown(exp, data):
        row = {}
        for t in exp.lengths:
            gs = groups(exp, data, s, seed, t)
            if gs is not None:
                row[t] = proportion_cell(gs) if exp.score.kind == "proportion" else cell_of_prompts(gs)
        cells[s] = row
    fams = {}
    for fam, pairs in exp.families.items():
        tests = {}
        for a, b in pairs:
            for t in exp.lengths:
                ga, gb = groups(exp, data, a, seed, t), groups(exp, data, b, seed, t)
                if ga is not None and gb is not None:
                    tests[a, b, t] = paired_sign_flip(per_id(ga), per_id(gb))
        if tests:
            fams[fam] = [(a, b, t, sig) for (a, b, t), sig in family(tests).items()]
    return {"cells": cells, "families": fams}


def pooled_results(exp: Experiment, data: dict, seeds) -> dict:
    """Over the seeds that have the cell: the same shape as :func:`seed_results`, cells by the t over seeds,
    comparisons by the t test of the seeds' differences (unit: seed)."""
    from ropescale.common.stats.means import over_seeds
    from ropescale.common.stats.multiplicity import family
    from ropescale.common.stats.tests import paired_sign_flip, t_over_seeds

    cells = {}
    for s in shown(exp, data):
        row = {}
        for t in exp.lengths:
            by_seed = {sd: gs for sd in seeds if (gs := groups(exp, data, s, sd, t)) is not None}
            if by_seed:
                row[t] = over_seeds(by_seed)
        cells[s] = row
    fams = {}
    for fam, pairs in exp.families.items():
        tests = {}
        for a, b in pairs:
            for t in exp.lengths:
                diffs = []
                for sd in seeds:
                    ga, gb = groups(exp, data, a, sd, t), groups(exp, data, b, sd, t)
                    if ga is not None and gb is not None:
                        diffs.append(paired_sign_flip(per_id(ga), per_id(gb)).statistic)
                if len(diffs) >= 2:
                    tests[a, b, t] = t_over_seeds(diffs)
        if tests:
            fams[fam] = [(a, b, t, sig) for (a, b, t), sig in family(tests).items()]
    return {"cells": cells, "families": fams}


def results(exp: Experiment, data: dict, seeds) -> dict:
    """{"seeds": {seed: seed_results}, "pooled": pooled_results or None (one seed)}."""
    have = [s for s in seeds if any(s in by for by in data.values())]
    return {"seeds": {s: seed_results(exp, data, s) for s in have},
            "pooled": pooled_results(exp, data, have) if len(have) > 1 else None}


def to_json(res: dict) -> dict:
    """The results as plain JSON (results.json)."""
    def part(r):
        return {"cells": {s: {f"T{t}": e.to_dict() for t, e in row.items()} for s, row in r["cells"].items()},
                "families": {f: [{"a": a, "b": b, "length": t, **sig.to_dict()} for a, b, t, sig in tests]
                             for f, tests in r["families"].items()}}

    return {"seeds": {str(s): part(r) for s, r in res["seeds"].items()},
            "pooled": None if res["pooled"] is None else part(res["pooled"])}

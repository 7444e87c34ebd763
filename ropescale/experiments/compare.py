"""From the collected runs to the readings, one path for every experiment (the statistics floor,
``ropescale/common/stats``):

- a cell (a row at one length in one seed): :func:`~ropescale.common.stats.means.cell_of_prompts` over the row's arms
  (a sample scored by several arms counted once: n = distinct sample ids; Student's t interval; a score with a
  ``range``: clipped to it, Wilson's of the share where the samples agree);
- a cell of a proportion (``score: kind: proportion``, scores 0 / 1): k of n trials of the row's arm, Wilson's
  interval (:func:`~ropescale.common.stats.proportions.wilson`; never [0, 0] for 0 of n), in percent; a row pooling
  several arms: each sample's share over them read as a mean in [0, 100] (each sample once);
- a cell over seeds: :func:`~ropescale.common.stats.means.over_seeds` (the t interval over the seeds' cells, the seed
  the unit; the seeds' range beside it);
- a comparison a - b (one seed): :func:`~ropescale.common.stats.tests.paired_sign_flip` over the sample ids both rows
  have (each id's mean over a row's arms), its interval the mean difference's; over seeds:
  :func:`~ropescale.common.stats.tests.t_over_seeds` of the seeds' differences;
- a row's MSE(P-IE vs P-IB) (a family's ``mse:`` pairs): one test a row and seed over its lengths,
  :func:`~ropescale.common.stats.tests.mse_sign_flip` (its p, P(MSE >= 5) under no prompt effect);
- a - b within ids (a family's ``within: [lo, hi]``): each id's differences over the lengths lo <= L < hi (a
  window's buckets) averaged, t over the ids (:func:`~ropescale.common.stats.tests.t_over_windows`: the window the
  block, since its buckets are correlated); one test a pair, per seed;
- a row against its own baseline (a family's ``baseline: [lo, hi]``): each id's score at a length minus its mean
  over the lengths lo <= L < hi of the same row, the same paired tests, at the lengths outside [lo, hi) only (a
  length inside would be tested against itself: it is no test and no part of the family's count);
- every cell and test names its unit (the score's ``unit``: sample, window; a proportion's cell: trial), a
  test its smallest attainable p (2 / 2^n for the sign-flip over n units);
- each score is read on its own (its cells, its families); each declared family's tests (its pairs x lengths) get
  their Benjamini-Hochberg q
  (:func:`~ropescale.common.stats.multiplicity.family`); a test is resolved only at q < 0.05.
"""
from __future__ import annotations

from dataclasses import replace

from .spec import Experiment, Family, Score


def groups(exp: Experiment, data: dict, series: str, seed: int, length: int) -> list | None:
    """The per-sample scores of a row's arms in one seed and length (``data``: one score's); None unless every
    arm of it has them."""
    out = [data.get(a, {}).get(seed, {}).get(length) for a in exp.members(series)]
    return None if any(g is None for g in out) else out


def per_id(gs: list) -> dict:
    """{id: the mean of its scores over the groups that have it} (the unit two rows pair on)."""
    ids = sorted({i for g in gs for i in g}, key=lambda i: (0, int(i), "") if i.isdigit() else (1, 0, i))
    return {i: sum(g[i] for g in gs if i in g) / sum(1 for g in gs if i in g) for i in ids}


def shown(exp: Experiment, sc: Score, data: dict) -> list[str]:
    """The score's rows whose every arm has runs."""
    return [s for s in exp.rows_of(sc) if all(a in exp.arms and a in data for a in exp.members(s))]


def columns(exp: Experiment, sc: Score, data: dict) -> list[int]:
    """The lengths a score's table shows: the experiment's, or (a score whose records carry their length) every
    length its shown rows' runs hold."""
    if sc.length is None and all(exp.arms[a].per_length for s in shown(exp, sc, data) for a in exp.members(s)):
        return list(exp.lengths)
    return sorted({t for s in shown(exp, sc, data) for a in exp.members(s) for by in data[a].values() for t in by})


def proportion_cell(gs: list):
    """k of n trials (every score of one arm, 0 or 100) with Wilson's interval, in percent."""
    from ropescale.common.stats.means import Estimate
    from ropescale.common.stats.proportions import wilson

    x = [v for g in gs for v in g.values()]
    if not x:
        return Estimate(None, 0, rule="Wilson", unit="trial")
    w = wilson(round(sum(x) / 100), len(x))
    return Estimate(100 * w.rate, len(x), None, 100 * w.lo, 100 * w.hi, rule=w.rule, unit="trial")


def seed_cell(sc: Score, gs: list):
    """One seed's cell: a proportion's Wilson (one arm), else :func:`~ropescale.common.stats.means.cell_of_prompts`
    (a proportion's row pooling several arms: each sample's mean over them, a share, read as a mean in [0, 100]: k
    of n over every arm's score would count a sample twice), its unit the score's."""
    from ropescale.common.stats.means import cell_of_prompts

    if sc.kind == "proportion" and len(gs) == 1:
        return proportion_cell(gs)
    bounds = (0.0, 100.0) if sc.kind == "proportion" else sc.range
    return replace(cell_of_prompts(gs, bounds=bounds), unit=sc.unit)


def sides(exp: Experiment, data: dict, fam: Family, item: tuple, seed: int, t: int, cols: list) -> tuple | None:
    """({id: a}, {id: b}) of one comparison at one seed and length: two rows' per-id means, or a row and its own
    mean over the baseline's lengths (the ids that have every one of them); None when a side has no runs."""
    a, b = item
    ga = groups(exp, data, a, seed, t)
    if ga is None:
        return None
    if fam.baseline is None:
        gb = groups(exp, data, b, seed, t)
        return None if gb is None else (per_id(ga), per_id(gb))
    lo, hi = fam.baseline
    ref = [g for c in cols if lo <= c < hi and (g := groups(exp, data, a, seed, c)) is not None]
    if not ref:
        return None
    maps = [per_id(g) for g in ref]
    ids = [i for i in maps[0] if all(i in m for m in maps)]
    return per_id(ga), {i: sum(m[i] for m in maps) / len(maps) for i in ids}


def part(exp: Experiment, sc: Score, data: dict, cell, test) -> dict:
    """{"cells": {row: {length: cell(row, length)}}, "families": {family: [(a, b, length, Significance)]}} of one
    score; ``cell`` / ``test`` give None where there is nothing to read."""
    from ropescale.common.stats.multiplicity import family

    cols = columns(exp, sc, data)
    cells = {s: {t: e for t in cols if (e := cell(s, t)) is not None} for s in shown(exp, sc, data)}
    fams = {}
    for name, fam in exp.families.items():
        if fam.score != sc.key:
            continue
        at = [None] if fam.mse or fam.within else cols  # an MSE or within test reads its lengths at once
        if fam.baseline is not None:  # a column inside the baseline would be tested against (part of) itself
            at = [t for t in at if not fam.baseline[0] <= t < fam.baseline[1]]
        tests = {(a, b, t): sig for a, b in fam.items() for t in at
                 if (sig := test(fam, (a, b), t, cols)) is not None}
        if tests:
            fams[name] = [(a, b, t, sig) for (a, b, t), sig in family(tests).items()]
    return {"cells": cells, "families": fams, "columns": cols}


def seed_results(exp: Experiment, sc: Score, data: dict, seed: int) -> dict:
    """One seed: cells by :func:`seed_cell`, comparisons by the paired sign-flip over the ids both sides have."""
    from ropescale.common.stats.tests import paired_sign_flip

    def cell(s, t):
        gs = groups(exp, data, s, seed, t)
        return None if gs is None else seed_cell(sc, gs)

    def test(fam, item, t, cols):
        if fam.mse:
            return mse_test(exp, data, item, seed, cols)
        if fam.within:
            return within_test(exp, data, item, seed, [c for c in cols if fam.within[0] <= c < fam.within[1]])
        two = sides(exp, data, fam, item, seed, t, cols)
        return None if two is None else paired_sign_flip(*two, unit=sc.unit)

    return part(exp, sc, data, cell, test)


def mse_test(exp: Experiment, data: dict, item: tuple, seed: int, cols: list):
    """A row's MSE(P-IE vs P-IB) over the lengths both its arms have, with its sign-flip permutation p and
    P(MSE >= 5) under no prompt effect (:func:`~ropescale.common.stats.tests.mse_sign_flip`, CNNSum Table 2);
    None without a length."""
    from ropescale.common.stats.tests import mse_sign_flip

    cells = {t: (per_id(ga), per_id(gb)) for t in cols if (ga := groups(exp, data, item[0], seed, t)) is not None
             and (gb := groups(exp, data, item[1], seed, t)) is not None}
    return mse_sign_flip(cells) if cells else None


def within_test(exp: Experiment, data: dict, item: tuple, seed: int, cols: list):
    """a - b over the lengths ``cols`` within each id both rows have at one of them (a loss curve's buckets within
    each window), the id the block: :func:`~ropescale.common.stats.tests.t_over_windows` (t over the ids' mean
    differences); None without a length both rows have."""
    from ropescale.common.stats.tests import t_over_windows

    by_id: dict = {}
    for t in cols:
        ga, gb = groups(exp, data, item[0], seed, t), groups(exp, data, item[1], seed, t)
        if ga is None or gb is None:
            continue
        a, b = per_id(ga), per_id(gb)
        for i in a:
            if i in b:
                by_id.setdefault(i, []).append(a[i] - b[i])
    if not by_id:
        return None
    ids = sorted(by_id, key=lambda i: (0, int(i), "") if i.isdigit() else (1, 0, i))
    return t_over_windows([by_id[i] for i in ids])


def pooled_results(exp: Experiment, sc: Score, data: dict, seeds) -> dict:
    """Over the seeds that have the cell: cells by the t over seeds, comparisons by the t test of the seeds'
    differences (unit: seed)."""
    from ropescale.common.stats.means import over_seeds
    from ropescale.common.stats.tests import paired_sign_flip, t_over_seeds

    def cell(s, t):
        by_seed = {sd: gs for sd in seeds if (gs := groups(exp, data, s, sd, t)) is not None}
        return over_seeds(by_seed, bounds=sc.range) if by_seed else None

    def test(fam, item, t, cols):
        if fam.mse or fam.within:  # a row's MSE, a within test: read per seed; over seeds nothing is tested
            return None
        diffs = [paired_sign_flip(*two).statistic for sd in seeds
                 if (two := sides(exp, data, fam, item, sd, t, cols)) is not None]
        return t_over_seeds(diffs) if len(diffs) >= 2 else None

    return part(exp, sc, data, cell, test)


def results(exp: Experiment, data: dict, seeds, facts: dict | None = None) -> dict:
    """{"scores": {score: {"seeds": {seed: part}, "pooled": part or None (one seed)}}, "facts": {row: {fact:
    [values]}}} (``data``: :func:`.collect.collect`'s, ``facts``: :func:`.collect.facts`')."""
    out = {}
    for k, sc in exp.scores.items():
        d = data.get(k, {})
        have = [s for s in seeds if any(s in by for by in d.values())]
        out[k] = {"seeds": {s: seed_results(exp, sc, d, s) for s in have},
                  "pooled": pooled_results(exp, sc, d, have) if len(have) > 1 else None}
    return {"scores": out, "facts": row_facts(exp, facts or {})}


def row_facts(exp: Experiment, facts: dict) -> dict:
    """{row: {fact: [values of its arms' runs]}} of every row (an arm or a pool) whose arms have facts."""
    out: dict = {}
    for s in dict.fromkeys([*exp.table, *(x for sc in exp.scores.values() for x in sc.table)]):
        for a in exp.members(s):
            for name, vals in facts.get(a, {}).items():
                seen = out.setdefault(s, {}).setdefault(name, [])
                seen += [v for v in vals if v not in seen]
    return out


def to_json(exp: Experiment, res: dict) -> dict:
    """The results as plain JSON (results.json): per score its name, kind, unit and columns, its cells and tests
    (each with its rule, unit, n, smallest attainable p and BH q), and the rows' facts."""
    def part_json(sc: Score, r):
        return {"cells": {s: {f"{sc.column}{t}": e.to_dict() for t, e in row.items()} for s, row in r["cells"].items()},
                "families": {f: [{"a": a, "b": b, "length": t, **sig.to_dict()} for a, b, t, sig in tests]
                             for f, tests in r["families"].items()}}

    out = {}
    for k, r in res["scores"].items():
        sc = exp.scores[k]
        out[k] = {"name": sc.name, "kind": sc.kind, "unit": sc.unit,
                  "seeds": {str(s): part_json(sc, x) for s, x in r["seeds"].items()},
                  "pooled": None if r["pooled"] is None else part_json(sc, r["pooled"])}
    return {"scores": out, "facts": res["facts"]}

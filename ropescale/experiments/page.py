"""An experiment's page: the table of cells with their intervals (per seed, and over seeds when there are several),
each family's comparisons with p and BH q, the command that made it, the machine and the wall time, and a reading
section below :data:`READING` that a re-run keeps."""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from ropescale.common.tables import markdown

from .spec import Experiment, Score

READING = "<!-- reading: python -m ropescale.experiments keeps what follows this line -->"


def machine() -> str:
    """The machine in words: CPU count, platform, Python."""
    return f"{os.cpu_count()} CPU cores, {platform.platform(terse=True)}, Python {platform.python_version()}"


def test_text(sig, nd: int = 1) -> str:
    """``+1.2 [-0.3, +2.5] p=0.25 q=0.31`` (the mean difference, its interval, p, BH q in the family; ``nd``
    decimals)."""
    from ropescale.common.stats.tests import p_text

    if sig.statistic is None:
        return "-"
    if sig.p is None and sig.extra.get("sd") == 0:
        return f"{sig.statistic:+.{nd}f} (no spread measured)"
    ci = "" if sig.lo is None else f" [{sig.lo:+.{nd}f}, {sig.hi:+.{nd}f}]"
    p = "" if sig.p is None else f" p={p_text(sig.p)}" + ("" if sig.q is None else f" q={p_text(sig.q)}")
    return f"{sig.statistic:+.{nd}f}{ci}{p}"


def fact_text(vals: list) -> str:
    return " / ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in vals) or "-"


def cells_table(exp: Experiment, sc: Score, part: dict, facts: dict) -> str:
    cols = part["columns"]
    names = list(dict.fromkeys(n for s in part["cells"] for n in facts.get(s, {})))
    rows = [[f"{exp.label(s)} ({s})", *[row[t].text(sc.digits) if t in row else "-" for t in cols],
             *[fact_text(facts.get(s, {}).get(n, [])) for n in names]] for s, row in part["cells"].items()]
    est = [e for row in part["cells"].values() for e in row.values() if e.mean is not None]
    ns = sorted({e.n for e in est})
    rules = sorted({f"{e.rule} over {e.unit}s" for e in est})
    if est and est[0].unit == "seed":
        note = (f"{'/'.join(str(x) for x in sorted({e.seeds for e in est}))} seeds a cell (the unit; n = "
                f"{'/'.join(map(str, ns))} {sc.unit}s in all); 95% interval: t over the seeds' cells, (min-max) their "
                f"range")
    elif est and est[0].unit == "trial":
        note = (f"n = {'/'.join(map(str, ns))} trials a cell (every score of the row's arms), percent; 95% interval: "
                f"{', '.join(rules)}")
    else:
        note = (f"n = {'/'.join(map(str, ns)) or '-'} a cell (distinct {sc.unit}s; a row averaging several arms "
                f"counts a {sc.unit} once); 95% interval: {', '.join(rules) or '-'}")
    if names:
        note += f"; beside the cells: {', '.join(names)} (the arms' run.json)"
    missing = [s for s in exp.rows_of(sc) if s not in part["cells"] and all(a in exp.arms for a in exp.members(s))]
    if missing:
        note += f"; not run (no runs of every arm in this work directory): {', '.join(missing)}"
    return markdown(["row", *[f"{sc.column}{t}" for t in cols], *names], rows) + "\n\n" + note + "."


def family_count(sigs: list) -> str:
    """``5 of 25 at p < 0.05 (1.2 by chance; binomial p = 0.0072)``: how many of a family's tests reach p < 0.05
    against the count with no effect anywhere, P(X >= k) for X ~ Binomial(m, 0.05) (tests taken as independent; a
    discrete p reaches 0.05 at most that often, so the count's p is conservative). It reads "some effect in the
    family", never which test."""
    from ropescale.common.stats.distributions import ALPHA, binomial_sf
    from ropescale.common.stats.tests import p_text

    k, m = sum(sig.p < ALPHA for sig in sigs), len(sigs)
    return (f"{k} of {m} at p < 0.05 ({ALPHA * m:.1f} by chance; binomial p = {p_text(binomial_sf(k, m, ALPHA))}: "
            f"some effect in the family, not which)")


def mse_table(exp: Experiment, sc: Score, name: str, tests: list) -> str:
    """A family of MSE(P-IE vs P-IB) tests: a row a test, over its lengths."""
    from ropescale.common.stats.tests import p_text

    rows = [[f"{a} vs {b}", "-" if sig.statistic is None else f"{sig.statistic:.2f}",
             "-" if "null_mean" not in sig.extra else f"{sig.extra['null_mean']:.2f}", p_text(sig.p), p_text(sig.q),
             "-" if "p_red" not in sig.extra else f"{sig.extra['p_red']:.2f}"] for a, b, _, sig in tests]
    sigs = [sig for *_, sig in tests if sig.p is not None]
    note = (f"MSE: the mean over a row's lengths of (mean IE - mean IB)^2 (CNNSum Table 2); p: the IE / IB labels of "
            f"every {sc.unit} flipped at random (MSE sign-flip permutation; smallest attainable p "
            f"{', '.join(sorted({f'{s.min_p:.2g}' for s in sigs if s.min_p is not None})) or '-'}); null mean: the "
            f"MSE expected with no prompt effect; P(MSE >= 5): the chance such a row reaches the paper's red mark; q: "
            f"Benjamini-Hochberg over this family's {len(sigs)} tests.")
    return (f"Family **{name}** ({sc.name}): MSE(P-IE vs P-IB)\n\n"
            + markdown(["row", "MSE", "null mean", "p", "q", "P(MSE >= 5)"], rows) + "\n\n" + note)


def family_table(exp: Experiment, sc: Score, name: str, tests: list, cols: list) -> str:
    fam = exp.families[name]
    if fam.mse:
        return mse_table(exp, sc, name, tests)
    if fam.within:
        return within_table(sc, name, fam, tests)
    if fam.baseline is not None:  # the baseline's own lengths are not tested
        cols = [t for t in cols if not fam.baseline[0] <= t < fam.baseline[1]]
    by_pair: dict = {}
    for a, b, t, sig in tests:
        by_pair.setdefault((a, b), {})[t] = sig
    rows = [[f"{a} - {b}", *[test_text(row[t], sc.digits) if t in row else "-" for t in cols]]
            for (a, b), row in by_pair.items()]
    sigs = [sig for *_, sig in tests if sig.p is not None]
    unit = sigs[0].unit if sigs else sc.unit
    min_ps = sorted({sig.min_p for sig in sigs if sig.min_p is not None})
    resolved = sum(sig.resolved for sig in sigs)
    kind = ("t test over the seeds' differences" if unit == "seed"
            else f"paired sign-flip permutation over the {unit}s both sides have")
    base = "" if fam.baseline is None else (f"; ROW[{fam.baseline[0]}:{fam.baseline[1]}]: the row's own mean over "
                                            f"{sc.column}{fam.baseline[0]} <= L < {sc.column}{fam.baseline[1]}, "
                                            f"the same {sc.unit}s")
    note = (f"{kind} (unit: {unit}; smallest attainable p {', '.join(f'{p:.2g}' for p in min_ps) or '-'}); "
            f"q: Benjamini-Hochberg over this family's {len(sigs)} tests; {resolved} resolved at q < 0.05; "
            f"{family_count(sigs)}{base}")
    flat = sum(1 for *_, sig in tests if sig.p is None and sig.statistic is not None and sig.extra.get("sd") == 0)
    if flat:
        note += f"; {flat} with no spread over the seeds (no test, not in q)"
    note += "."
    return (f"Family **{name}** ({sc.name}): a - b [95% interval] p q\n\n"
            + markdown(["comparison", *[f"{sc.column}{t}" for t in cols]], rows) + "\n\n" + note)


def within_table(sc: Score, name: str, fam, tests: list) -> str:
    """A family of a - b within ids (``within: [lo, hi]``): one test a pair, the ids the blocks."""
    lo, hi = fam.within
    rows = [[f"{a} - {b}", test_text(sig, sc.digits), str(sig.n), "-" if "buckets" not in sig.extra else
             f"{sig.extra.get('same_sign', 0)} of {sig.extra['buckets']}"] for a, b, _, sig in tests]
    sigs = [sig for *_, sig in tests if sig.p is not None]
    note = (f"each {sc.id}'s mean of a - b over {sc.column}{lo} <= L < {sc.column}{hi} (correlated within a "
            f"{sc.id}: the {sc.id} is the block), then Student's t over the {sc.id}s (block-aware; continuous p, no "
            f"floor from the unit count); same sign: the differences with the mean's sign (a description, not a "
            f"test); q: Benjamini-Hochberg over this family's {len(sigs)} tests; "
            f"{sum(sig.resolved for sig in sigs)} resolved at q < 0.05; {family_count(sigs) if sigs else '-'}.")
    return (f"Family **{name}** ({sc.name}): a - b over {sc.column}{lo}-{sc.column}{hi} [95% interval] p q\n\n"
            + markdown(["comparison", f"{sc.column}{lo} <= L < {sc.column}{hi}", f"{sc.id}s", "same sign"], rows)
            + "\n\n" + note)


def part_text(exp: Experiment, sc: Score, part: dict, what: str, facts: dict) -> str:
    out = [f"### {what}: {sc.name}, mean [95% interval]\n\n" + cells_table(exp, sc, part, facts)]
    out += [family_table(exp, sc, name, tests, part["columns"]) for name, tests in part["families"].items()]
    return "\n\n".join(out)


def tables(exp: Experiment, res: dict) -> str:
    parts = []
    for k, r in res["scores"].items():
        sc = exp.scores[k]
        if r["pooled"] is not None:
            seeds = ", ".join(map(str, r["seeds"]))
            parts.append(part_text(exp, sc, r["pooled"], f"Over seeds {seeds} (the seed the unit)", res["facts"]))
        for s, x in r["seeds"].items():
            parts.append(part_text(exp, sc, x, f"Seed {s}", res["facts"]))
    return "\n\n".join(parts) if parts else "(no runs yet)"


def page(exp: Experiment, res: dict, command: str, wall: dict, old: str | None) -> str:
    """The page's text; ``old``: the page as it was (its reading section is kept)."""
    head = [f"# {exp.title}", exp.about] if exp.about else [f"# {exp.title}"]
    head.append(f"Made by `{command}` on {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; machine: "
                f"{machine()}; wall time {wall['this']:.0f} s this call ({wall['runs']:.0f} s in the runs' "
                f"run.json){' (quick miniature)' if exp.quick else ''}.")
    kept = old.split(READING, 1) if old else []
    return ("\n\n".join(head) + "\n\n" + tables(exp, res) + "\n\n" + READING
            + (kept[1] if len(kept) == 2 else "\n"))


def read_old(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None

#!/usr/bin/env python
"""The demo over seeds: reads the demo tables that ``scripts/demo.py --seed K`` wrote under one ``--out``
(``report/demo.json`` for seed 0, ``report_sK/demo.json`` for seed K) and prints

1. every row of the demo table, each column as the mean of the seeds' cells [95 % two-level bootstrap interval:
   seeds resampled, then each drawn seed's eval samples] (min-max of the seeds' cells), the MSE(P-IE vs P-IB) as
   mean (min-max), and in how many seeds a fine-tune's answer loss stayed above 1 nat (the demo table's mark);
2. the differences the readings compare (the demo's table C) over seeds: the mean of the seeds' differences, its t
   interval and p over the seeds (df = seeds - 1), and the seeds' own differences;
3. IE - IB over seeds: how many of the F.2 cells keep one sign in every seed against the count coin-flip signs
   give (binomial p), which ones, and how many cells a seed resolves (sign-flip p < 0.05) against the 5 % chance
   gives; the MSE rows' permutation p per seed.

``ropescale/common/stats/tests.py`` holds every test. A seed moves the training pairs, the fine-tunes' seeds, the eval
passages (other windows of the held-out chapters) and their marked sentences, so the spread is over all of these::

    bash scripts/demo.sh --seed 1; bash scripts/demo.sh --seed 2     # after make demo (seed 0)
    .venv/bin/python scripts/demo_spread.py                          # runs/demo: seeds 0, 1, 2
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def seed_tables(out: Path) -> dict[int, dict]:
    """{seed: demo.json} for every seed's demo table under ``out``."""
    found = {}
    for p in sorted(out.glob("report*/demo.json")):
        m = re.fullmatch(r"report(?:_s(\d+))?", p.parent.name)
        if m:
            found[int(m.group(1) or 0)] = json.loads(p.read_text(encoding="utf-8"))
    return found


def _groups(rec: dict, col: str) -> list[dict]:
    """A record's per-sample scores of one column, one mapping per prompt (IE, IB; the floor row: its one score a
    sample), as the demo wrote them."""
    by = (rec.get("samples") or {}).get(col) or {}
    return [by[k] for k in ("IE", "IB", "floor") if by.get(k)]


def _per_seed(tables: dict[int, dict], key: str) -> dict[int, dict]:
    return {s: r for s, t in tables.items() for r in t["rows"] if r.get("key", "floor") == key}


def spread(tables: dict[int, dict]) -> tuple[list[str], list[list]]:
    """(header, rows): each demo-table row (in the first seed's order) x each column as ``mean [lo, hi]
    (min-max)`` over the seeds that have that cell ([lo, hi]: the t interval over the seeds, where every seed kept
    its samples; the seed is the unit), and the MSE as ``mean (min-max)``."""
    from ropescale.common.stats.means import over_seeds

    first = tables[min(tables)]
    cols = list(first["columns"])
    header = ["row", "seeds", *cols, "MSE (P-IE vs P-IB)"]
    out = []
    for row in first["rows"]:
        per_seed = _per_seed(tables, row.get("key", "floor"))
        cells = []
        for c in cols:
            groups = {s: _groups(r, c) for s, r in per_seed.items()}
            pooled = None
            if len(groups) > 1 and all(groups.values()) and len({len(g) for g in groups.values()}) == 1:
                pooled = over_seeds(groups)
            cells.append(summary([r["cells"].get(c) for r in per_seed.values()], pooled))
        cells.append(summary([r.get("mse_ie_ib") for r in per_seed.values()]))
        above = sum(bool(r.get("loss_above", r.get("under_trained"))) for r in per_seed.values())
        label = row["row"] + (f" (answer loss > 1 nat in {above} of {len(per_seed)} seeds)" if above else "")
        out.append([label, str(len(per_seed)), *cells])
    return header, out


def summary(values: list, pooled=None) -> str | None:
    """``mean (min-max)`` of the seeds' values, with the pooled interval ``[lo, hi]`` after the mean when given."""
    vals = [float(v) for v in values if isinstance(v, (int, float))]
    if not vals:
        return None
    mean = sum(vals) / len(vals)
    ci = "" if pooled is None or pooled.lo is None else f" [{pooled.lo:.1f}, {pooled.hi:.1f}]"
    return f"{mean:.1f}" if len(vals) == 1 else f"{mean:.1f}{ci} ({min(vals):.1f}–{max(vals):.1f})"


def comparisons_over_seeds(tables: dict[int, dict]) -> tuple[list[str], list[list], list[dict]]:
    """(header, rows, records): each comparison of the demo's table C and column: the seeds' differences, their
    mean with the t interval, p over the seeds and its Benjamini-Hochberg q over the table (one family)."""
    from ropescale.common.stats.multiplicity import family
    from ropescale.common.stats.tests import p_text, t_over_seeds

    first = tables[min(tables)]
    cols = list(first["columns"])
    labels = [c["label"] for c in first.get("comparisons", [])]
    rows, records, seen = [], [], {}
    for label in labels:
        per = [next((c for c in t.get("comparisons", []) if c["label"] == label), None) for t in tables.values()]
        for col in cols:
            diffs = [c["cells"][col]["mean"] for c in per if c and col in c["cells"]]
            if diffs:
                seen[(label, col)] = (diffs, t_over_seeds(diffs))
    fam = family({k: t for k, (_, t) in seen.items()})
    for label in labels:
        cells = []
        for col in cols:
            if (label, col) not in seen:
                cells.append("-")
                continue
            diffs, t = seen[(label, col)][0], fam[(label, col)]
            records.append({"label": label, "column": col, "seeds": diffs, **t.to_dict()})
            if t.p is None:
                cells.append(f"{diffs[0]:+.1f}")
                continue
            cells.append(f"{t.statistic:+.1f} [{t.lo:+.1f}, {t.hi:+.1f}] p={p_text(t.p)} q={p_text(t.q)} ("
                         + " / ".join(f"{x:+.1f}" for x in diffs) + ")")
        rows.append([label, *cells])
    return ["difference", *cols], rows, records


def ie_ib_over_seeds(tables: dict[int, dict]) -> dict:
    """The F.2 rows' IE - IB cells over seeds: sign consistency (binomial), the cells a seed resolves against
    chance, and the MSE rows' permutation p per seed."""
    from ropescale.common.stats.distributions import ALPHA
    from ropescale.common.stats.multiplicity import family
    from ropescale.common.stats.tests import sign_consistency, t_over_seeds

    first = tables[min(tables)]
    cols = list(first["columns"])
    keys = [r["key"] for r in first["rows"] if "key" in r and r.get("prompts", "F.2") == "F.2"]
    per_seed = []
    resolved = tested = 0
    for t in tables.values():
        cells = {}
        for r in t["rows"]:
            if r.get("key") in keys:
                for c in cols:
                    x = (r.get("ie_minus_ib") or {}).get(c)
                    if x and x.get("mean") is not None:
                        cells[(r["key"], c)] = x["mean"]
                        if x.get("p") is not None:
                            tested += 1
                            resolved += x["p"] < ALPHA
        per_seed.append(cells)
    sc = sign_consistency(per_seed)
    mse = {r["key"]: {s: _per_seed(tables, r["key"])[s].get("mse_p") for s in tables} for r in first["rows"]
           if "key" in r}
    over = {}  # every IE - IB cell (F.1 rows too): the t test over the seeds' differences
    for r in first["rows"]:
        for c in cols:
            vals = [(x.get("ie_minus_ib") or {}).get(c) for x in _per_seed(tables, r.get("key", "floor")).values()]
            vals = [v["mean"] for v in vals if v and v.get("mean") is not None]
            if len(vals) > 1:
                over[(r["key"], c)] = t_over_seeds(vals)
    over = family(over)  # one declared family: every IE - IB cell's t over seeds
    t_resolved = {f"{k} {c}": {"mean": t.statistic, "p": t.p, "q": t.q} for (k, c), t in over.items() if t.resolved}
    smallest = min(over.values(), key=lambda t: t.q if t.q is not None else 2.0, default=None)
    return {"seeds": sorted(tables), "consistent": sc.to_dict(), "resolved": resolved, "tested": tested,
            "expected_by_chance": ALPHA * tested, "mse_p": mse, "t_tested": len(over), "t_resolved": t_resolved,
            "t_below_p": {f"{k} {c}": {"mean": t.statistic, "p": t.p, "q": t.q} for (k, c), t in over.items()
                          if t.p is not None and t.p < ALPHA},
            "t_smallest_q": None if smallest is None else smallest.q}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo", help="the demo's --out (default runs/demo)")
    ap.add_argument("--json", action="store_true", help="print the tables as JSON")
    args = ap.parse_args(argv)
    from ropescale.common.stats.tests import p_text
    from ropescale.common.tables import markdown, number

    tables = seed_tables(Path(args.out))
    if not tables:
        print(f"error: {args.out}: no demo table (report*/demo.json): run scripts/demo.sh first", file=sys.stderr)
        return 2
    header, rows = spread(tables)
    c_header, c_rows, c_records = comparisons_over_seeds(tables)
    ieib = ie_ib_over_seeds(tables)
    if args.json:
        print(json.dumps({"seeds": sorted(tables), "header": header, "rows": rows, "comparisons": c_records,
                          "ie_minus_ib": ieib}, ensure_ascii=False, indent=1, default=str))
        return 0
    seeds = ", ".join(map(str, sorted(tables)))
    print(f"### The demo table over seeds {seeds}: mean [95% t interval over the seeds] (min–max of the seeds' "
          f"cells)")
    print(markdown(header, rows, number()))
    if c_rows:
        print()
        print(f"### Differences over seeds {seeds}: mean [95% t interval over the seeds] p (t test, df = seeds - 1) "
              f"q (Benjamini-Hochberg over the table) (each seed's difference)")
        print(markdown(c_header, c_rows, number()))
    sc = ieib["consistent"]
    if sc["p"] is not None:
        print()
        print(f"IE - IB, F.2 rows: {sc['statistic']:.0f} of {sc['n']} cells keep one sign in all {sc['seeds']} seeds "
              f"(coin-flip signs: {sc['expected']:.1f}; binomial p = {p_text(sc['p'])}): "
              + ", ".join(f"{k} {c}" for k, c in sc["cells"]) + f". Cells a seed resolves (sign-flip p < 0.05): "
              f"{ieib['resolved']} of {ieib['tested']} (chance: {ieib['expected_by_chance']:.1f}).")
        tr, below = ieib["t_resolved"], ieib["t_below_p"]
        print(f"IE - IB over seeds (t test over the seeds' differences, every row; one family, BH q): {len(tr)} of "
              f"{ieib['t_tested']} cells resolved at q < 0.05 (smallest q = {p_text(ieib['t_smallest_q'])}); "
              f"{len(below)} at p < 0.05 (chance: {0.05 * ieib['t_tested']:.1f})" + (": " + ", ".join(
                  f"{k} {v['mean']:+.1f} (p = {p_text(v['p'])}, q = {p_text(v['q'])})" for k, v in below.items())
                  if below else "") + ".")
        print("MSE permutation p per seed: " + "; ".join(
            f"{k} " + " / ".join(p_text(p) for p in ps.values()) for k, ps in ieib["mse_p"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
